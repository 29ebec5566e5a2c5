/*
 * ops.h - the op interface used by models and the engine.
 *
 * A model never calls BLAS, CUDA or NCCL: it calls these wrappers, which
 * dispatch to the rank's backend table (cpu: C + CBLAS; cuda: kernels +
 * cuBLAS; meta: nothing, every slot NULL and every wrapper a no-op).
 *
 * Dtypes, for every op:
 *   - parameters, forward inputs and outputs (saved activations): ctx->dt
 *     (fp32, or bf16 = round-to-nearest-even storage; math is fp32);
 *   - every gradient buffer (d*): fp32;
 *   - LayerNorm statistics and losses: fp32; tokens and targets: int32.
 * Backward ops ACCUMULATE (+=) into every gradient they write: parameter
 * gradients, and input gradients (dinp), so residual branches sum for free.
 * Callers zero gradient buffers when a new accumulation starts.
 *
 * Shapes follow llm.c: B batch, T time, C channels, NH heads, OC output
 * channels, N = B*T rows, V vocabulary, Vp padded vocabulary. Weights of a
 * linear layer are (OC, C) row-major, out = inp @ w^T + bias.
 *
 * Calls are asynchronous on ctx->stream: queued on cuda and in the cpu
 * backend's async mode, run at once in its inline mode.
 */
#ifndef FSDP_OPS_OPS_H
#define FSDP_OPS_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "device/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Norm partial sums use blocks of this many elements; shard boundaries are
 * multiples of it (docs/determinism.md, "The gradient norm"). */
#define FSDP_NORM_BLOCK 1024

typedef struct fsdp_op_ctx fsdp_op_ctx;

struct fsdp_ops_i {
    const char *name;
    void (*fini)(fsdp_op_ctx *ctx);
    /* Optional (NULL: ops cannot fail, as on cpu). The op slots return
     * void, so a backend whose launches can fail (cuda) records the first
     * failure; this returns it (message set on the calling thread) and
     * clears it, or OK. It does not synchronise ctx->stream: a fault inside
     * a running kernel surfaces at the next stream or event sync. */
    fsdp_status (*sync_error)(fsdp_op_ctx *ctx);

    /* Token + position embedding: out (B,T,C) = wte[tokens[b,t]] + wpe[p], p = pos[b,t]
     * (each token's position in its document, model.h's state_positions) or t when pos
     * is NULL. The backward adds each row's gradient into dwte[token] and dwpe[p] (either
     * may be NULL) in (b, t) order. */
    void (*embed_fwd)(fsdp_op_ctx *ctx, void *out, const int *tokens, const int *pos,
                      const void *wte, const void *wpe, int B, int T, int C);
    void (*embed_bwd)(fsdp_op_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                      const int *tokens, const int *pos, int B, int T, int C);

    void (*layernorm_fwd)(fsdp_op_ctx *ctx, void *out, float *mean, float *rstd, const void *inp,
                          const void *w, const void *b, int N, int C);
    void (*layernorm_bwd)(fsdp_op_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                          const void *inp, const void *w, const float *mean, const float *rstd,
                          int N, int C);

    void (*matmul_fwd)(fsdp_op_ctx *ctx, void *out, const void *inp, const void *w,
                       const void *bias, int N, int C, int OC);
    /* dinp, dw, dbias may each be NULL (not needed). */
    void (*matmul_bwd)(fsdp_op_ctx *ctx, float *dinp, float *dw, float *dbias, const float *dout,
                       const void *inp, const void *w, int N, int C, int OC);

    /* The LoRA branch of a linear layer (PEFT's), beside the base product
     * matmul_fwd already wrote into out. inp (N, C), A (r, C), B (OC, r) in
     * ctx->dt:
     *   u (N, r) = inp @ A^T                            (ctx->dt, kept for backward)
     *   out[n][0 .. OC) += scale * (u @ B^T)[n]         (ctx->dt; rows ld_out >= OC apart)
     * the sum formed in fp32 and rounded once per element. out may be a column
     * slice of a fused projection's output (q of q|k|v: ld_out = the fused width),
     * and u a column slice too: its rows lie ld_u >= r apart. A NULL: u already
     * holds inp @ A^T (adapters that read the same inp, their A's one (n r, C)
     * matrix, form their u's in one call with r = n r and OC = 0, then each adds
     * its product from its slice of u); OC = 0 or B NULL: u only. */
    void (*lora_fwd)(fsdp_op_ctx *ctx, void *out, int ld_out, void *u, int ld_u, const void *inp,
                     const void *A, const void *B, float scale, int N, int C, int r, int OC);
    /* Its backward, accumulating, with dout's rows ld_dout >= OC apart and dv (N, r)
     * fp32 scratch owned by the caller, dv's and u's rows ld_u >= r apart:
     *   dv = scale * dout @ B;  dB (OC, r) += scale * dout^T @ u;
     *   dA (r, C) += dv^T @ inp;  dinp (N, C) += dv @ A
     * dinp, dA or dB may be NULL (not needed). B NULL: dv is given (each
     * adapter of a group wrote its slice with dinp and dA NULL) and only dA and
     * dinp are formed, one product each for the group (r = n r); dout, u and
     * OC are then unused. */
    void (*lora_bwd)(fsdp_op_ctx *ctx, float *dinp, float *dA, float *dB, float *dv, int ld_u,
                     const float *dout, int ld_dout, const void *inp, const void *u,
                     const void *A, const void *B, float scale, int N, int C, int r, int OC);

    void (*gelu_fwd)(fsdp_op_ctx *ctx, void *out, const void *inp, size_t n);
    void (*gelu_bwd)(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout, size_t n);

    /* Causal self-attention. qkv (B,T,3C) = [q | k | v]; att (B,NH,T,T)
     * keeps the softmax for backward; out (B,T,C). datt is fp32 scratch
     * (B,NH,T,T) owned by the caller. */
    void (*attention_fwd)(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv, int B, int T,
                          int C, int NH);
    void (*attention_bwd)(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                          const void *qkv, const void *att, int B, int T, int C, int NH);

    void (*residual_fwd)(fsdp_op_ctx *ctx, void *out, const void *a, const void *b, size_t n);

    /* Fused softmax + cross-entropy over the first V of Vp columns:
     * losses[i] = -log softmax(logits[i])[targets[i]]; if dlogits != NULL,
     * dlogits[i] = (softmax(logits[i]) - onehot(targets[i])) * dloss for
     * columns < V, 0 for padding columns. A target < 0 is masked: loss 0
     * and a zero dlogits row. No probability buffer is kept;
     * dlogits may alias logits when ctx->dt is fp32. */
    void (*xent_fwd_bwd)(fsdp_op_ctx *ctx, float *losses, float *dlogits, const void *logits,
                         const int *targets, int N, int V, int Vp, float dloss);

    /* Optimizer updates on n elements of fp32 state, in place; if p_out is
     * not NULL the new p is also written there in dtype out_dt (the compute
     * copy). The exact operation order is the cpu reference's
     * (ops/optim_kernels.h); the optimizer layer (src/optim) computes
     * the per-step constants and decides which slot a rule uses. */
    /* AdamW (decoupled weight decay):
     *   g = grad * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
     *   p -= lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd * p)
     * with bc1 = 1 - b1^t, bc2 = 1 - b2^t. */
    void (*adamw)(fsdp_op_ctx *ctx, float *p, const float *grad, float *m, float *v, size_t n,
                  float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                  float grad_scale, void *p_out, fsdp_dtype out_dt);
    /* SGD with momentum (L2 weight decay added to the gradient):
     *   g = grad * grad_scale + wd p; buf = mu buf + g; p -= lr * buf */
    void (*sgd)(fsdp_op_ctx *ctx, float *p, const float *grad, float *buf, size_t n, float lr,
                float mu, float wd, float grad_scale, void *p_out, fsdp_dtype out_dt);

    /* dst (ddt) = src (sdt), n elements, rounding to nearest even into bf16. */
    void (*cast)(fsdp_op_ctx *ctx, void *dst, fsdp_dtype ddt, const void *src, fsdp_dtype sdt,
                 size_t n);
    /* Dequantize NF4 (nf4.h): out[i] (ctx->dt) = fsdp_nf4_code[code i] * absmax[i / 64],
     * computed in fp32 and rounded once; n a multiple of FSDP_NF4_BLOCK, codes
     * n / 2 bytes (even element in the high nibble), absmax n / 64 fp32. */
    void (*nf4_dequant)(fsdp_op_ctx *ctx, void *out, const uint8_t *codes, const float *absmax,
                        size_t n);
    /* dst = a + b, fp32 (dst may alias a or b). */
    void (*add)(fsdp_op_ctx *ctx, float *dst, const float *a, const float *b, size_t n);
    /* out[k] = sum of x[i]^2 over block k (block = FSDP_NORM_BLOCK elements,
     * the last block may be short), accumulated left to right in double and
     * rounded once to fp32. out is host-visible memory on the cpu backend
     * and device memory on cuda. */
    void (*sumsq_blocks)(fsdp_op_ctx *ctx, float *out, const float *x, size_t n);

    /* ---- the Llama family: RMSNorm, rotary embeddings, SwiGLU, grouped-
     * query attention (Hugging Face LlamaForCausalLM semantics). ---- */

    /* RMSNorm over the last dimension: out = inp * rstd * w with
     * rstd = 1 / sqrt(mean(inp^2) + eps), in fp32 (the row's sum of squares
     * in double). inp, out (N, C) and w (C,) in ctx->dt; rstd (N,) fp32 is
     * saved for the backward (NULL: not saved). */
    void (*rmsnorm_fwd)(fsdp_op_ctx *ctx, void *out, float *rstd, const void *inp, const void *w,
                        float eps, int N, int C);
    /* dinp (N, C) += rstd * (dn - n * mean(dn * n)) with n = inp * rstd and
     * dn = w * dout; dw (C,) += sum over rows of n * dout. dinp or dw may be
     * NULL (not needed). */
    void (*rmsnorm_bwd)(fsdp_op_ctx *ctx, float *dinp, float *dw, const float *dout,
                        const void *inp, const void *w, const float *rstd, int N, int C);

    /* Rotary position embeddings, in place, HF's "rotate_half" convention:
     * in a head of hd channels, channel i < hd/2 pairs with i + hd/2 and
     *   x[i] = x[i] cos a - x[i+hd/2] sin a,  x[i+hd/2] = x[i+hd/2] cos a + x[i] sin a
     * with a = pos * inv_freq[i] (the product in fp32, as HF). x (ctx->dt)
     * holds B*T rows of `stride` elements; the first n_heads heads of each
     * row are rotated (for attention_gqa's fused rows: n_heads = NH + NKV,
     * stride = (NH + 2 NKV) hd rotates q and k, not v). inv_freq (hd/2,)
     * fp32 comes from fsdp_rope_inv_freq (ops/rope_table.h). pos (B*T,)
     * int32 holds each token's position (packed documents restart at 0), or
     * is NULL: position t for row t of every sequence. inv_freq and pos are
     * device memory. */
    void (*rope_fwd)(fsdp_op_ctx *ctx, void *x, const float *inv_freq, const int *pos, int B,
                     int T, int n_heads, int hd, int stride);
    /* The backward rotates the fp32 gradient dx (same layout) by -a in place:
     * the gradient of rope's output becomes the gradient of its input. It
     * replaces rather than accumulates (the input and output are one buffer). */
    void (*rope_bwd)(fsdp_op_ctx *ctx, float *dx, const float *inv_freq, const int *pos, int B,
                     int T, int n_heads, int hd, int stride);

    /* SwiGLU on a fused projection: inp (N, 2 IC) = [gate | up] per row,
     * out (N, IC) = silu(gate) * up, silu(g) = g / (1 + e^-g). */
    void (*swiglu_fwd)(fsdp_op_ctx *ctx, void *out, const void *inp, int N, int IC);
    /* dinp (N, 2 IC) += [dout * up * silu'(gate) | dout * silu(gate)]. */
    void (*swiglu_bwd)(fsdp_op_ctx *ctx, float *dinp, const void *inp, const float *dout, int N,
                       int IC);

    /* Causal grouped-query self-attention. qkv (B, T, (NH + 2 NKV) hd) holds
     * [q | k | v] per position, as one fused projection writes it: NH query
     * heads, NKV key/value heads (NH % NKV == 0; query head h reads kv head
     * h / (NH / NKV)), head size hd independent of the model width. out
     * (B, T, NH hd); att (B, NH, T, T) keeps the softmax for the backward,
     * exactly 0 outside the mask. Scores are scaled by 1/sqrt(hd). Token t
     * attends to t' in [t - pos[t], t]: with positions restarting at 0 at
     * each document start (rope's pos array), packed documents do not see
     * each other; pos NULL is plain causal (pos[t] = t), and values are
     * clamped to [0, t]. NKV == NH with hd = C / NH is attention_fwd's
     * GPT-2 layout. */
    void (*attention_gqa_fwd)(fsdp_op_ctx *ctx, void *out, void *att, const void *qkv,
                              const int *pos, int B, int T, int NH, int NKV, int hd);
    /* dqkv (B, T, (NH + 2 NKV) hd) += the gradient for q, k and v (a kv
     * head's gradient sums its query heads' in head order). datt is fp32
     * scratch (B, NH, T, T) owned by the caller. The mask comes from att. */
    void (*attention_gqa_bwd)(fsdp_op_ctx *ctx, float *dqkv, float *datt, const float *dout,
                              const void *qkv, const void *att, int B, int T, int NH, int NKV,
                              int hd);
};

/* Every op slot of struct fsdp_ops_i (all but name, fini and sync_error), in
 * its order (C++ wants designated initialisers in that order): a backend
 * fills its table with FSDP_OPS_EACH_OP(SLOT), SLOT(op) naming its function
 * for op, so the list of ops is spelled once. */
#define FSDP_OPS_EACH_OP(X) \
    X(embed_fwd)            \
    X(embed_bwd)            \
    X(layernorm_fwd)        \
    X(layernorm_bwd)        \
    X(matmul_fwd)           \
    X(matmul_bwd)           \
    X(lora_fwd)             \
    X(lora_bwd)             \
    X(gelu_fwd)             \
    X(gelu_bwd)             \
    X(attention_fwd)        \
    X(attention_bwd)        \
    X(residual_fwd)         \
    X(xent_fwd_bwd)         \
    X(adamw)                \
    X(sgd)                  \
    X(cast)                 \
    X(nf4_dequant)          \
    X(add)                  \
    X(sumsq_blocks)         \
    X(rmsnorm_fwd)          \
    X(rmsnorm_bwd)          \
    X(rope_fwd)             \
    X(rope_bwd)             \
    X(swiglu_fwd)           \
    X(swiglu_bwd)           \
    X(attention_gqa_fwd)    \
    X(attention_gqa_bwd)

struct fsdp_op_ctx {
    const struct fsdp_ops_i *iface; /* NULL on meta: every op is a no-op */
    fsdp_device *dev;
    fsdp_stream_t stream;            /* compute stream */
    fsdp_dtype dt;                   /* storage dtype of params and activations */
    void *backend;                   /* backend state (cuBLAS handle, scratch) */
};

/* Bind an op context to a device and its compute stream; dt is the
 * compute dtype. */
fsdp_status fsdp_ops_init(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt);
/* The same on another of the device's streams (its ops run in that
 * stream's order: the engine adds gradient partial sums on the comm
 * stream, after the reduce-scatters that produce them). */
fsdp_status fsdp_ops_init_stream(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt,
                                 fsdp_stream_t stream);
/* A context whose ops run at once on the calling thread, on host memory
 * (the cpu table; no stream): what host-side work of a device of any
 * backend uses (optimizer offload's casts and norm sums of host shards).
 * On meta, as every context there, it does nothing. */
fsdp_status fsdp_ops_init_host(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt);
/* A context whose ops are the cpu kernels on host memory, run as host
 * work queued on `stream` of a device of any backend (fsdp_device_launch_
 * host: in the stream's order, without a host wait): optimizer offload adds
 * the micro-steps' gradient shards in pinned host memory right after their
 * copies from the device. */
fsdp_status fsdp_ops_init_host_stream(fsdp_op_ctx *ctx, fsdp_device *dev, fsdp_dtype dt,
                                      fsdp_stream_t stream);
void fsdp_ops_fini(fsdp_op_ctx *ctx);

/* Print the cpu backend's lines of a run header to out (NULL: nothing):
 * the stream mode, threads per device for n_devices devices given
 * --threads-per-device requested_threads (0: default) and whether that was
 * capped, the GEMM kernels and any warning about them (ops/cpu/header.c). */
void fsdp_cpu_print_header(FILE *out, int n_devices, int requested_threads);

extern const struct fsdp_ops_i fsdp_ops_cpu_i;
/* The cpu table of the async stream mode: each slot queues the op on
 * ctx->stream as host work (ops/cpu/async.c); also what
 * fsdp_ops_init_host_stream binds on any device. */
extern const struct fsdp_ops_i fsdp_ops_cpu_async_i;
/* cuda's table and its per-rank init; NULL / UNSUPPORTED without CUDA. */
const struct fsdp_ops_i *fsdp_ops_cuda_iface(void);
fsdp_status fsdp_ops_cuda_init(fsdp_op_ctx *ctx);

/* Wrappers: dispatch, or do nothing on meta. Same arguments as the slots. */
#define FSDP_OP(ctx, op, ...)                     \
    do {                                          \
        if ((ctx)->iface && (ctx)->iface->op)     \
            (ctx)->iface->op((ctx), __VA_ARGS__); \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPS_OPS_H */
