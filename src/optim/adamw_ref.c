/*
 * adamw_ref.c - the scalar reference AdamW (contract and operation order in
 * optim/adamw.h). Kept as plain single-precision statements, one rounding
 * each, so vectorised versions can reproduce it bit for bit.
 */
#include <math.h>

#include "core/bf16.h"
#include "optim/adamw.h"

void fsdp_adamw_ref(float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                    void *p_out, fsdp_dtype out_dt)
{
    const float omb1 = 1.0f - b1;
    const float omb2 = 1.0f - b2;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * grad_scale;
        float bm = b1 * m[i];
        float gm = omb1 * g;
        float mi = bm + gm;
        float g2 = g * g;
        float bv = b2 * v[i];
        float gv = omb2 * g2;
        float vi = bv + gv;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        float den = sqrtf(vhat) + eps;
        float q = mhat / den;
        float dec = wd * p[i];
        float upd = q + dec;
        float step = lr * upd;
        float pi = p[i] - step;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi;
        if (p_out) {
            if (out_dt == FSDP_DTYPE_BF16)
                ((fsdp_bf16 *)p_out)[i] = fsdp_f32_to_bf16(pi);
            else
                ((float *)p_out)[i] = pi;
        }
    }
}
