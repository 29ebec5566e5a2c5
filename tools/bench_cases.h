/*
 * bench_cases.h - the models (and batch shapes) that bench_model times
 * end to end and bench_gemm breaks into their GEMMs, named once here.
 * Header-only: each tool is one .c file linked against build/libfsdp.a.
 */
#ifndef FSDP_TOOLS_BENCH_CASES_H
#define FSDP_TOOLS_BENCH_CASES_H

#include "models/lora.h"

typedef struct bench_case {
    const char *model; /* a model spec (fsdp_model_from_spec) */
    const char *label;
    int B, T, iters;
} bench_case;

static const bench_case bench_cases[] = {
    {"small", "small (L2 H4 C128 V256)", 8, 64, 20},
    {"gpt2", "gpt2 124M (L12 H12 C768)", 4, 64, 3},
    /* Llama: 12 layers, C 768, 12 query / 4 kv heads of 64, SwiGLU 2048, a
     * Llama 2 / Mistral-sized vocabulary (32000), untied head */
    {"llama:layers=12,heads=12,kv_heads=4,hidden=768,intermediate=2048,head_dim=64,vocab=32000,"
     "context=256", "llama (L12 H12/4 C768 V32k)", 2, 256, 3},
};

#define BENCH_N_CASES ((int)(sizeof bench_cases / sizeof bench_cases[0]))

/* --lora R: the adapters bench_model and bench_gemm give the Llama, as
 * tools/bench_lora_torch.py gives its peer (PEFT's all-linear: every linear
 * layer but the head, alpha 2 R). */
static inline fsdp_lora_config bench_lora_config(int r)
{
    return (fsdp_lora_config){.r = r, .alpha = 2.0 * r, .targets = "all-linear"};
}

#endif /* FSDP_TOOLS_BENCH_CASES_H */
