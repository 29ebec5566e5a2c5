/*
 * optim_kernels.h - the element-wise optimizer kernels on host memory: for
 * each update rule a scalar reference, which defines the rule's bits for the
 * whole project, and vectorised versions (SSE4.1 / AVX2 / AVX-512F, picked
 * at run time) that reproduce it bit for bit.
 *
 * An interface of the ops layer, implemented by the cpu backend (src/ops/
 * cpu/adamw.c, sgd.c): optimizer offload runs these kernels on host memory
 * whatever the device's backend, so the optimizer layer calls them directly,
 * not through the op table. Who owns what: the ops layer owns the
 * arithmetic. The cpu op table's optimizer slots call the references; the CUDA kernels
 * (src/ops/cuda/<rule>.cu) reproduce them with explicitly rounded
 * intrinsics. The optimizer layer above (src/optim) owns everything else:
 * per-step constants (bias corrections), hyper-parameter checks, state array
 * names, and running these kernels on the CPU worker pool for optimizer
 * offload. Nothing here knows about shards, pools or engines.
 *
 * Bit identity: every rule is written as a sequence of IEEE single-precision
 * operations, one rounding each, no fused multiply-add (the build passes
 * -ffp-contract=off); a vector kernel does the same operations in the same
 * order, one correctly rounded instruction per scalar operation, and sends
 * the n % width tail through the reference. This relies on the default
 * MXCSR (no flush-to-zero or denormals-are-zero). Which of two different
 * input NaN payloads survives an operation is the one thing a compiler may
 * decide differently (it may swap a commutative operation's operands).
 *
 * Pointers are host memory (pageable or pinned), no alignment needed. grad
 * may not alias the arrays that are written; p_out (optional) receives the
 * new parameters again, as fp32 or bf16 rounded to nearest even, and may
 * alias p only when out_dt is fp32.
 */
#ifndef FSDP_OPS_OPTIM_KERNELS_H
#define FSDP_OPS_OPTIM_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

#include "fsdp/fsdp.h"
#include "ops/isa.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- instruction sets (the levels: ops/isa.h) ------------------------------ */

/* "scalar", "sse4.1", "avx2", "avx512f"; "?" for a bad value. */
const char *fsdp_cpu_isa_name(fsdp_cpu_isa isa);

/* Whether this build has kernels for isa and the running CPU can run them. */
bool fsdp_cpu_isa_supported(fsdp_cpu_isa isa);

/* The widest supported ISA. */
fsdp_cpu_isa fsdp_cpu_isa_best(void);

/* ---- AdamW (decoupled weight decay) ---------------------------------------- */

/* One AdamW step on n elements, in place on p, m, v. bc1 = 1 - b1^t and
 * bc2 = 1 - b2^t are computed by the caller for step t. Operation order:
 *
 *   once:   omb1 = 1 - b1;  omb2 = 1 - b2
 *   per i:  g    = grad[i] * grad_scale
 *           mi   = b1 * m[i] + omb1 * g       (both products rounded, then added)
 *           vi   = b2 * v[i] + omb2 * (g * g)
 *           mhat = mi / bc1
 *           vhat = vi / bc2
 *           den  = sqrtf(vhat) + eps          (sqrtf: correctly rounded)
 *           upd  = mhat / den + wd * p[i]     (quotient and product rounded, then added)
 *           pi   = p[i] - lr * upd
 *           m[i] = mi; v[i] = vi; p[i] = pi; p_out[i] = pi (as out_dt) */
void fsdp_adamw_ref(float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                    void *p_out, fsdp_dtype out_dt);

/* The same with the kernel of isa (supported: asserted; FSDP_CPU_ISA_COUNT
 * = the best). */
void fsdp_adamw_cpu(fsdp_cpu_isa isa, float *p, const float *grad, float *m, float *v, size_t n,
                    float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                    float grad_scale, void *p_out, fsdp_dtype out_dt);

/* ---- SGD with momentum (PyTorch's torch.optim.SGD, dampening 0) ------------- */

/* One step on n elements, in place on p and the momentum buffer buf (zero
 * before the first step, which makes the first step buf = d as PyTorch's
 * buffer initialisation does). Weight decay is L2, added to the gradient.
 * Operation order:
 *
 *   per i:  g    = grad[i] * grad_scale
 *           d    = g + wd * p[i]              (product rounded, then added)
 *           bi   = mu * buf[i] + d
 *           pi   = p[i] - lr * bi
 *           buf[i] = bi; p[i] = pi; p_out[i] = pi (as out_dt) */
void fsdp_sgd_ref(float *p, const float *grad, float *buf, size_t n, float lr, float mu, float wd,
                  float grad_scale, void *p_out, fsdp_dtype out_dt);

/* The same with the kernel of isa (as fsdp_adamw_cpu). */
void fsdp_sgd_cpu(fsdp_cpu_isa isa, float *p, const float *grad, float *buf, size_t n, float lr,
                  float mu, float wd, float grad_scale, void *p_out, fsdp_dtype out_dt);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPS_CPU_OPTIM_KERNELS_H */
