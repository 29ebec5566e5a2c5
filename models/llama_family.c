/*
 * llama_family.c - the Llama family's registry entry: named shapes, the
 * builder (a config key list, llama_config.c, made into llama.c's layout)
 * and the FLOPs per token for MFU.
 */
#include <string.h>

#include "models/llama.h"

/* Released shapes from their config.json (Qwen2.5: the Instruct releases'
 * 32768-token context), and small ones for tests and demos: llama-tiny
 * (GQA, head_dim * heads != hidden, untied head), qwen2-tiny (q/k/v
 * biases, tied, a single kv head) and llama-small (the synthetic-task
 * demo). Each config is canonical (tests check it): every key, the rope
 * scaling keys a type does not read at their neutral values. */
#define ROPE_PLAIN "rope=default,rope_factor=1,rope_low_freq=1,rope_high_freq=4,rope_orig_context=8192"
#define ROPE_LLAMA3(factor)                                                                  \
    "rope=llama3,rope_factor=" #factor ",rope_low_freq=1,rope_high_freq=4,rope_orig_context=8192"
static const fsdp_model_shape llama_shapes[] = {
    {"llama-tiny", "layers=2,heads=4,kv_heads=2,hidden=32,intermediate=64,head_dim=16,vocab=256,"
                   "context=64,rope_theta=10000," ROPE_PLAIN ",qkv_bias=0,tied=0,norm_eps=1e-05"},
    {"qwen2-tiny", "layers=2,heads=4,kv_heads=1,hidden=32,intermediate=80,head_dim=8,vocab=256,"
                   "context=64,rope_theta=1000000," ROPE_PLAIN ",qkv_bias=1,tied=1,"
                   "norm_eps=1e-06"},
    {"llama-small", "layers=2,heads=4,kv_heads=2,hidden=128,intermediate=352,head_dim=32,"
                    "vocab=256,context=64,rope_theta=10000," ROPE_PLAIN ",qkv_bias=0,tied=0,"
                    "norm_eps=1e-05"},
    {"llama3.2-1b", "layers=16,heads=32,kv_heads=8,hidden=2048,intermediate=8192,head_dim=64,"
                    "vocab=128256,context=131072,rope_theta=500000," ROPE_LLAMA3(32)
                    ",qkv_bias=0,tied=1,norm_eps=1e-05"},
    {"llama3.2-3b", "layers=28,heads=24,kv_heads=8,hidden=3072,intermediate=8192,head_dim=128,"
                    "vocab=128256,context=131072,rope_theta=500000," ROPE_LLAMA3(32)
                    ",qkv_bias=0,tied=1,norm_eps=1e-05"},
    {"llama3.1-8b", "layers=32,heads=32,kv_heads=8,hidden=4096,intermediate=14336,head_dim=128,"
                    "vocab=128256,context=131072,rope_theta=500000," ROPE_LLAMA3(8)
                    ",qkv_bias=0,tied=0,norm_eps=1e-05"},
    {"llama3.1-70b", "layers=80,heads=64,kv_heads=8,hidden=8192,intermediate=28672,head_dim=128,"
                     "vocab=128256,context=131072,rope_theta=500000," ROPE_LLAMA3(8)
                     ",qkv_bias=0,tied=0,norm_eps=1e-05"},
    {"qwen2.5-0.5b", "layers=24,heads=14,kv_heads=2,hidden=896,intermediate=4864,head_dim=64,"
                     "vocab=151936,context=32768,rope_theta=1000000," ROPE_PLAIN
                     ",qkv_bias=1,tied=1,norm_eps=1e-06"},
    {"qwen2.5-1.5b", "layers=28,heads=12,kv_heads=2,hidden=1536,intermediate=8960,head_dim=128,"
                     "vocab=151936,context=32768,rope_theta=1000000," ROPE_PLAIN
                     ",qkv_bias=1,tied=1,norm_eps=1e-06"},
    {"qwen2.5-3b", "layers=36,heads=16,kv_heads=2,hidden=2048,intermediate=11008,head_dim=128,"
                   "vocab=151936,context=32768,rope_theta=1000000," ROPE_PLAIN
                   ",qkv_bias=1,tied=1,norm_eps=1e-06"},
    {"qwen2.5-7b", "layers=28,heads=28,kv_heads=4,hidden=3584,intermediate=18944,head_dim=128,"
                   "vocab=152064,context=32768,rope_theta=1000000," ROPE_PLAIN
                   ",qkv_bias=1,tied=0,norm_eps=1e-06"},
};
#undef ROPE_PLAIN
#undef ROPE_LLAMA3

static fsdp_status llama_build(fsdp_model *m, const char *config)
{
    fsdp_llama_config c;
    memset(m, 0, sizeof *m);
    FSDP_TRY(fsdp_llama_config_from_keys(config, &c));
    return fsdp_llama_init(m, &c);
}

/* Per parameter that multiplies activations (every matrix but the
 * embedding table of an untied model, a lookup; adapters included): 2
 * FLOPs in the forward and 2 for the input gradient, and 2 more for the
 * weight gradient when it trains, so 6 for a trainable parameter and 4 for
 * a frozen one (no weight-gradient GEMM). Plus attention's
 * 12 L (NH hd) T (QK^T and att V, forward and backward; PaLM's estimate). */
static double llama_flops_per_token(const fsdp_model *m, int T)
{
    const fsdp_llama_config *c = fsdp_llama_config_of(m);
    size_t train = 0, frozen = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const fsdp_param_spec *p = &m->units[u].params[i];
            if (u == 0 && !c->tied && !strcmp(p->name, "model.embed_tokens.weight"))
                continue;
            *(p->frozen ? &frozen : &train) += p->numel;
        }
    return 6.0 * (double)train + 4.0 * (double)frozen +
           12.0 * c->n_layer * (double)c->n_head * c->head_dim * T;
}

const fsdp_model_family fsdp_llama_family = {
    /* .name            = */ "llama",
    /* .title           = */ "Llama",
    /* .doc             = */ "Llama 2/3, Qwen2 and Mistral-style decoders: RMSNorm, rotary "
                             "embeddings, grouped-query attention, SwiGLU",
    /* .grammar         = */ "layers=L,heads=H,kv_heads=K,hidden=C,intermediate=I,head_dim=D,"
                             "vocab=V,context=T,rope_theta=X,rope=default|linear|llama3,"
                             "rope_factor=F,rope_low_freq=X,rope_high_freq=X,"
                             "rope_orig_context=T,qkv_bias=0|1,tied=0|1,norm_eps=X",
    /* .alias           = */ NULL,
    /* .shapes          = */ llama_shapes,
    /* .n_shapes        = */ (int)(sizeof llama_shapes / sizeof llama_shapes[0]),
    /* .build           = */ llama_build,
    /* .flops_per_token = */ llama_flops_per_token,
    /* .llmc            = */ NULL,
    /* .safetensors     = */ &fsdp_llama_safetensors,
    /* .lora_modules    = */ fsdp_llama_lora_modules,
    /* .n_lora_modules  = */ FSDP_LLAMA_N_LORA_MODULES,
};
