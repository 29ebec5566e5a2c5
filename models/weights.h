/*
 * weights.h - how a model family names its parameters in the weight files
 * of other projects (llm.c .bin, Hugging Face safetensors). The family
 * supplies these mappings (models/<family>_weights.c); the readers and
 * writers in src/ckpt/ apply them and know no family.
 *
 * A flat file holds one tensor per parameter, possibly under another name,
 * in another order, transposed (HF's Conv1D weights), or with fewer rows
 * than fsdp keeps (GPT-2's wte, which fsdp pads to a multiple of 128 rows).
 * Everything here is plain data or a pure function of the model: no I/O.
 */
#ifndef FSDP_MODELS_WEIGHTS_H
#define FSDP_MODELS_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_model fsdp_model;
struct fsdp_json;  /* core/json.h */
struct fsdp_sbuf;  /* core/fileio.h */

#define FSDP_WEIGHT_NAME_MAX 128  /* longest tensor name a mapping produces */
#define FSDP_WEIGHT_MAX_DIMS 8

/* How one parameter is stored in a file. */
typedef struct fsdp_weight_tensor {
    char name[FSDP_WEIGHT_NAME_MAX]; /* the file's name for it ("h.0.attn.c_attn.weight") */
    int ndim;
    uint64_t shape[4];       /* the file's shape */
    bool transposed;         /* the file holds the (cols, rows) transpose of fsdp's
                              * row-major (rows, cols); only for 2-D parameters */
    uint64_t stored_numel;   /* elements the file holds (the product of shape): fsdp's
                              * elements past them are zero on import and dropped on
                              * export; all of them when transposed */
} fsdp_weight_tensor;

/* out as p is kept: p's name, shape and numel, not transposed; a family's
 * mapping then changes what its file stores otherwise (models/model.c). */
struct fsdp_param_spec;
void fsdp_weight_tensor_of_param(const struct fsdp_param_spec *p, fsdp_weight_tensor *out);

/* "<prefix><l>.<rest>" (prefix "h.", "model.layers."): the layer l
 * (decimal, no leading zeros, < 4096) with *rest after its dot, or -1. */
int fsdp_weight_layer_of(const char *s, const char *prefix, const char **rest);

/* A tensor found in a file, as the family sees it when it works out which
 * config the file holds. */
typedef struct fsdp_file_tensor {
    const char *name;
    int ndim;
    const uint64_t *shape;   /* [ndim] */
} fsdp_file_tensor;

/* The tensors and metadata of one file. */
typedef struct fsdp_file_tensors {
    int n;
    const fsdp_file_tensor *t;   /* [n] */
    int n_meta;
    const char *const *meta_key; /* [n_meta] */
    const char *const *meta_val; /* [n_meta] */
} fsdp_file_tensors;

/* The metadata value of `key`, or NULL. */
static inline const char *fsdp_file_tensors_meta(const fsdp_file_tensors *ft, const char *key)
{
    for (int i = 0; i < ft->n_meta; i++)
        if (!strcmp(ft->meta_key[i], key))
            return ft->meta_val[i];
    return NULL;
}

/* What a tensor name in a file stands for. */
typedef enum fsdp_weight_match {
    FSDP_WEIGHT_PARAM = 0,   /* a parameter (its fsdp name is returned) */
    FSDP_WEIGHT_IGNORED,     /* a buffer or tied copy: accepted and skipped on import */
    FSDP_WEIGHT_UNKNOWN,     /* not this family's */
} fsdp_weight_match;

/* llm.c's model files: int32[256] header {magic, version, then the
 * family's words}, then every parameter in the family's file order. */
typedef struct fsdp_llmc_mapping {
    /* The config the header words h[0..n) after magic and version hold:
     * FORMAT with a message (no path: the reader adds it) when they cannot
     * describe a model of this family. */
    fsdp_status (*config)(const int32_t *h, int n, char *config, size_t config_size);
    /* The header words after magic and version for model m (h is zeroed). */
    void (*header)(const fsdp_model *m, int32_t *h, int n);
    /* The parameters in file order: order[k] = index (in unit order:
     * units[0].params[0], ...) of the k-th tensor of the file; every
     * parameter exactly once. */
    void (*order)(const fsdp_model *m, int *order);
} fsdp_llmc_mapping;

/* Hugging Face safetensors files (and, later, directories of them). */
typedef struct fsdp_safetensors_mapping {
    /* Where parameter `param` of unit `unit` is stored. */
    void (*tensor)(const fsdp_model *m, int unit, int param, fsdp_weight_tensor *out);
    /* What the file's tensor `name` is; for a parameter, its fsdp name into
     * param[0..n). */
    fsdp_weight_match (*match)(const char *name, char *param, size_t n);
    /* The config the file's tensors and metadata describe. FORMAT with a
     * message (no path: the reader adds it) when they are not this family's
     * or miss what the config needs. Shapes and names are checked again
     * against the model built from the config, so this may look at only
     * the tensors it needs. */
    fsdp_status (*config)(const fsdp_file_tensors *ft, char *config, size_t config_size);
    /* Metadata written on export: fills key[i] and val[i] (each 64 bytes),
     * returns the count (<= max). */
    int (*metadata)(const fsdp_model *m, char (*key)[64], char (*val)[64], int max);
    const char *examples;    /* names for messages: "'wte.weight' or 'h.0.attn.c_attn.weight'" */

    /* Hugging Face model directories (config.json + model.safetensors or
     * sharded model-0000K-of-0000N.safetensors with an index). Optional:
     * NULL slots mean the family has no HF directories.
     * hf_model_types: the config.json "model_type" values this family
     * reads (NULL-terminated; e.g. {"llama", "qwen2", "mistral", NULL}).
     * hf_config: the family's config string for a parsed config.json;
     * FORMAT naming the key when it is missing, malformed or describes what
     * fsdp does not support (rope type, activation, ...; no path: the
     * reader adds it). Tensor shapes are checked again against the model
     * built from the result.
     * hf_config_write: the config.json text for model m (architectures,
     * model_type, every shape key, rope settings, torch_dtype = dtype:
     * "float32" or "bfloat16"), such that transformers'
     * AutoModelForCausalLM.from_pretrained loads the directory. */
    const char *const *hf_model_types;
    fsdp_status (*hf_config)(const struct fsdp_json *config, char *spec, size_t spec_size);
    fsdp_status (*hf_config_write)(const fsdp_model *m, const char *dtype, struct fsdp_sbuf *out);
    /* hf_prefix: put before every tensor name written into a Hugging Face
     * directory (GPT-2: "transformer.", as GPT2LMHeadModel.save_pretrained
     * names them; match must accept the prefixed names), or NULL. */
    const char *hf_prefix;
} fsdp_safetensors_mapping;

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_WEIGHTS_H */
