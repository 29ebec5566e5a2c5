/*
 * gpt2_weights.c - where GPT-2's parameters live in other projects' weight
 * files (the mappings of models/weights.h):
 *
 * llm.c (gpt2_*.bin): header words {maxT, V, L, NH, C, Vp} after magic and
 * version; then every parameter, whole tensors stacked over layers (all L
 * ln_1 weights, then all L ln_1 biases, ...) in the order of `tensors`
 * below. Linear weights are (OC, C) as in fsdp, wte is padded to Vp rows.
 *
 * Hugging Face (safetensors): fsdp's names ("wte.weight",
 * "h.3.attn.c_attn.weight", "ln_f.bias"), optionally prefixed
 * "transformer." on import. HF's Conv1D weights (attn.c_attn, attn.c_proj,
 * mlp.c_fc, mlp.c_proj) are stored (in, out), the transpose of fsdp's
 * (OC, C). HF's wte is (V, C): fsdp's pad rows are zero on import and
 * dropped on export. The causal-mask buffers (h.N.attn.bias,
 * h.N.attn.masked_bias) and the tied lm_head.weight are skipped on import.
 * The number of heads is not in the tensors' shapes: it comes from the
 * "n_head" metadata entry fsdp writes, else channels / 64 (every released
 * GPT-2 size has 64-dimensional heads).
 *
 * Hugging Face directories (config.json, model_type "gpt2"): the shape
 * keys n_embd, n_layer, n_head, n_positions (n_ctx in old files) and
 * vocab_size; the keys that would change the math fsdp does (activation,
 * inner size, epsilon, attention scaling, untied head, cross-attention)
 * must say what fsdp computes, or the directory is refused naming the key.
 * Written directories name tensors "transformer.*", as
 * GPT2LMHeadModel.save_pretrained does.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json.h"
#include "models/gpt2.h"

/* GPT-2's tensors in llm.c's file order. per_layer ones are "h.<l>.<name>"
 * in fsdp and in Hugging Face files (which may prefix "transformer."),
 * where `conv` marks the Conv1D weights HF stores transposed. */
static const struct gpt2_tensor {
    const char *name;
    bool per_layer, conv;
} tensors[] = {
    {"wte.weight", false, false},         {"wpe.weight", false, false},
    {"ln_1.weight", true, false},         {"ln_1.bias", true, false},
    {"attn.c_attn.weight", true, true},   {"attn.c_attn.bias", true, false},
    {"attn.c_proj.weight", true, true},   {"attn.c_proj.bias", true, false},
    {"ln_2.weight", true, false},         {"ln_2.bias", true, false},
    {"mlp.c_fc.weight", true, true},      {"mlp.c_fc.bias", true, false},
    {"mlp.c_proj.weight", true, true},    {"mlp.c_proj.bias", true, false},
    {"ln_f.weight", false, false},        {"ln_f.bias", false, false},
};
#define N_TENSORS ((int)(sizeof tensors / sizeof tensors[0]))

/* The root (per_layer false) or per-layer tensor called name, or NULL. */
static const struct gpt2_tensor *find_tensor(const char *name, bool per_layer)
{
    for (int i = 0; i < N_TENSORS; i++)
        if (tensors[i].per_layer == per_layer && !strcmp(name, tensors[i].name))
            return &tensors[i];
    return NULL;
}

/* ---- llm.c --------------------------------------------------------------- */

enum { H_MAXT = 0, H_V, H_L, H_NH, H_C, H_VP, H_WORDS };

static fsdp_status llmc_config(const int32_t *h, int n, char *config, size_t size)
{
    FSDP_ASSERT(n >= H_WORDS);
    if (h[H_MAXT] <= 0 || h[H_V] <= 0 || h[H_L] <= 0 || h[H_NH] <= 0 || h[H_C] <= 0 ||
        h[H_VP] < h[H_V])
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "impossible shapes maxT=%d V=%d L=%d NH=%d C=%d Vp=%d (all must be "
                              "positive and Vp >= V); the header is corrupt",
                              (int)h[H_MAXT], (int)h[H_V], (int)h[H_L], (int)h[H_NH],
                              (int)h[H_C], (int)h[H_VP]);
    int64_t rounded = ((int64_t)h[H_V] + 127) / 128 * 128;
    if (h[H_VP] != rounded)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "padded vocabulary Vp=%d is not V=%d rounded up to a multiple of "
                              "128 (%" PRId64 "), as llm.c pads it; the header is corrupt",
                              (int)h[H_VP], (int)h[H_V], rounded);
    snprintf(config, size, "layers=%d,heads=%d,channels=%d,vocab=%d,context=%d", (int)h[H_L],
             (int)h[H_NH], (int)h[H_C], (int)h[H_V], (int)h[H_MAXT]);
    return FSDP_STATUS_OK;
}

static void llmc_header(const fsdp_model *m, int32_t *h, int n)
{
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(m);
    FSDP_ASSERT(c && n >= H_WORDS);
    h[H_MAXT] = c->max_seq_len;
    h[H_V] = c->vocab_size;
    h[H_L] = c->n_layer;
    h[H_NH] = c->n_head;
    h[H_C] = c->n_embd;
    h[H_VP] = c->padded_vocab_size;
}

/* Index of a parameter in unit order, found by name. */
static int param_index(const fsdp_model *m, const char *name)
{
    int unit = -1;
    const fsdp_param_spec *p = fsdp_model_find_param(m, name, &unit);
    FSDP_ASSERT(p);
    int k = (int)(p - m->units[unit].params);
    for (int u = 0; u < unit; u++)
        k += m->units[u].n_params;
    return k;
}

static void llmc_file_order(const fsdp_model *m, int *order)
{
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(m);
    FSDP_ASSERT(c);
    int n = 0;
    char name[64];
    for (int i = 0; i < N_TENSORS; i++)
        for (int l = 0; l < (tensors[i].per_layer ? c->n_layer : 1); l++) {
            if (tensors[i].per_layer)
                snprintf(name, sizeof name, "h.%d.%s", l, tensors[i].name);
            else
                snprintf(name, sizeof name, "%s", tensors[i].name);
            order[n++] = param_index(m, name);
        }
}

const fsdp_llmc_mapping fsdp_gpt2_llmc = {
    /* .config = */ llmc_config,
    /* .header = */ llmc_header,
    /* .order  = */ llmc_file_order,
};

/* ---- Hugging Face names -------------------------------------------------- */

/* "h.<l>.<rest>": the layer and rest, or -1. */
static int block_layer(const char *s, const char **rest)
{
    return fsdp_weight_layer_of(s, "h.", rest);
}

static fsdp_weight_match st_match(const char *name, char *param, size_t n)
{
    if (!strcmp(name, "lm_head.weight"))
        return FSDP_WEIGHT_IGNORED;
    const char *s = strncmp(name, "transformer.", 12) ? name : name + 12;
    if (find_tensor(s, false)) {
        snprintf(param, n, "%s", s);
        return FSDP_WEIGHT_PARAM;
    }
    const char *rest;
    if (block_layer(s, &rest) < 0)
        return FSDP_WEIGHT_UNKNOWN;
    if (!strcmp(rest, "attn.bias") || !strcmp(rest, "attn.masked_bias"))
        return FSDP_WEIGHT_IGNORED;
    if (find_tensor(rest, true)) {
        snprintf(param, n, "%s", s);
        return FSDP_WEIGHT_PARAM;
    }
    return FSDP_WEIGHT_UNKNOWN;
}

static bool is_conv(const char *param)
{
    const char *rest;
    if (block_layer(param, &rest) < 0)
        return false;
    const struct gpt2_tensor *t = find_tensor(rest, true);
    return t && t->conv;
}

static void st_tensor(const fsdp_model *m, int unit, int param, fsdp_weight_tensor *out)
{
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(m);
    const fsdp_param_spec *p = &m->units[unit].params[param];
    FSDP_ASSERT(c);
    fsdp_weight_tensor_of_param(p, out);
    if (p->ndim == 2 && is_conv(p->name)) {
        out->transposed = true;
        out->shape[0] = (uint64_t)p->shape[1];
        out->shape[1] = (uint64_t)p->shape[0];
    } else if (!strcmp(p->name, "wte.weight")) {
        out->shape[0] = (uint64_t)c->vocab_size; /* the real rows only */
        out->stored_numel = out->shape[0] * out->shape[1];
    }
}

/* The file's tensor holding fsdp parameter `want`, or NULL. */
static const fsdp_file_tensor *find(const fsdp_file_tensors *ft, const char *want)
{
    char param[FSDP_WEIGHT_NAME_MAX];
    for (int i = 0; i < ft->n; i++)
        if (st_match(ft->t[i].name, param, sizeof param) == FSDP_WEIGHT_PARAM &&
            !strcmp(param, want))
            return &ft->t[i];
    return NULL;
}

static fsdp_status st_config(const fsdp_file_tensors *ft, char *config, size_t size)
{
    int n_head = 0;
    const char *h = fsdp_file_tensors_meta(ft, "n_head");
    if (h) {
        char *end = NULL;
        errno = 0;
        long v = strtol(h, &end, 10);
        if (errno || end == h || *end || *h < '0' || *h > '9' || v < 1 || v > 4096)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "metadata \"n_head\" is \"%.32s\", not a "
                                  "head count in 1..4096", h);
        n_head = (int)v;
    }
    const fsdp_file_tensor *wte = find(ft, "wte.weight"), *wpe = find(ft, "wpe.weight");
    if (!wte || !wpe)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "tensor '%s' is missing; this is not a "
                              "complete GPT-2", wte ? "wpe.weight" : "wte.weight");
    if (wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1])
        return fsdp_error_set(FSDP_STATUS_FORMAT, "'%.80s' and '%.80s' must be matrices (vocab, "
                              "channels) and (context, channels) with the same channels",
                              wte->name, wpe->name);
    int max_layer = -1;
    char param[FSDP_WEIGHT_NAME_MAX];
    for (int i = 0; i < ft->n; i++) {
        const char *rest;
        int l;
        if (st_match(ft->t[i].name, param, sizeof param) == FSDP_WEIGHT_PARAM &&
            (l = block_layer(param, &rest)) > max_layer)
            max_layer = l;
    }
    if (max_layer < 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "it holds no transformer blocks (no 'h.0.*' "
                              "tensors)");
    uint64_t C = wte->shape[1];
    if (!n_head) {
        if (C == 0 || C % 64)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "cannot tell the number of attention "
                                  "heads: the header has no \"n_head\" in \"__metadata__\" and "
                                  "channels=%" PRIu64 " is not a multiple of 64; add "
                                  "\"n_head\": \"<heads>\" to \"__metadata__\"", C);
        n_head = C / 64 > 4096 ? 4097 : (int)(C / 64);
    }
    snprintf(config, size, "layers=%d,heads=%d,channels=%" PRIu64 ",vocab=%" PRIu64
             ",context=%" PRIu64, max_layer + 1, n_head, C, wte->shape[0], wpe->shape[0]);
    return FSDP_STATUS_OK;
}

static int st_metadata(const fsdp_model *m, char (*key)[64], char (*val)[64], int max)
{
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(m);
    const struct {
        const char *k;
        int v;
    } e[] = {{"n_head", c->n_head},    {"n_layer", c->n_layer},       {"n_embd", c->n_embd},
             {"n_ctx", c->max_seq_len}, {"vocab_size", c->vocab_size}};
    int n = 0;
    if (n < max) {
        snprintf(key[n], 64, "format");
        snprintf(val[n++], 64, "pt");
    }
    for (size_t i = 0; i < sizeof e / sizeof e[0] && n < max; i++, n++) {
        snprintf(key[n], 64, "%s", e[i].k);
        snprintf(val[n], 64, "%d", e[i].v);
    }
    return n;
}

/* ---- Hugging Face directories (config.json) ------------------------------- */

static const char *const hf_types[] = {"gpt2", NULL};

/* Integer member `key` (the first of keys[] present) in 1..max into *out;
 * FORMAT naming the key when it is missing or not such an integer. */
static fsdp_status cfg_int(const fsdp_json *c, const char *const *keys, int max, int *out)
{
    const fsdp_json *v = NULL;
    const char *key = keys[0];
    for (int i = 0; keys[i] && !v; i++)
        if ((v = fsdp_json_get(c, keys[i])))
            key = keys[i];
    if (!v)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json has no \"%s\"", key);
    if (v->type != FSDP_JSON_NUMBER || !(v->number >= 1 && v->number <= max) ||
        v->number != (double)(int)v->number)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json key \"%s\" must be an integer in "
                              "1..%d", key, max);
    *out = (int)v->number;
    return FSDP_STATUS_OK;
}

/* An optional member that, when present (and not null), must equal what
 * fsdp computes. */
static fsdp_status cfg_require(const fsdp_json *c, const char *key, fsdp_json_type type,
                               const char *str, double num, bool boolean, const char *why)
{
    const fsdp_json *v = fsdp_json_get(c, key);
    if (!v || v->type == FSDP_JSON_NULL)
        return FSDP_STATUS_OK;
    bool ok = v->type == type &&
              (type == FSDP_JSON_STRING   ? fsdp_json_name(v) && !strcmp(v->str, str)
               : type == FSDP_JSON_NUMBER ? fabs(v->number - num) <= 1e-3 * fabs(num)
                                          : v->boolean == boolean);
    if (ok)
        return FSDP_STATUS_OK;
    return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json key \"%s\" is not what fsdp's "
                          "GPT-2 computes: %s", key, why);
}

static fsdp_status hf_config(const fsdp_json *c, char *spec, size_t size)
{
    static const char *const k_embd[] = {"n_embd", "hidden_size", NULL},
                             *const k_layer[] = {"n_layer", "num_hidden_layers", NULL},
                             *const k_head[] = {"n_head", "num_attention_heads", NULL},
                             *const k_pos[] = {"n_positions", "n_ctx", NULL},
                             *const k_vocab[] = {"vocab_size", NULL};
    int C, L, H, T, V;
    FSDP_TRY(cfg_int(c, k_embd, 1 << 20, &C));
    FSDP_TRY(cfg_int(c, k_layer, 1 << 16, &L));
    FSDP_TRY(cfg_int(c, k_head, 1 << 16, &H));
    FSDP_TRY(cfg_int(c, k_pos, 1 << 24, &T));
    FSDP_TRY(cfg_int(c, k_vocab, 1 << 30, &V));
    const fsdp_json *act = fsdp_json_get(c, "activation_function");
    if (fsdp_json_name(act) && !strcmp(act->str, "gelu_pytorch_tanh"))
        act = NULL; /* the same tanh approximation */
    if (act)
        FSDP_TRY(cfg_require(c, "activation_function", FSDP_JSON_STRING, "gelu_new", 0, false,
                             "fsdp uses GELU's tanh approximation (\"gelu_new\")"));
    const fsdp_json *inner = fsdp_json_get(c, "n_inner");
    if (inner && inner->type != FSDP_JSON_NULL)
        FSDP_TRY(cfg_require(c, "n_inner", FSDP_JSON_NUMBER, NULL, 4.0 * C, false,
                             "the MLP is 4 x n_embd wide (null or 4 * n_embd)"));
    FSDP_TRY(cfg_require(c, "layer_norm_epsilon", FSDP_JSON_NUMBER, NULL, 1e-5, false,
                         "LayerNorm's epsilon is 1e-5"));
    FSDP_TRY(cfg_require(c, "tie_word_embeddings", FSDP_JSON_BOOL, NULL, 0, true,
                         "the LM head is tied to wte"));
    FSDP_TRY(cfg_require(c, "scale_attn_weights", FSDP_JSON_BOOL, NULL, 0, true,
                         "attention scores are scaled by 1/sqrt(head size)"));
    FSDP_TRY(cfg_require(c, "scale_attn_by_inverse_layer_idx", FSDP_JSON_BOOL, NULL, 0, false,
                         "scores are not scaled by the layer index"));
    FSDP_TRY(cfg_require(c, "add_cross_attention", FSDP_JSON_BOOL, NULL, 0, false,
                         "there is no cross-attention"));
    snprintf(spec, size, "layers=%d,heads=%d,channels=%d,vocab=%d,context=%d", L, H, C, V, T);
    return FSDP_STATUS_OK;
}

/* config.json for model m, keys sorted and indented as transformers writes them. */
static fsdp_status hf_config_write(const fsdp_model *m, const char *dtype, fsdp_sbuf *out)
{
    const fsdp_gpt2_config *c = fsdp_gpt2_config_of(m);
    FSDP_ASSERT(c);
    /* GPT-2's <|endoftext|> is the last id of its 50257-token vocabulary;
     * other vocabularies have no known special token */
    char eot[16] = "null";
    if (c->vocab_size == 50257)
        snprintf(eot, sizeof eot, "%d", c->vocab_size - 1);
    fsdp_sbuf_printf(out,
                     "{\n"
                     "  \"activation_function\": \"gelu_new\",\n"
                     "  \"architectures\": [\n    \"GPT2LMHeadModel\"\n  ],\n"
                     "  \"bos_token_id\": %s,\n"
                     "  \"eos_token_id\": %s,\n"
                     "  \"layer_norm_epsilon\": 1e-05,\n"
                     "  \"model_type\": \"gpt2\",\n"
                     "  \"n_embd\": %d,\n"
                     "  \"n_head\": %d,\n"
                     "  \"n_inner\": null,\n"
                     "  \"n_layer\": %d,\n"
                     "  \"n_positions\": %d,\n"
                     "  \"scale_attn_by_inverse_layer_idx\": false,\n"
                     "  \"scale_attn_weights\": true,\n"
                     "  \"tie_word_embeddings\": true,\n"
                     "  \"torch_dtype\": \"%s\",\n"
                     "  \"vocab_size\": %d\n"
                     "}\n",
                     eot, eot, c->n_embd, c->n_head, c->n_layer, c->max_seq_len, dtype,
                     c->vocab_size);
    return out->oom ? fsdp_error_set(FSDP_STATUS_OOM, "out of host memory") : FSDP_STATUS_OK;
}

const fsdp_safetensors_mapping fsdp_gpt2_safetensors = {
    /* .tensor   = */ st_tensor,
    /* .match    = */ st_match,
    /* .config   = */ st_config,
    /* .metadata = */ st_metadata,
    /* .examples = */ "Hugging Face GPT-2 names such as 'wte.weight' or 'h.0.attn.c_attn.weight'",
    /* .hf_model_types  = */ hf_types,
    /* .hf_config       = */ hf_config,
    /* .hf_config_write = */ hf_config_write,
    /* .hf_prefix       = */ "transformer.",
};
