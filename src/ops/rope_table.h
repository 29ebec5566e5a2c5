/*
 * rope_table.h - the inverse-frequency table of rotary position embeddings,
 * built on the host from a model's config (rope_theta and rope_scaling), the
 * way Hugging Face transformers builds it (modeling_rope_utils).
 *
 * The rope ops (ops.h: rope_fwd/rope_bwd) take the table, not the config,
 * so a new scaling type is a new case here and nothing else. Pure
 * functions: no allocation, no state.
 */
#ifndef FSDP_OPS_ROPE_TABLE_H
#define FSDP_OPS_ROPE_TABLE_H

#include "core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_rope_type {
    FSDP_ROPE_DEFAULT = 0, /* theta^(-2i/hd) */
    FSDP_ROPE_LINEAR,      /* default / factor (position interpolation) */
    FSDP_ROPE_LLAMA3,      /* Llama 3.1: low frequencies / factor, a smooth ramp between */
    FSDP_ROPE_TYPE_COUNT
} fsdp_rope_type;

typedef struct fsdp_rope_spec {
    fsdp_rope_type type;
    double theta;             /* rope_theta (Llama 2: 1e4, Llama 3: 5e5, Qwen2: 1e6) */
    double factor;            /* rope_scaling.factor (linear, llama3) */
    double low_freq_factor;   /* llama3 */
    double high_freq_factor;  /* llama3 */
    int original_max_pos;     /* llama3: original_max_position_embeddings */
} fsdp_rope_spec;

/* The type named `name` as HF's rope_scaling "rope_type" (or legacy "type")
 * spells it: "default", "linear", "llama3". INVALID_ARG naming the
 * supported types otherwise. */
fsdp_status fsdp_rope_type_parse(const char *name, fsdp_rope_type *out);

/* HF's name of a type ("default", ...). */
const char *fsdp_rope_type_name(fsdp_rope_type type);

/* inv_freq[i] for i = 0 .. hd/2 - 1 (host memory): theta^(-2i/hd),
 * rescaled by the spec's type. Each step is rounded to fp32 where
 * transformers' torch code rounds it, so the tables agree bit for bit
 * except where torch's vectorised pow is one ulp off the correctly rounded
 * power fsdp uses (a few entries in a hundred). INVALID_ARG
 * with a message naming the field when hd is odd or not positive, theta or
 * a factor is not positive, or llama3's high_freq_factor <= low_freq_factor
 * or original_max_pos <= 0. */
fsdp_status fsdp_rope_inv_freq(const fsdp_rope_spec *spec, int hd, float *inv_freq);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPS_ROPE_TABLE_H */
