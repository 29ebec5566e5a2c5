/*
 * gpt2.h - the GPT-2 family's own header: its config (models/gpt2_config.c),
 * the layout builder (models/gpt2.c), and the pieces models/gpt2_family.c
 * and models/gpt2_weights.c share. Nothing outside models/ (and GPT-2's own
 * tests) includes it: the rest of fsdp reaches GPT-2 through the registry
 * (models/registry.h) and fsdp_model.family.
 *
 * Units: unit 0 = root (wte (Vp, C), wpe (maxT, C), ln_f.weight, ln_f.bias);
 * unit 1 + l = transformer block l (h.l.ln_1.{weight,bias},
 * h.l.attn.c_attn.{weight (3C, C), bias}, h.l.attn.c_proj.{weight (C, C),
 * bias}, h.l.ln_2.{weight,bias}, h.l.mlp.c_fc.{weight (4C, C), bias},
 * h.l.mlp.c_proj.{weight (C, 4C), bias}). Linear weights are stored (OC, C)
 * as llm.c does (HF's Conv1D stores the transpose). The LM head is tied to
 * wte. Weight decay applies to wte and the four linear weights per block.
 */
#ifndef FSDP_MODELS_GPT2_H
#define FSDP_MODELS_GPT2_H

#include "models/family.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_gpt2_config {
    int n_layer;
    int n_head;
    int n_embd;            /* C */
    int vocab_size;        /* V */
    int padded_vocab_size; /* Vp = V rounded up to a multiple of 128 */
    int max_seq_len;       /* maxT */
} fsdp_gpt2_config;

extern const fsdp_model_family fsdp_gpt2_family;           /* gpt2_family.c */
extern const fsdp_llmc_mapping fsdp_gpt2_llmc;             /* gpt2_weights.c */
extern const fsdp_safetensors_mapping fsdp_gpt2_safetensors;

/* A config key list ("layers=3,vocab=1000": keys of
 * fsdp_gpt2_family.grammar; keys not given take "small"'s values), parsed
 * strictly and validated; fills padded_vocab_size. */
fsdp_status fsdp_gpt2_config_from_keys(const char *keys, fsdp_gpt2_config *cfg);

/* The canonical key list of cfg (every key, in grammar order). */
void fsdp_gpt2_config_format(const fsdp_gpt2_config *cfg, char *buf, size_t n);

/* Check a config's values (positive, C divisible by heads, Vp = V rounded up). */
fsdp_status fsdp_gpt2_config_validate(const fsdp_gpt2_config *cfg);

/* Build the model (units, parameter specs, interface; family, config and
 * a spec-form name); free with fsdp_model_free. */
fsdp_status fsdp_gpt2_init(fsdp_model *m, const fsdp_gpt2_config *cfg);

/* The config a GPT-2 model was built from; NULL for any other model. */
const fsdp_gpt2_config *fsdp_gpt2_config_of(const fsdp_model *m);

/* The model's fsdp_model_i (models/gpt2.c) keeps models/model.h's
 * contract: the loss and its masked targets, forward-only states that keep
 * nothing per block, causal logits. */

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_GPT2_H */
