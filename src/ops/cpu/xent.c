/*
 * xent.c - fused softmax + cross-entropy on the cpu, with its gradient.
 *
 * Per row i of logits (N, Vp) in ctx->dt, over the first V columns only:
 *   losses[i]  = log(sum_j exp(l_j - max)) - (l_target - max)
 *   dlogits[i] = (exp(l_j - max) / sum - [j == target]) * dloss,  j < V
 *   dlogits[i][V..Vp) = 0.
 * A target < 0 masks its row: loss 0 and a zero gradient row.
 * dlogits is written (=), not accumulated: it is the head's output gradient
 * and may alias logits when ctx->dt is fp32.
 *
 * A row takes three passes, each vectorised (vsoftmax.h): the max; e_j =
 * exp(l_j - max) (arguments below -87 count as e^-87, nothing next to the max's 1)
 * stored into dlogits (element j is read before it is overwritten, so
 * aliasing is fine) and summed in double over 16 fixed lanes (lane j mod
 * 16, lanes then combined in a fixed tree, the tail last); then the
 * gradient in place. The order is fixed by V alone, so the bits are the same
 * on every build and thread count. Rows go to the rank's team.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/vsoftmax.h"

/* The row kernels (vsoftmax.h's and the gradient's), compiled for the build's baseline and
 * for AVX2 and picked at run time (as gelu.c: no ifunc, which breaks the sanitizers). */
#define XENT_KERNELS(sfx, attr)                                                              \
    FSDP_SOFTMAX_KERNELS(sfx, attr)                                                          \
    /* d[j] = (d[j] * inv - [j == tgt]) * dloss, d holding the exps */                       \
    attr static void grad_##sfx(float *d, int V, int tgt, float inv, float dloss)            \
    {                                                                                        \
        for (int j = 0; j < V; j++)                                                          \
            d[j] = (d[j] * inv - (j == tgt ? 1.0f : 0.0f)) * dloss;                          \
    }
XENT_KERNELS(base, )
XENT_KERNELS(avx2, __attribute__((target("avx2"))))

typedef struct xent_job {
    float *losses, *dlogits;
    const void *logits;
    const int *targets;
    float *row_tmp; /* bf16: (workers, V) */
    int V, Vp;
    float dloss;
    int bf16;
    bool avx2;
} xent_job;

static void xent_rows(void *arg, size_t begin, size_t end, int worker)
{
    const xent_job *j = arg;
    const int V = j->V, Vp = j->Vp;
    for (size_t i = begin; i < end; i++) {
        size_t off = i * Vp;
        const float *row;
        if (j->bf16) {
            float *tmp = j->row_tmp + (size_t)worker * V;
            const fsdp_bf16 *src = (const fsdp_bf16 *)j->logits + off;
            for (int c = 0; c < V; c++)
                tmp[c] = fsdp_bf16_to_f32(src[c]);
            row = tmp;
        } else {
            row = (const float *)j->logits + off;
        }
        int tgt = j->targets[i];
        FSDP_ASSERT(tgt < V);
        float *d = j->dlogits ? j->dlogits + off : NULL;
        if (tgt < 0) { /* masked: no loss, no gradient */
            if (j->losses)
                j->losses[i] = 0.0f;
            if (d)
                for (int c = 0; c < Vp; c++)
                    d[c] = 0.0f;
            continue;
        }
        float maxv = j->avx2 ? fsdp_softmax_max_avx2(row, V) : fsdp_softmax_max_base(row, V);
        float lt = row[tgt] - maxv; /* before d (maybe row) is overwritten */
        double sum = j->avx2 ? fsdp_softmax_exp_sum_avx2(row, d, V, maxv)
                              : fsdp_softmax_exp_sum_base(row, d, V, maxv);
        if (j->losses)
            j->losses[i] = (float)(log(sum) - (double)lt);
        if (!d)
            continue;
        float inv = (float)(1.0 / sum);
        if (j->avx2)
            grad_avx2(d, V, tgt, inv, j->dloss);
        else
            grad_base(d, V, tgt, inv, j->dloss);
        for (int c = V; c < Vp; c++)
            d[c] = 0.0f;
    }
}

void fsdp_cpu_xent_fwd_bwd(fsdp_op_ctx *ctx, float *losses, float *dlogits, const void *logits,
                           const int *targets, int N, int V, int Vp, float dloss)
{
    if (N <= 0 || V <= 0)
        return;
    FSDP_ASSERT(V <= Vp);
    xent_job j = {.losses = losses, .dlogits = dlogits, .logits = logits, .targets = targets,
                  .V = V, .Vp = Vp, .dloss = dloss, .bf16 = ctx->dt == FSDP_DTYPE_BF16,
                  .avx2 = __builtin_cpu_supports("avx2")};
    /* One widened row per worker at a time when logits are bf16. */
    if (j.bf16) {
        j.row_tmp = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_0, (size_t)fsdp_cpu_threads(ctx) * V);
        if (!j.row_tmp)
            return; /* scratch OOM, reported by sync_error */
    }
    fsdp_cpu_parallel_range(ctx, (size_t)N, FSDP_CPU_GRAIN / (size_t)V + 1, xent_rows, &j);
}
