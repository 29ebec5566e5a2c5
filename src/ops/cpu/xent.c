/*
 * xent.c - fused softmax + cross-entropy on the cpu, with its gradient.
 *
 * Per row i of logits (N, Vp) in ctx->dt, over the first V columns only:
 *   losses[i]  = log(sum_j exp(l_j - max)) - (l_target - max)
 *   dlogits[i] = (exp(l_j - max) / sum - [j == target]) * dloss,  j < V
 *   dlogits[i][V..Vp) = 0.
 * dlogits is written (=), not accumulated: it is the head's output gradient
 * and may alias logits when ctx->dt is fp32. Each row's max and exp-sum are
 * finished (reads only) before the row is written, element j is read before
 * it is overwritten, and no probability buffer is kept. The exp-sum is taken
 * in double, in column order. Rows go to the rank's team.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

typedef struct xent_job {
    float *losses, *dlogits;
    const void *logits;
    const int *targets;
    float *row_tmp; /* bf16: (workers, V) */
    int V, Vp;
    float dloss;
    int bf16;
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
        FSDP_ASSERT(tgt >= 0 && tgt < V);

        float maxv = row[0];
        for (int c = 1; c < V; c++)
            if (row[c] > maxv)
                maxv = row[c];
        double sum = 0.0;
        for (int c = 0; c < V; c++)
            sum += expf(row[c] - maxv);
        float lt = row[tgt] - maxv;
        if (j->losses)
            j->losses[i] = (float)(log(sum) - (double)lt);
        if (!j->dlogits)
            continue;
        float inv = (float)(1.0 / sum);
        float *d = j->dlogits + off;
        for (int c = 0; c < V; c++) {
            float p = expf(row[c] - maxv) * inv; /* read row[c] before writing d[c] */
            d[c] = (p - (c == tgt ? 1.0f : 0.0f)) * j->dloss;
        }
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
                  .V = V, .Vp = Vp, .dloss = dloss, .bf16 = ctx->dt == FSDP_DTYPE_BF16};
    /* One widened row per worker at a time when logits are bf16. */
    if (j.bf16) {
        j.row_tmp = fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_0, (size_t)fsdp_cpu_threads(ctx) * V);
        if (!j.row_tmp)
            return; /* scratch OOM, reported by sync_error */
    }
    fsdp_cpu_parallel_range(ctx, (size_t)N, FSDP_CPU_GRAIN / (size_t)V + 1, xent_rows, &j);
}
