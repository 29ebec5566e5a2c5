/*
 * xent.c - fused softmax + cross-entropy on the cpu, with its gradient.
 *
 * Per row i of logits (N, Vp) in ctx->dt, over the first V columns only:
 *   losses[i]  = log(sum_j exp(l_j - max)) - (l_target - max)
 *   dlogits[i] = (exp(l_j - max) / sum - [j == target]) * dloss,  j < V
 *   dlogits[i][V..Vp) = 0.
 * A target < 0 masks its row: loss 0 and a zero gradient row.
 * dlogits is written (=), not accumulated: it is the head's output gradient
 * and may alias logits when ctx->dt is fp32. Each row's max and exp-sum are
 * finished (reads only) before the row is written, element j is read before
 * it is overwritten, and no probability buffer is kept. The exp-sum is taken
 * in double, in column order.
 */
#include <math.h>

#include "ops/cpu/cpu_ops.h"

void fsdp_cpu_xent_fwd_bwd(fsdp_op_ctx *ctx, float *losses, float *dlogits, const void *logits,
                           const int *targets, int N, int V, int Vp, float dloss)
{
    if (N <= 0 || V <= 0)
        return;
    FSDP_ASSERT(V <= Vp);
    const int bf16 = ctx->dt == FSDP_DTYPE_BF16;
    /* One widened row at a time when logits are bf16. */
    float *row_tmp = bf16 ? fsdp_cpu_scratch(ctx, FSDP_CPU_SLOT_0, (size_t)V) : NULL;
    if (bf16 && !row_tmp)
        return; /* scratch OOM, reported by sync_error */
    for (int i = 0; i < N; i++) {
        size_t off = (size_t)i * Vp;
        const float *row;
        if (bf16) {
            const fsdp_bf16 *src = (const fsdp_bf16 *)logits + off;
            for (int j = 0; j < V; j++)
                row_tmp[j] = fsdp_bf16_to_f32(src[j]);
            row = row_tmp;
        } else {
            row = (const float *)logits + off;
        }
        int tgt = targets[i];
        FSDP_ASSERT(tgt < V);
        if (tgt < 0) { /* masked: no loss, no gradient */
            if (losses)
                losses[i] = 0.0f;
            if (dlogits)
                for (int j = 0; j < Vp; j++)
                    dlogits[off + j] = 0.0f;
            continue;
        }

        float maxv = row[0];
        for (int j = 1; j < V; j++)
            if (row[j] > maxv)
                maxv = row[j];
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += expf(row[j] - maxv);
        float lt = row[tgt] - maxv;
        if (losses)
            losses[i] = (float)(log(sum) - (double)lt);
        if (!dlogits)
            continue;
        float inv = (float)(1.0 / sum);
        float *d = dlogits + off;
        for (int j = 0; j < V; j++) {
            float p = expf(row[j] - maxv) * inv; /* read row[j] before writing d[j] */
            d[j] = (p - (j == tgt ? 1.0f : 0.0f)) * dloss;
        }
        for (int j = V; j < Vp; j++)
            d[j] = 0.0f;
    }
}
