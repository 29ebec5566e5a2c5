/*
 * gpt2_family.c - the GPT-2 family's registry entry: its named shapes, the
 * config grammar (layers, heads, channels, vocab, context), validation, the
 * canonical config string, and the builder (gpt2.c's layout).
 *
 * The padded vocabulary is not a key: it is always the vocabulary rounded
 * up to a multiple of 128, as llm.c pads it, so a config string says all
 * there is to say about a GPT-2.
 */
#include <stdio.h>
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

/* Keys left out of a config take "small"'s values. */
static const fsdp_gpt2_config gpt2_defaults = {
    .n_layer = 2, .n_head = 4, .n_embd = 128, .vocab_size = 256, .max_seq_len = 64,
};

/* Upper bounds that keep every size computation far from overflow. */
#define GPT2_MAX_LAYERS 4096
#define GPT2_MAX_HEADS 4096
#define GPT2_MAX_CHANNELS 65536
#define GPT2_MAX_VOCAB (1 << 24)
#define GPT2_MAX_CONTEXT (1 << 20)

fsdp_status fsdp_gpt2_config_validate(const fsdp_gpt2_config *cfg)
{
    if (!cfg)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "GPT-2 config is NULL");
    const fsdp_model_int_field f[] = {
        {"layers", cfg->n_layer, GPT2_MAX_LAYERS},
        {"heads", cfg->n_head, GPT2_MAX_HEADS},
        {"channels", cfg->n_embd, GPT2_MAX_CHANNELS},
        {"vocab", cfg->vocab_size, GPT2_MAX_VOCAB},
        {"context", cfg->max_seq_len, GPT2_MAX_CONTEXT},
    };
    FSDP_TRY(fsdp_model_check_ints("GPT-2", f, (int)(sizeof f / sizeof f[0])));
    if (cfg->n_embd % cfg->n_head != 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "GPT-2 config: channels=%d is not divisible by heads=%d; pick "
                              "channels as a multiple of heads",
                              cfg->n_embd, cfg->n_head);
    return fsdp_model_check_padded_vocab("GPT-2", cfg->vocab_size, cfg->padded_vocab_size);
}

fsdp_status fsdp_gpt2_config_from_keys(const char *keys, fsdp_gpt2_config *cfg)
{
    fsdp_gpt2_config c = gpt2_defaults;
    const fsdp_model_key table[] = {
        {"layers", FSDP_MODEL_KEY_INT, &c.n_layer, 1, GPT2_MAX_LAYERS},
        {"heads", FSDP_MODEL_KEY_INT, &c.n_head, 1, GPT2_MAX_HEADS},
        {"channels", FSDP_MODEL_KEY_INT, &c.n_embd, 1, GPT2_MAX_CHANNELS},
        {"vocab", FSDP_MODEL_KEY_INT, &c.vocab_size, 1, GPT2_MAX_VOCAB},
        {"context", FSDP_MODEL_KEY_INT, &c.max_seq_len, 1, GPT2_MAX_CONTEXT},
    };
    FSDP_TRY(fsdp_model_keys_parse(&fsdp_gpt2_family, keys, table,
                                   (int)(sizeof table / sizeof table[0])));
    c.padded_vocab_size = fsdp_model_round_vocab(c.vocab_size);
    FSDP_TRY(fsdp_gpt2_config_validate(&c));
    *cfg = c;
    return FSDP_STATUS_OK;
}

void fsdp_gpt2_config_format(const fsdp_gpt2_config *cfg, char *buf, size_t n)
{
    snprintf(buf, n, "layers=%d,heads=%d,channels=%d,vocab=%d,context=%d", cfg->n_layer,
             cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->max_seq_len);
}

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
};
