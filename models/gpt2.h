/*
 * gpt2.h - the GPT-2 model: configurations and the model constructor.
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

#include "models/model.h"

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

/* A named config: "tiny", "small", "gpt2" (124M), "gpt2-medium",
 * "gpt2-large", "gpt2-xl", or a custom shape
 * "custom:layers=L,heads=H,channels=C,vocab=V,context=T" (any subset of
 * keys; the rest default to "small"'s). Fills padded_vocab_size. */
fsdp_status fsdp_gpt2_config_parse(const char *spec, fsdp_gpt2_config *cfg);

/* Check a config's values (positive, C divisible by heads, ...). */
fsdp_status fsdp_gpt2_config_validate(const fsdp_gpt2_config *cfg);

/* Build the model (units, parameter specs, interface); free with fsdp_model_free. */
fsdp_status fsdp_gpt2_init(fsdp_model *m, const fsdp_gpt2_config *cfg);

/* The config a GPT-2 model was built from. */
const fsdp_gpt2_config *fsdp_gpt2_config_of(const fsdp_model *m);

/* Notes on the model's fsdp_model_i (models/gpt2.c):
 * - head_forward_backward's gradient is that of the mean loss over the B*T
 *   tokens, times dloss.
 * - Sampling / eval: a forward-only state (training=false) of (1, T) serves
 *   any prompt of length <= T; fill the positions after the prompt with any
 *   token: the logits at position t depend only on tokens 0..t (causal), so
 *   read row t of state_logits after head_forward_backward(root_grads=NULL).
 *   Forward-only states keep one layer's activations, reused by every layer. */

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_GPT2_H */
