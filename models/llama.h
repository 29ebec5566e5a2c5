/*
 * llama.h - the Llama family's own header (Llama 2/3, Qwen2, Mistral-style
 * decoders): its config (models/llama_config.c), the layout builder
 * (models/llama.c) and the pieces models/llama_family.c and
 * models/llama_weights.c share. Nothing outside
 * models/ (and the family's own tests and benchmark) includes it: the rest
 * of fsdp reaches the family through the registry and fsdp_model.family.
 *
 * The architecture is Hugging Face's LlamaForCausalLM / Qwen2ForCausalLM:
 * pre-RMSNorm decoder layers, rotary position embeddings (rope_theta, with
 * default, linear or llama3 frequency scaling), grouped-query attention
 * with a head size independent of the width, optional q/k/v biases (Qwen2),
 * a SwiGLU MLP, a final RMSNorm and an LM head tied to the embeddings or
 * not. No position embeddings, no dropout, no biases elsewhere.
 *
 * Units and parameters (Hugging Face's names, shapes (rows, cols) with
 * linear weights (out, in) as nn.Linear stores them; Vp = vocab rounded up
 * to a multiple of 128, the padding rows never reach the loss):
 *   unit 0 "root":  model.embed_tokens.weight (Vp, C), model.norm.weight (C),
 *                   lm_head.weight (Vp, C) when untied
 *   unit 1 + l "layers.l": model.layers.l.
 *     input_layernorm.weight (C)
 *     self_attn.q_proj.weight (NH hd, C)   } contiguous: one fused (QS, C)
 *     self_attn.k_proj.weight (NKV hd, C)  } projection with QS =
 *     self_attn.v_proj.weight (NKV hd, C)  } (NH + 2 NKV) hd
 *     self_attn.o_proj.weight (C, NH hd)
 *     post_attention_layernorm.weight (C)
 *     mlp.gate_proj.weight (IC, C)         } contiguous: one fused (2 IC, C)
 *     mlp.up_proj.weight (IC, C)           } projection, [gate | up] per row
 *     mlp.down_proj.weight (C, IC)
 *     self_attn.{q,k,v}_proj.bias (NH hd), (NKV hd), (NKV hd): contiguous,
 *                   last in the unit, only with qkv_bias
 * Weight decay applies to the matrices (embeddings, projections, LM head),
 * not to norms or biases. Initialisation: matrices N(0, 0.02^2) (HF's
 * initializer_range), norm weights 1, biases 0.
 */
#ifndef FSDP_MODELS_LLAMA_H
#define FSDP_MODELS_LLAMA_H

#include <stdbool.h>

#include "models/family.h"
#include "ops/rope_table.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_llama_config {
    int n_layer;           /* L */
    int n_head;            /* NH: query heads */
    int n_kv_head;         /* NKV: key/value heads, NH % NKV == 0 */
    int n_embd;            /* C: hidden_size */
    int n_inter;           /* IC: intermediate_size */
    int head_dim;          /* hd: even, independent of C / NH */
    int vocab_size;        /* V */
    int padded_vocab_size; /* Vp = V rounded up to a multiple of 128 */
    int max_seq_len;       /* max_position_embeddings */
    fsdp_rope_spec rope;   /* theta and scaling (ops/rope_table.h) */
    bool qkv_bias;         /* biases on q, k and v (Qwen2) */
    bool tied;             /* LM head = embed_tokens */
    double norm_eps;       /* rms_norm_eps */
} fsdp_llama_config;

extern const fsdp_model_family fsdp_llama_family;          /* llama_family.c */
extern const fsdp_safetensors_mapping fsdp_llama_safetensors; /* llama_weights.c */
/* The block's linear layers LoRA may target (llama.c): q, k, v, o, gate,
 * up, down, in the order the family's lora_modules lists them. */
#define FSDP_LLAMA_N_LORA_MODULES 7
extern const fsdp_lora_module fsdp_llama_lora_modules[FSDP_LLAMA_N_LORA_MODULES];

/* Hugging Face directories (llama_hf.c): the slots of fsdp_llama_safetensors
 * (models/weights.h says what they do). The model types are "llama",
 * "qwen2" and "mistral". */
extern const char *const fsdp_llama_hf_model_types[];
fsdp_status fsdp_llama_hf_config(const struct fsdp_json *config, char *spec, size_t spec_size);
fsdp_status fsdp_llama_hf_config_write(const fsdp_model *m, const char *dtype,
                                       struct fsdp_sbuf *out);

/* A config key list of fsdp_llama_family.grammar, parsed strictly and
 * validated (keys left out: "llama-tiny"'s values, except kv_heads = heads,
 * head_dim = hidden / heads, rope_factor = 1 (required by linear and
 * llama3) and the llama3 frequency keys = Llama 3.1's). INVALID_ARG naming
 * the key. */
fsdp_status fsdp_llama_config_from_keys(const char *keys, fsdp_llama_config *cfg);

/* The canonical key list of cfg: every key, in grammar order (rope scaling
 * keys the type does not read at their neutral values), numbers in their
 * shortest round-trip form. */
void fsdp_llama_config_format(const fsdp_llama_config *cfg, char *buf, size_t n);

/* v as an integer when it is one, else the shortest %g form that reads
 * back as v (a valid JSON number for finite v): the canonical spelling of
 * the config's numbers. */
void fsdp_llama_fmt_num(char *buf, size_t n, double v);

/* Set the scaling fields r->type does not read to their neutral values
 * (factor 1; Llama 3.1's llama3 factors), as canonical configs hold them. */
void fsdp_llama_rope_neutralize(fsdp_rope_spec *r);

/* Check a config's values (ranges, NH % NKV, even head_dim, Vp, rope). */
fsdp_status fsdp_llama_config_validate(const fsdp_llama_config *cfg);

/* Build the model (units, parameter specs, interface, family, config);
 * free with fsdp_model_free. */
fsdp_status fsdp_llama_init(fsdp_model *m, const fsdp_llama_config *cfg);

/* The config a Llama-family model was built from; NULL for any other. */
const fsdp_llama_config *fsdp_llama_config_of(const fsdp_model *m);

/* The model's fsdp_model_i (models/llama.c) keeps models/model.h's
 * contract, as GPT-2's does (gpt2.h). */

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_LLAMA_H */
