/*
 * llama_weights.c - where the Llama family's parameters live in Hugging
 * Face safetensors files (the mapping of models/weights.h). The Hugging
 * Face directory slots of the same mapping (config.json in and out) are in
 * llama_hf.c.
 *
 * Names are Hugging Face's, which are fsdp's own ("model.embed_tokens.
 * weight", "model.layers.3.self_attn.q_proj.weight", "lm_head.weight"):
 * nn.Linear stores (out, in) as fsdp does, so nothing is transposed. The
 * embeddings and the LM head have V rows in the file and Vp in fsdp: the
 * pad rows are zero on import and dropped on export. Old checkpoints'
 * rotary buffers (model.layers.N.self_attn.rotary_emb.inv_freq) are skipped.
 *
 * The tensor shapes give layers, hidden, intermediate, vocab, whether the
 * head is tied (no lm_head.weight) and whether q/k/v have biases; the rest
 * (heads, kv heads, context, norm eps, rope) is not in them. fsdp writes
 * those as metadata under config.json's key names; a bare model.safetensors
 * from a Hugging Face directory has none, and is read through its
 * directory (config.json) instead.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama.h"

static const char *const root_names[] = {"model.embed_tokens.weight", "model.norm.weight",
                                         "lm_head.weight"};

/* Per-layer parameter suffixes after "model.layers.<l>.". */
static const char *const layer_suffix[] = {
    "input_layernorm.weight",    "self_attn.q_proj.weight",         "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",   "self_attn.o_proj.weight",         "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",      "mlp.up_proj.weight",              "mlp.down_proj.weight",
    "self_attn.q_proj.bias",     "self_attn.k_proj.bias",           "self_attn.v_proj.bias",
};
#define N_SUFFIX ((int)(sizeof layer_suffix / sizeof layer_suffix[0]))

/* "model.layers.<l>.<rest>": the layer and rest, or -1. */
static int layer_of(const char *s, const char **rest)
{
    return fsdp_weight_layer_of(s, "model.layers.", rest);
}

static fsdp_weight_match st_match(const char *name, char *param, size_t n)
{
    for (size_t i = 0; i < sizeof root_names / sizeof root_names[0]; i++)
        if (!strcmp(name, root_names[i])) {
            snprintf(param, n, "%s", name);
            return FSDP_WEIGHT_PARAM;
        }
    const char *rest;
    if (layer_of(name, &rest) < 0)
        return FSDP_WEIGHT_UNKNOWN;
    if (!strcmp(rest, "self_attn.rotary_emb.inv_freq"))
        return FSDP_WEIGHT_IGNORED;
    for (int i = 0; i < N_SUFFIX; i++)
        if (!strcmp(rest, layer_suffix[i])) {
            snprintf(param, n, "%s", name);
            return FSDP_WEIGHT_PARAM;
        }
    return FSDP_WEIGHT_UNKNOWN;
}

static void st_tensor(const fsdp_model *m, int unit, int param, fsdp_weight_tensor *out)
{
    const fsdp_llama_config *c = fsdp_llama_config_of(m);
    const fsdp_param_spec *p = &m->units[unit].params[param];
    FSDP_ASSERT(c);
    fsdp_weight_tensor_of_param(p, out);
    if (unit == 0 && p->ndim == 2) { /* embeddings, LM head: the real rows only */
        out->shape[0] = (uint64_t)c->vocab_size;
        out->stored_numel = out->shape[0] * out->shape[1];
    }
}

/* The file's tensor named `name`, or NULL. */
static const fsdp_file_tensor *find(const fsdp_file_tensors *ft, const char *name)
{
    for (int i = 0; i < ft->n; i++)
        if (!strcmp(ft->t[i].name, name))
            return &ft->t[i];
    return NULL;
}

/* Metadata `key` as a number in [lo, hi] (integral when `integer`);
 * FORMAT naming the key when missing or malformed. */
static fsdp_status meta_num(const fsdp_file_tensors *ft, const char *key, bool integer,
                            double lo, double hi, double *out)
{
    const char *v = fsdp_file_tensors_meta(ft, key);
    if (!v)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "metadata \"%s\" is missing, and a Llama-family model's %s is not "
                              "in its tensor shapes; read the Hugging Face directory that holds "
                              "this file (--model DIR: its config.json has it), or a file that "
                              "fsdp wrote",
                              key, key);
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < lo || x > hi ||
        (integer && x != floor(x)))
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "metadata \"%s\" is \"%.32s\", not %s in [%g, %g]", key, v,
                              integer ? "an integer" : "a number", lo, hi);
    *out = x;
    return FSDP_STATUS_OK;
}

static fsdp_status st_config(const fsdp_file_tensors *ft, char *config, size_t size)
{
    const fsdp_file_tensor *embed = find(ft, "model.embed_tokens.weight");
    const fsdp_file_tensor *gate = find(ft, "model.layers.0.mlp.gate_proj.weight");
    const fsdp_file_tensor *q = find(ft, "model.layers.0.self_attn.q_proj.weight");
    if (!embed || !gate || !q)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tensor '%s' is missing; this is not a Llama-family model",
                              !embed ? "model.embed_tokens.weight"
                              : !gate ? "model.layers.0.mlp.gate_proj.weight"
                                      : "model.layers.0.self_attn.q_proj.weight");
    if (embed->ndim != 2 || gate->ndim != 2 || q->ndim != 2)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "'%s', '%s' and '%s' must be matrices", embed->name, gate->name,
                              q->name);
    int max_layer = -1;
    for (int i = 0; i < ft->n; i++) {
        const char *rest;
        int l = layer_of(ft->t[i].name, &rest);
        if (l > max_layer)
            max_layer = l;
    }
    double heads, kv_heads, context, eps, theta;
    FSDP_TRY(meta_num(ft, "num_attention_heads", true, 1, 4096, &heads));
    FSDP_TRY(meta_num(ft, "num_key_value_heads", true, 1, 4096, &kv_heads));
    FSDP_TRY(meta_num(ft, "max_position_embeddings", true, 1, 1 << 24, &context));
    FSDP_TRY(meta_num(ft, "rms_norm_eps", false, 1e-30, 1, &eps));
    FSDP_TRY(meta_num(ft, "rope_theta", false, 1e-6, 1e12, &theta));
    if (q->shape[0] % (uint64_t)heads)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "'%s' has %" PRIu64 " rows, not a multiple of "
                              "num_attention_heads=%d",
                              q->name, q->shape[0], (int)heads);
    const char *rope = fsdp_file_tensors_meta(ft, "rope_type");
    char scaling[160] = "";
    if (rope && strcmp(rope, "default")) {
        fsdp_rope_type t;
        if (fsdp_rope_type_parse(rope, &t) != FSDP_STATUS_OK)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "metadata \"rope_type\" is \"%.32s\"; fsdp supports default, "
                                  "linear and llama3", rope);
        double factor;
        FSDP_TRY(meta_num(ft, "rope_factor", false, 1e-6, 1e6, &factor));
        size_t k = (size_t)snprintf(scaling, sizeof scaling, ",rope_factor=%.17g", factor);
        if (t == FSDP_ROPE_LLAMA3) {
            double low, high, orig;
            FSDP_TRY(meta_num(ft, "rope_low_freq_factor", false, 1e-6, 1e6, &low));
            FSDP_TRY(meta_num(ft, "rope_high_freq_factor", false, 1e-6, 1e6, &high));
            FSDP_TRY(meta_num(ft, "rope_original_max_position_embeddings", true, 1, 1 << 24,
                              &orig));
            snprintf(scaling + k, sizeof scaling - k,
                     ",rope_low_freq=%.17g,rope_high_freq=%.17g,rope_orig_context=%d", low, high,
                     (int)orig);
        }
    }
    snprintf(config, size,
             "layers=%d,heads=%d,kv_heads=%d,hidden=%" PRIu64 ",intermediate=%" PRIu64
             ",head_dim=%" PRIu64 ",vocab=%" PRIu64 ",context=%d,rope_theta=%.17g,rope=%s%s,"
             "qkv_bias=%d,tied=%d,norm_eps=%.17g",
             max_layer + 1, (int)heads, (int)kv_heads, embed->shape[1], gate->shape[0],
             q->shape[0] / (uint64_t)heads, embed->shape[0], (int)context, theta,
             rope ? rope : "default", scaling,
             find(ft, "model.layers.0.self_attn.q_proj.bias") ? 1 : 0,
             find(ft, "lm_head.weight") ? 0 : 1, eps);
    return FSDP_STATUS_OK;
}

static int st_metadata(const fsdp_model *m, char (*key)[64], char (*val)[64], int max)
{
    const fsdp_llama_config *c = fsdp_llama_config_of(m);
    FSDP_ASSERT(c);
    const fsdp_rope_spec *r = &c->rope;
    struct {
        const char *k;
        double v;
        bool on;
    } e[] = {
        {"num_attention_heads", c->n_head, true},
        {"num_key_value_heads", c->n_kv_head, true},
        {"max_position_embeddings", c->max_seq_len, true},
        {"rms_norm_eps", c->norm_eps, true},
        {"rope_theta", r->theta, true},
        {"rope_factor", r->factor, r->type != FSDP_ROPE_DEFAULT},
        {"rope_low_freq_factor", r->low_freq_factor, r->type == FSDP_ROPE_LLAMA3},
        {"rope_high_freq_factor", r->high_freq_factor, r->type == FSDP_ROPE_LLAMA3},
        {"rope_original_max_position_embeddings", r->original_max_pos,
         r->type == FSDP_ROPE_LLAMA3},
    };
    int n = 0;
    if (n < max) {
        snprintf(key[n], 64, "format");
        snprintf(val[n++], 64, "pt");
    }
    if (n < max) {
        snprintf(key[n], 64, "rope_type");
        snprintf(val[n++], 64, "%s", fsdp_rope_type_name(r->type));
    }
    for (size_t i = 0; i < sizeof e / sizeof e[0] && n < max; i++)
        if (e[i].on) {
            snprintf(key[n], 64, "%s", e[i].k);
            fsdp_llama_fmt_num(val[n++], 64, e[i].v);
        }
    return n;
}

const fsdp_safetensors_mapping fsdp_llama_safetensors = {
    /* .tensor          = */ st_tensor,
    /* .match           = */ st_match,
    /* .config          = */ st_config,
    /* .metadata        = */ st_metadata,
    /* .examples        = */ "Hugging Face Llama names such as 'model.embed_tokens.weight' or "
                             "'model.layers.0.self_attn.q_proj.weight'",
    /* .hf_model_types  = */ fsdp_llama_hf_model_types,
    /* .hf_config       = */ fsdp_llama_hf_config,
    /* .hf_config_write = */ fsdp_llama_hf_config_write,
    /* .hf_prefix       = */ NULL, /* HF Llama names carry their "model." prefix already */
};
