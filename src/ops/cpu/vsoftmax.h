/*
 * vsoftmax.h - the row kernels of a softmax over fp32 rows, vectorised and
 * with a fixed summation order: the cross-entropy's rows (xent.c) and the
 * attention's score rows, forward and backward (attention_gqa.c).
 *
 * A sum runs over FSDP_SOFTMAX_LANES fixed lanes in double (element j of
 * the row in lane j mod 16), the lanes then combined in a fixed tree and
 * the tail added last: the order depends on the row's length alone, so the
 * bits are the same on every build, instruction set and thread count. The
 * maximum is order-free. e^x is vexp.h's polynomial (the build forbids
 * contraction, so scalar and vector code agree); arguments below -87 count
 * as e^-87, which next to the maximum's 1 changes nothing.
 *
 * FSDP_SOFTMAX_KERNELS(sfx, attr) defines the kernels with suffix sfx under
 * the function attribute attr (a target("avx2"), or nothing for the
 * build's baseline); a file instantiates the variants it dispatches among
 * at run time (no ifunc: resolvers run before the sanitizers' runtimes).
 */
#ifndef FSDP_OPS_CPU_VSOFTMAX_H
#define FSDP_OPS_CPU_VSOFTMAX_H

#include "ops/cpu/vexp.h"

#define FSDP_SOFTMAX_LANES 16
#define FSDP_SOFTMAX_EXP_MIN -87.0f

/* e^a for a = x - max <= 0: below -87 as e^-87; NaN stays NaN (the clamp's
 * compare sends it to -87 first, so fsdp_cpu_exp never converts NaN to an
 * integer, which is undefined behaviour). */
static inline float fsdp_softmax_exp(float a)
{
    float v = fsdp_cpu_exp(a > FSDP_SOFTMAX_EXP_MIN ? a : FSDP_SOFTMAX_EXP_MIN);
    return a == a ? v : a;
}

#define FSDP_SOFTMAX_KERNELS(sfx, attr)                                                     \
    /* max of x[0 .. n), n >= 1 */                                                          \
    attr static inline float fsdp_softmax_max_##sfx(const float *x, int n)                  \
    {                                                                                       \
        float m[FSDP_SOFTMAX_LANES];                                                        \
        for (int l = 0; l < FSDP_SOFTMAX_LANES; l++)                                        \
            m[l] = x[0];                                                                    \
        int j = 0;                                                                          \
        for (; j + FSDP_SOFTMAX_LANES <= n; j += FSDP_SOFTMAX_LANES)                        \
            for (int l = 0; l < FSDP_SOFTMAX_LANES; l++)                                    \
                m[l] = x[j + l] > m[l] ? x[j + l] : m[l];                                   \
        float r = m[0];                                                                     \
        for (int l = 1; l < FSDP_SOFTMAX_LANES; l++)                                        \
            r = m[l] > r ? m[l] : r;                                                        \
        for (; j < n; j++)                                                                  \
            r = x[j] > r ? x[j] : r;                                                        \
        return r;                                                                           \
    }                                                                                       \
    /* e[j] = exp(x[j] - maxv) for j < n (e may be x, or NULL: not stored); returns their   \
     * sum */                                                                               \
    attr static inline double fsdp_softmax_exp_sum_##sfx(const float *x, float *e, int n,   \
                                                         float maxv)                        \
    {                                                                                       \
        double s[FSDP_SOFTMAX_LANES] = {0};                                                 \
        float buf[FSDP_SOFTMAX_LANES];                                                      \
        int j = 0;                                                                          \
        for (; j + FSDP_SOFTMAX_LANES <= n; j += FSDP_SOFTMAX_LANES) {                      \
            for (int l = 0; l < FSDP_SOFTMAX_LANES; l++)                                    \
                buf[l] = fsdp_softmax_exp(x[j + l] - maxv);                                 \
            for (int l = 0; l < FSDP_SOFTMAX_LANES; l++)                                    \
                s[l] += (double)buf[l];                                                     \
            if (e)                                                                          \
                for (int l = 0; l < FSDP_SOFTMAX_LANES; l++)                                \
                    e[j + l] = buf[l];                                                      \
        }                                                                                   \
        for (int w = FSDP_SOFTMAX_LANES / 2; w > 0; w /= 2)                                 \
            for (int l = 0; l < w; l++)                                                     \
                s[l] += s[l + w];                                                           \
        double sum = s[0];                                                                  \
        for (; j < n; j++) {                                                                \
            float v = fsdp_softmax_exp(x[j] - maxv);                                        \
            sum += (double)v;                                                               \
            if (e)                                                                          \
                e[j] = v;                                                                   \
        }                                                                                   \
        return sum;                                                                         \
    }                                                                                       \
    /* sum over j < n of a[j] * b[j] (each product in fp32, summed in double) */            \
    attr static inline double fsdp_softmax_dot_##sfx(const float *a, const float *b, int n) \
    {                                                                                       \
        double s[FSDP_SOFTMAX_LANES] = {0};                                                 \
        int j = 0;                                                                          \
        for (; j + FSDP_SOFTMAX_LANES <= n; j += FSDP_SOFTMAX_LANES)                        \
            for (int l = 0; l < FSDP_SOFTMAX_LANES; l++)                                    \
                s[l] += (double)(a[j + l] * b[j + l]);                                      \
        for (int w = FSDP_SOFTMAX_LANES / 2; w > 0; w /= 2)                                 \
            for (int l = 0; l < w; l++)                                                     \
                s[l] += s[l + w];                                                           \
        double sum = s[0];                                                                  \
        for (; j < n; j++)                                                                  \
            sum += (double)(a[j] * b[j]);                                                   \
        return sum;                                                                         \
    }

#endif /* FSDP_OPS_CPU_VSOFTMAX_H */
