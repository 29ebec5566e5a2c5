/*
 * async.c - the cpu op table of the async stream mode (device/cpu_stream.c):
 * every slot queues the cpu op itself (table.c's) on the context's stream
 * with a copy of its arguments and returns, as a CUDA launch does. The op
 * then runs on the stream's worker thread, in stream order.
 *
 * Each op is listed once, with its parameters as (type, name) pairs; the
 * macros below turn the list into the argument struct, the queued runner
 * and the slot function. Pointers are captured, not the data they point
 * at: as on a GPU, buffers must stay valid and unchanged until the stream
 * has run the op (frees are stream-ordered; host memory the op reads must
 * be pinned memory that the host does not rewrite before a sync).
 *
 * Failures: an op that cannot be queued (out of host memory) is kept for
 * sync_error, which also queues the cpu table's own sync_error (scratch
 * failures happen where the ops run), so a failure surfaces at the next
 * stream sync like any failure of queued work.
 */
#include <stdio.h>
#include <string.h>

#include "ops/cpu/cpu_ops.h"

/* ---- the argument list macros -------------------------------------------------- */

#define A_EMPTY()
#define A_COMMA() ,
#define A_PARAM(t, n) t n
#define A_FIELD(t, n) t n;
#define A_NAME(t, n) n
#define A_USE(t, n) a->n

#define A_MAP1(m, s, x) m x
#define A_MAP2(m, s, x, ...) m x s() A_MAP1(m, s, __VA_ARGS__)
#define A_MAP3(m, s, x, ...) m x s() A_MAP2(m, s, __VA_ARGS__)
#define A_MAP4(m, s, x, ...) m x s() A_MAP3(m, s, __VA_ARGS__)
#define A_MAP5(m, s, x, ...) m x s() A_MAP4(m, s, __VA_ARGS__)
#define A_MAP6(m, s, x, ...) m x s() A_MAP5(m, s, __VA_ARGS__)
#define A_MAP7(m, s, x, ...) m x s() A_MAP6(m, s, __VA_ARGS__)
#define A_MAP8(m, s, x, ...) m x s() A_MAP7(m, s, __VA_ARGS__)
#define A_MAP9(m, s, x, ...) m x s() A_MAP8(m, s, __VA_ARGS__)
#define A_MAP10(m, s, x, ...) m x s() A_MAP9(m, s, __VA_ARGS__)
#define A_MAP11(m, s, x, ...) m x s() A_MAP10(m, s, __VA_ARGS__)
#define A_MAP12(m, s, x, ...) m x s() A_MAP11(m, s, __VA_ARGS__)
#define A_MAP13(m, s, x, ...) m x s() A_MAP12(m, s, __VA_ARGS__)
#define A_MAP14(m, s, x, ...) m x s() A_MAP13(m, s, __VA_ARGS__)
#define A_MAP15(m, s, x, ...) m x s() A_MAP14(m, s, __VA_ARGS__)
#define A_MAP16(m, s, x, ...) m x s() A_MAP15(m, s, __VA_ARGS__)
#define A_COUNT(...) \
    A_COUNT_(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define A_COUNT_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, n, ...) n
#define A_CAT(a, b) A_CAT_(a, b)
#define A_CAT_(a, b) a##b
#define A_MAP(m, s, ...) A_CAT(A_MAP, A_COUNT(__VA_ARGS__))(m, s, __VA_ARGS__)

/* The first failure to queue an op, for sync_error. Only the thread that
 * issues ops on the context (the rank thread) touches it. */
typedef struct queue_failure {
    fsdp_status st;
    char msg[256];
} queue_failure;
static _Thread_local queue_failure tls_failure;

static void queue(fsdp_op_ctx *ctx, fsdp_host_fn fn, void *arg, size_t bytes, const char *name)
{
    fsdp_status st = fsdp_device_launch_host(ctx->dev, ctx->stream, fn, arg, bytes, name);
    if (st != FSDP_STATUS_OK && tls_failure.st == FSDP_STATUS_OK) {
        tls_failure.st = st;
        snprintf(tls_failure.msg, sizeof tls_failure.msg, "%s", fsdp_error_msg());
    }
}

/* ASYNC_OP(name, (type, param)...): struct name_args, run_name (on the
 * stream) and async_name (the slot). */
#define ASYNC_OP(name, ...)                                                          \
    struct name##_args {                                                             \
        fsdp_op_ctx *ctx;                                                            \
        A_MAP(A_FIELD, A_EMPTY, __VA_ARGS__)                                         \
    };                                                                               \
    static fsdp_status run_##name(void *p)                                           \
    {                                                                                \
        struct name##_args *a = p;                                                   \
        fsdp_ops_cpu_i.name(a->ctx, A_MAP(A_USE, A_COMMA, __VA_ARGS__));             \
        return FSDP_STATUS_OK;                                                       \
    }                                                                                \
    static void async_##name(fsdp_op_ctx *ctx, A_MAP(A_PARAM, A_COMMA, __VA_ARGS__)) \
    {                                                                                \
        struct name##_args a = {ctx, A_MAP(A_NAME, A_COMMA, __VA_ARGS__)};           \
        queue(ctx, run_##name, &a, sizeof a, #name);                                 \
    }

/* ---- the ops (parameters as in ops/ops.h) -------------------------------------------- */

ASYNC_OP(embed_fwd, (void *, out), (const int *, tokens), (const int *, pos), (const void *, wte),
         (const void *, wpe), (int, B), (int, T), (int, C))
ASYNC_OP(embed_bwd, (float *, dwte), (float *, dwpe), (const float *, dout), (const int *, tokens),
         (const int *, pos), (int, B), (int, T), (int, C))
ASYNC_OP(layernorm_fwd, (void *, out), (float *, mean), (float *, rstd), (const void *, inp),
         (const void *, w), (const void *, b), (int, N), (int, C))
ASYNC_OP(layernorm_bwd, (float *, dinp), (float *, dw), (float *, db), (const float *, dout),
         (const void *, inp), (const void *, w), (const float *, mean), (const float *, rstd),
         (int, N), (int, C))
ASYNC_OP(matmul_fwd, (void *, out), (const void *, inp), (const void *, w), (const void *, bias),
         (int, N), (int, C), (int, OC))
ASYNC_OP(matmul_bwd, (float *, dinp), (float *, dw), (float *, dbias), (const float *, dout),
         (const void *, inp), (const void *, w), (int, N), (int, C), (int, OC))
ASYNC_OP(lora_fwd, (void *, out), (int, ld_out), (void *, u), (int, ld_u), (const void *, inp),
         (const void *, A), (const void *, B), (float, scale), (int, N), (int, C), (int, r),
         (int, OC))
ASYNC_OP(lora_bwd, (float *, dinp), (float *, dA), (float *, dB), (float *, dv), (int, ld_u),
         (const float *, dout), (int, ld_dout), (const void *, inp), (const void *, u),
         (const void *, A), (const void *, B), (float, scale), (int, N), (int, C), (int, r),
         (int, OC))
ASYNC_OP(gelu_fwd, (void *, out), (const void *, inp), (size_t, n))
ASYNC_OP(gelu_bwd, (float *, dinp), (const void *, inp), (const float *, dout), (size_t, n))
ASYNC_OP(attention_fwd, (void *, out), (void *, att), (const void *, qkv), (int, B), (int, T),
         (int, C), (int, NH))
ASYNC_OP(attention_bwd, (float *, dqkv), (float *, datt), (const float *, dout),
         (const void *, qkv), (const void *, att), (int, B), (int, T), (int, C), (int, NH))
ASYNC_OP(residual_fwd, (void *, out), (const void *, x), (const void *, y), (size_t, n))
ASYNC_OP(xent_fwd_bwd, (float *, losses), (float *, dlogits), (const void *, logits),
         (const int *, targets), (int, N), (int, V), (int, Vp), (float, dloss))
ASYNC_OP(adamw, (float *, p), (const float *, grad), (float *, m), (float *, v), (size_t, n),
         (float, lr), (float, b1), (float, b2), (float, eps), (float, wd), (float, bc1),
         (float, bc2), (float, grad_scale), (void *, p_out), (fsdp_dtype, out_dt))
ASYNC_OP(sgd, (float *, p), (const float *, grad), (float *, buf), (size_t, n), (float, lr),
         (float, mu), (float, wd), (float, grad_scale), (void *, p_out), (fsdp_dtype, out_dt))
ASYNC_OP(cast, (void *, dst), (fsdp_dtype, ddt), (const void *, src), (fsdp_dtype, sdt),
         (size_t, n))
ASYNC_OP(nf4_dequant, (void *, out), (const uint8_t *, codes), (const float *, absmax),
         (size_t, n))
ASYNC_OP(add, (float *, dst), (const float *, x), (const float *, y), (size_t, n))
ASYNC_OP(sumsq_blocks, (float *, out), (const float *, x), (size_t, n))
ASYNC_OP(rmsnorm_fwd, (void *, out), (float *, rstd), (const void *, inp), (const void *, w),
         (float, eps), (int, N), (int, C))
ASYNC_OP(rmsnorm_bwd, (float *, dinp), (float *, dw), (const float *, dout), (const void *, inp),
         (const void *, w), (const float *, rstd), (int, N), (int, C))
ASYNC_OP(rope_fwd, (void *, x), (const float *, inv_freq), (const int *, pos), (int, B), (int, T),
         (int, n_heads), (int, hd), (int, stride))
ASYNC_OP(rope_bwd, (float *, dx), (const float *, inv_freq), (const int *, pos), (int, B),
         (int, T), (int, n_heads), (int, hd), (int, stride))
ASYNC_OP(swiglu_fwd, (void *, out), (const void *, inp), (int, N), (int, IC))
ASYNC_OP(swiglu_bwd, (float *, dinp), (const void *, inp), (const float *, dout), (int, N),
         (int, IC))
ASYNC_OP(attention_gqa_fwd, (void *, out), (void *, att), (const void *, qkv), (const int *, pos),
         (int, B), (int, T), (int, NH), (int, NKV), (int, hd))
ASYNC_OP(attention_gqa_bwd, (float *, dqkv), (float *, datt), (const float *, dout),
         (const void *, qkv), (const void *, att), (int, B), (int, T), (int, NH), (int, NKV),
         (int, hd))

/* The cpu table's sync_error, run where the ops run. */
static fsdp_status run_sync_error(void *p)
{
    fsdp_op_ctx *ctx = *(fsdp_op_ctx **)p;
    return fsdp_ops_cpu_i.sync_error(ctx);
}

static fsdp_status async_sync_error(fsdp_op_ctx *ctx)
{
    if (tls_failure.st != FSDP_STATUS_OK) {
        fsdp_status st = tls_failure.st;
        tls_failure.st = FSDP_STATUS_OK;
        return fsdp_error_set(st, "%s", tls_failure.msg);
    }
    return fsdp_device_launch_host(ctx->dev, ctx->stream, run_sync_error, &ctx, sizeof ctx,
                                   "op failure check");
}

/* Queued ops use the context's scratch: let them finish first (a failure
 * of theirs was or will be reported by a sync of the caller's). */
static void async_fini(fsdp_op_ctx *ctx)
{
    if (fsdp_device_stream_sync(ctx->dev, ctx->stream) != FSDP_STATUS_OK)
        fsdp_error_clear();
    fsdp_ops_cpu_i.fini(ctx);
}

#define ASYNC_SLOT(op) .op = async_##op,

const struct fsdp_ops_i fsdp_ops_cpu_async_i = {
    .name = "cpu",
    .fini = async_fini,
    .sync_error = async_sync_error,
    FSDP_OPS_EACH_OP(ASYNC_SLOT)
};
