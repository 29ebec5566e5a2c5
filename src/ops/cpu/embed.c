/*
 * embed.c - token + position embedding on the cpu.
 *
 * out (B, T, C) = wte[tokens[b, t]] + wpe[t]; wte (Vp, C), wpe (maxT, C) in
 * ctx->dt. The caller guarantees 0 <= token < Vp and T <= maxT (the data
 * loaders validate tokens). The backward adds into dwte and dwpe rows in
 * (b, t) order, so repeated tokens accumulate deterministically.
 */
#include "ops/cpu/cpu_ops.h"

void fsdp_cpu_embed_fwd(fsdp_op_ctx *ctx, void *out, const int *tokens, const void *wte,
                        const void *wpe, int B, int T, int C)
{
    const fsdp_dtype dt = ctx->dt;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t bt = (size_t)b * T + t;
            int tok = tokens[bt];
            FSDP_ASSERT(tok >= 0);
            size_t o = bt * C, e = (size_t)tok * C, p = (size_t)t * C;
            for (int c = 0; c < C; c++)
                fsdp_cpu_st(out, dt, o + c,
                            fsdp_cpu_ld(wte, dt, e + c) + fsdp_cpu_ld(wpe, dt, p + c));
        }
    }
}

void fsdp_cpu_embed_bwd(fsdp_op_ctx *ctx, float *dwte, float *dwpe, const float *dout,
                        const int *tokens, int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t bt = (size_t)b * T + t;
            const float *dy = dout + bt * C;
            if (dwte) {
                float *dst = dwte + (size_t)tokens[bt] * C;
                for (int c = 0; c < C; c++)
                    dst[c] += dy[c];
            }
            if (dwpe) {
                float *dst = dwpe + (size_t)t * C;
                for (int c = 0; c < C; c++)
                    dst[c] += dy[c];
            }
        }
    }
}
