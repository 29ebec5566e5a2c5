/*
 * family.h - what a model family provides: the entry a family file
 * (models/<family>.c) fills and the registry (models/registry.c) lists.
 *
 * A family is a kind of network (GPT-2, later Llama, Qwen2) with a config
 * space. A config is written as a family-relative key list, e.g.
 * "layers=2,heads=4,channels=32,vocab=256,context=64"; its canonical form
 * (every key, in the family's order) is what a built model carries in
 * fsdp_model.config and what checkpoints record, so build(canonical) gives
 * back the same model. Named shapes ("tiny", "gpt2-xl") are canonical
 * configs with a name.
 *
 * Adding a family: a models/<family>.c that fills an fsdp_model_family
 * (build = units, parameter specs, init and the fsdp_model_i math on
 * src/ops), its weight-file mappings (models/weights.h) if it has any, and
 * one line in the registry's table.
 */
#ifndef FSDP_MODELS_FAMILY_H
#define FSDP_MODELS_FAMILY_H

#include "models/model.h"
#include "models/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A linear layer inside a block that LoRA may target (models/lora.h). Its
 * module path is its weight's name without ".weight"; the weight is
 * (out features, in features). */
typedef struct fsdp_lora_module {
    const char *name;         /* the path inside a block, as PEFT names it: "self_attn.q_proj" */
    int param;                /* its weight's index in a block unit's parameters */
} fsdp_lora_module;

typedef struct fsdp_model_shape {
    const char *name;         /* a --model value of its own: "tiny" */
    const char *config;       /* its canonical config */
} fsdp_model_shape;

struct fsdp_model_family {
    const char *name;         /* "gpt2": registry key, spec prefix ("gpt2:layers=4"),
                               * a checkpoint's model_family */
    const char *title;        /* "GPT-2": in messages */
    const char *doc;          /* one line for --help, after the grammar */
    const char *grammar;      /* the keys of a config: "layers=L,heads=H,..." */
    const char *alias;        /* another spelling of "<name>:" that old command lines
                               * use ("custom"), or NULL */
    const fsdp_model_shape *shapes;
    int n_shapes;
    /* Build the model of `config`, a key list of `grammar` parsed strictly
     * (fsdp_model_keys_parse; keys left out take the family's defaults):
     * units, parameter specs, iface, vocab/context fields, and m->config
     * set to the canonical form. INVALID_ARG naming the problem; on
     * failure *m is left zeroed. The registry sets m->family and m->name. */
    fsdp_status (*build)(fsdp_model *m, const char *config);
    /* Training FLOPs per token at sequence length T (for MFU). */
    double (*flops_per_token)(const fsdp_model *m, int T);
    /* Weight-file mappings; NULL where the family has none. */
    const fsdp_llmc_mapping *llmc;
    const fsdp_safetensors_mapping *safetensors;
    /* The block's linear layers LoRA may target, in the order the family's
     * forward looks their adapters up (fsdp_lora_find, models/lora.h);
     * NULL: the family takes no LoRA (the LM head is never a target). */
    const fsdp_lora_module *lora_modules;
    int n_lora_modules;
};

/* ---- checks every family's config validation makes (registry.c) ---- */

/* A config's padded vocabulary: vocab rounded up to a multiple of 128. */
int fsdp_model_round_vocab(int vocab);

/* One int setting of a config and its upper bound (the lower one is 1). */
typedef struct fsdp_model_int_field {
    const char *key;
    int v, max;
} fsdp_model_int_field;

/* INVALID_ARG "<title> config: <key>=<v> is out of range; use 1..<max>" for
 * the first of f[0..n) outside its range. */
fsdp_status fsdp_model_check_ints(const char *title, const fsdp_model_int_field *f, int n);

/* INVALID_ARG unless padded == fsdp_model_round_vocab(vocab). */
fsdp_status fsdp_model_check_padded_vocab(const char *title, int vocab, int padded);

/* One key of a config: its value is read into *dst (int or double, in
 * [min, max]); *dst keeps its default when the key is left out. */
typedef enum fsdp_model_key_type { FSDP_MODEL_KEY_INT = 0, FSDP_MODEL_KEY_FLOAT } fsdp_model_key_type;

typedef struct fsdp_model_key {
    const char *key;
    fsdp_model_key_type type;
    void *dst;                /* int * or double * */
    double min, max;
} fsdp_model_key;

/* Parse `config` ("k=v,k=v") strictly for family f: at least one entry,
 * no empty entry (",,", a trailing comma), every key known and given at
 * most once, every value a number in range (integers for INT keys).
 * INVALID_ARG with a message naming the entry and listing the keys. */
fsdp_status fsdp_model_keys_parse(const fsdp_model_family *f, const char *config,
                                  const fsdp_model_key *keys, int n_keys);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_FAMILY_H */
