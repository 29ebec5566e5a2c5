/*
 * tree_sum.h - the fixed summation order of fsdp's determinism contract:
 * a sum of n floats added in a balanced binary tree,
 *   tree(lo, hi) = tree(lo, mid) + tree(mid, hi), mid = lo + (hi - lo) / 2,
 * in fp32. The collectives add ranks' values in this order (comm/comm.h),
 * the engine adds losses and norm partial sums in it, and a model's mean
 * loss is taken in it, so a sum never depends on timing or on how the
 * values were split between ranks and processes.
 */
#ifndef FSDP_CORE_TREE_SUM_H
#define FSDP_CORE_TREE_SUM_H

#ifdef __cplusplus
extern "C" {
#endif

/* The tree sum of x[0..n); 0 for n <= 0, x[0] for n == 1. */
float fsdp_tree_sum(const float *x, int n);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_CORE_TREE_SUM_H */
