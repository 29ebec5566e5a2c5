/*
 * tree_sum.c - the reference tree sum (contract in tree_sum.h).
 */
#include "core/tree_sum.h"

float fsdp_tree_sum(const float *x, int n)
{
    if (n <= 0)
        return 0.0f;
    if (n == 1)
        return x[0];
    int mid = n / 2;
    float a = fsdp_tree_sum(x, mid);
    float b = fsdp_tree_sum(x + mid, n - mid);
    return a + b;
}
