/*
 * embed.c - token + position embedding on the cpu.
 *
 * out (B, T, C) = wte[tokens[b, t]] + wpe[p]; wte (Vp, C), wpe (maxT, C) in
 * ctx->dt, p = pos[b, t] (a token's position in its packed document) or t
 * when pos is NULL. The caller guarantees 0 <= token < Vp and T <= maxT
 * (the data loaders validate tokens; positions are below T). The backward
 * adds into dwte and dwpe rows in (b, t) order, so repeated tokens and
 * positions accumulate deterministically. The
 * forward goes to the rank's team by rows; the backward, where rows of
 * dwte repeat, by column ranges, each in (b, t) order.
 */
#include "ops/cpu/cpu_ops.h"

typedef struct embed_job {
    void *out;
    const int *tokens, *pos; /* pos NULL: t */
    const void *wte, *wpe;
    float *dwte, *dwpe;
    const float *dout;
    int T, C, BT;
    fsdp_dtype dt;
} embed_job;

/* Row bt's position: pos[bt], or its column. */
static size_t row_pos(const embed_job *j, size_t bt)
{
    return j->pos ? (size_t)j->pos[bt] : bt % (size_t)j->T;
}

static void embed_fwd_rows(void *arg, size_t begin, size_t end, int worker)
{
    const embed_job *j = arg;
    const int C = j->C;
    for (size_t bt = begin; bt < end; bt++) {
        int tok = j->tokens[bt];
        FSDP_ASSERT(tok >= 0);
        size_t o = bt * C, e = (size_t)tok * C, p = row_pos(j, bt) * C;
        for (int c = 0; c < C; c++)
            fsdp_cpu_st(j->out, j->dt, o + c,
                        fsdp_cpu_ld(j->wte, j->dt, e + c) + fsdp_cpu_ld(j->wpe, j->dt, p + c));
    }
}

void fsdp_cpu_embed_fwd(fsdp_op_ctx *ctx, void *out, const int *tokens, const int *pos,
                        const void *wte, const void *wpe, int B, int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    embed_job j = {.out = out, .tokens = tokens, .pos = pos, .wte = wte, .wpe = wpe, .T = T,
                   .C = C, .dt = ctx->dt};
    fsdp_cpu_parallel_range(ctx, (size_t)B * T, FSDP_CPU_GRAIN / (size_t)C + 1, embed_fwd_rows,
                            &j);
}

static void embed_bwd_cols(void *arg, size_t begin, size_t end, int worker)
{
    const embed_job *j = arg;
    const size_t C = (size_t)j->C;
    for (int bt = 0; bt < j->BT; bt++) {
        const float *dy = j->dout + (size_t)bt * C;
        if (j->dwte) {
            float *dst = j->dwte + (size_t)j->tokens[bt] * C;
            for (size_t c = begin; c < end; c++)
                dst[c] += dy[c];
        }
        if (j->dwpe) {
            float *dst = j->dwpe + row_pos(j, (size_t)bt) * C;
            for (size_t c = begin; c < end; c++)
                dst[c] += dy[c];
        }
    }
}

void fsdp_cpu_embed_bwd(fsdp_op_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                        const int *tokens, const int *pos, int B, int T, int C)
{
    if (B <= 0 || T <= 0 || C <= 0)
        return;
    embed_job j = {.tokens = tokens, .pos = pos, .dwte = dwte, .dwpe = dwpe, .dout = dout,
                   .T = T, .C = C, .BT = B * T};
    fsdp_cpu_parallel_range(ctx, (size_t)C, 64, embed_bwd_cols, &j);
}
