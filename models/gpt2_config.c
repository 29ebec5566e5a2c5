/*
 * gpt2_config.c - a GPT-2 config: its key list (layers, heads, channels,
 * vocab, context: the grammar of fsdp_gpt2_family), the values keys left
 * out take, validation and the canonical config string (gpt2.h).
 *
 * The padded vocabulary is not a key: it is always the vocabulary rounded
 * up to a multiple of 128, as llm.c pads it, so a config string says all
 * there is to say about a GPT-2.
 */
#include <stdio.h>

#include "models/gpt2.h"

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
