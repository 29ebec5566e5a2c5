/*
 * lora.h - LoRA adapters and frozen parameters on a built model (PEFT's
 * LoRA: https://huggingface.co/docs/peft, facts only).
 *
 * A targeted linear layer `<path>` with weight W (OC, C) gains two
 * trainable parameters in the unit that owns W, named as PEFT names them
 * without its "base_model.model." prefix:
 *   <path>.lora_A.weight (r, C)   Kaiming-uniform (a = sqrt(5)): U(-1/sqrt(C), 1/sqrt(C))
 *   <path>.lora_B.weight (OC, r)  zeros
 * and computes y = x W^T + scale (x A^T) B^T with scale = alpha / r
 * (rslora: alpha / sqrt(r)). Every base parameter is frozen. Targets are
 * matched as PEFT matches target_modules: a name equal to the module path
 * or to its last dot-separated components ("q_proj", "self_attn.q_proj",
 * "model.layers.0.self_attn.q_proj"); "all-linear" is every linear layer
 * but the LM head.
 */
#ifndef FSDP_MODELS_LORA_H
#define FSDP_MODELS_LORA_H

#include "models/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* alpha / r, or alpha / sqrt(r) with rslora. */
double fsdp_lora_scale(const fsdp_lora_config *c);

/* Check c (r in 1..4096, alpha > 0 and finite, targets non-empty and
 * well-formed) before any model is touched: INVALID_ARG naming the setting. */
fsdp_status fsdp_lora_config_check(const fsdp_lora_config *c);

/* Give m the adapters of c on every matching linear layer, freeze every
 * base parameter, relayout (fsdp_model_relayout) and record c in m->lora.
 * INVALID_ARG when the family has no LoRA support, or a target matches no
 * module (naming the target and listing the family's linear modules). */
fsdp_status fsdp_model_add_lora(fsdp_model *m, const fsdp_lora_config *c);

/* Freeze every parameter whose name matches one of `patterns` (a comma
 * list of Hugging Face tensor names with '*' matching any run of
 * characters, dots included), relayout, and record the patterns in
 * m->freeze. INVALID_ARG when a pattern matches no parameter, or when
 * nothing would be left to train. */
fsdp_status fsdp_model_freeze(fsdp_model *m, const char *patterns);

/* The adapters of block unit `unit`'s linear layer `module` (an index
 * into the family's lora_modules): A's and B's parameter indices in the
 * unit in *a and *b, true; false when that layer has none (or m has no
 * LoRA). What the family's forward and backward ask per projection. */
bool fsdp_lora_find(const fsdp_model *m, int unit, int module, int *a, int *b);

/* The merged model a Hugging Face export writes: base is m's family and config built without
 * adapters (fsdp_model_build), and out[u] (base->units[u].numel floats) gets each of its
 * parameters from m's host units (units[u]: unit u's numel floats in m's layout), with every
 * adapter folded into its weight, W + scale * B @ A (each element's sum over r in double,
 * rounded once). */
void fsdp_lora_merge(const fsdp_model *m, const float *const *units, const fsdp_model *base,
                     float *const *out);

/* Whether parameter i of unit `unit` is the weight of one of the family's block linear
 * layers (its lora_modules: every linear layer but the head), the weights NF4 stores, as
 * bitsandbytes quantizes a model's nn.Linear but the LM head. */
bool fsdp_lora_is_linear_weight(const fsdp_model *m, int unit, int i);

/* Whether name is a LoRA adapter parameter (ends in .lora_A.weight or
 * .lora_B.weight). */
bool fsdp_lora_is_adapter(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_LORA_H */
