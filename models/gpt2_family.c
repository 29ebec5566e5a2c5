/*
 * gpt2_family.c - the GPT-2 family's registry entry: its named shapes, the
 * builder (a config key list, gpt2_config.c, made into gpt2.c's layout)
 * and the FLOPs per token for MFU.
 */
#include <string.h>

#include "models/gpt2.h"

/* "tiny" is the golden-test model: n_embd 32 keeps the PyTorch fixture (all
 * weights and all gradients) near 300 KiB. "small" is the default demo
 * (0.44M parameters): with the trainer's defaults it learns the synthetic
 * addition task to ~99% held-out accuracy in about half a minute of 2 cores
 * (600 steps of 64 problems on 4 simulated devices). Measured: 4 layers
 * (0.83M) also reach 100% but take ~95 CPU-seconds instead of ~50; 2 layers
 * of 64 channels take ~20 and reach ~98%. The others are OpenAI's GPT-2
 * releases. Each config is canonical (tests check it). */
static const fsdp_model_shape gpt2_shapes[] = {
    {"tiny", "layers=2,heads=4,channels=32,vocab=256,context=64"},
    {"small", "layers=2,heads=4,channels=128,vocab=256,context=64"},
    {"gpt2", "layers=12,heads=12,channels=768,vocab=50257,context=1024"},
    {"gpt2-medium", "layers=24,heads=16,channels=1024,vocab=50257,context=1024"},
    {"gpt2-large", "layers=36,heads=20,channels=1280,vocab=50257,context=1024"},
    {"gpt2-xl", "layers=48,heads=25,channels=1600,vocab=50257,context=1024"},
};

static fsdp_status gpt2_build(fsdp_model *m, const char *config)
{
    fsdp_gpt2_config c;
    memset(m, 0, sizeof *m);
    FSDP_TRY(fsdp_gpt2_config_from_keys(config, &c));
    return fsdp_gpt2_init(m, &c);
}

/* 6 FLOPs per parameter (forward and backward of the matmuls) plus
 * attention's 12 L C T (llm.c's estimate). */
static double gpt2_flops_per_token(const fsdp_model *m, int T)
{
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(m);
    return 6.0 * (double)m->numel + 12.0 * c->n_layer * (double)c->n_embd * T;
}

const fsdp_model_family fsdp_gpt2_family = {
    /* .name            = */ "gpt2",
    /* .title           = */ "GPT-2",
    /* .doc             = */ "any GPT-2: pre-LayerNorm, GELU MLP, learned positions, tied LM "
                             "head",
    /* .grammar         = */ "layers=L,heads=H,channels=C,vocab=V,context=T",
    /* .alias           = */ "custom",
    /* .shapes          = */ gpt2_shapes,
    /* .n_shapes        = */ (int)(sizeof gpt2_shapes / sizeof gpt2_shapes[0]),
    /* .build           = */ gpt2_build,
    /* .flops_per_token = */ gpt2_flops_per_token,
    /* .llmc            = */ &fsdp_gpt2_llmc,
    /* .safetensors     = */ &fsdp_gpt2_safetensors,
    /* .lora_modules    = */ NULL, /* LoRA: not yet (--freeze works) */
    /* .n_lora_modules  = */ 0,
};
