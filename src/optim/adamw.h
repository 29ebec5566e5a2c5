/*
 * adamw.h - AdamW (decoupled weight decay) on a flat fp32 shard: the scalar
 * reference that defines the update for the whole project.
 *
 * Every other AdamW (cpu op slot, vectorised CPU offload path, CUDA kernel
 * where bit-exactness is wanted) must give the same bits as
 * fsdp_adamw_ref. Its operation order, one IEEE single-precision rounding per
 * step, no fused multiply-add (the build passes -ffp-contract=off), is:
 *
 *   once:   omb1 = 1 - b1;  omb2 = 1 - b2                   (float)
 *   per i:  g    = grad[i] * grad_scale
 *           mi   = b1 * m[i] + omb1 * g       (both products rounded, then added)
 *           vi   = b2 * v[i] + omb2 * (g * g)
 *           mhat = mi / bc1
 *           vhat = vi / bc2
 *           den  = sqrtf(vhat) + eps          (sqrtf: correctly rounded)
 *           upd  = mhat / den + wd * p[i]     (quotient and product rounded, then added)
 *           pi   = p[i] - lr * upd
 *           m[i] = mi; v[i] = vi; p[i] = pi
 *           p_out[i] = pi  (as out_dt: fp32 copy, or bf16 rounded to nearest even)
 *
 * bc1 = 1 - b1^t and bc2 = 1 - b2^t are computed by the caller for step t.
 */
#ifndef FSDP_OPTIM_ADAMW_H
#define FSDP_OPTIM_ADAMW_H

#include <stddef.h>

#include "fsdp/fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One AdamW step on n elements, in place on p, m, v (fp32, host memory).
 * grad is fp32 and is multiplied by grad_scale first (clipping and the
 * 1/(micro-batch count) factor fold into it). If p_out is not NULL, the new
 * parameters are also written there in out_dt (e.g. the bf16 compute copy).
 * grad may not alias p, m or v; p_out may alias p only when out_dt is fp32. */
void fsdp_adamw_ref(float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                    void *p_out, fsdp_dtype out_dt);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPTIM_ADAMW_H */
