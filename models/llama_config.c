/*
 * llama_config.c - a Llama config: its key list (the grammar of
 * fsdp_llama_family), the values keys left out take, validation and the
 * canonical config string (llama.h).
 *
 * A config is a strict key list like GPT-2's. Every key is a number except
 * rope, which names the frequency scaling as Hugging Face does (default,
 * linear, llama3); the shared key reader (family.h) reads numbers only, so
 * the name is swapped for its index before the key list is read, and a
 * number given for rope is refused. Scaling keys that the chosen type does
 * not read must keep their neutral values (factor 1, the llama3 factors of
 * Llama 3.1), so one model has one canonical string, which lists every
 * key as the registry's contract asks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/llama.h"

/* Upper bounds that keep every size computation far from overflow. */
#define LLAMA_MAX_LAYERS 4096
#define LLAMA_MAX_HEADS 4096
#define LLAMA_MAX_WIDTH 65536       /* hidden, and heads * head_dim */
#define LLAMA_MAX_INTER (1 << 20)
#define LLAMA_MAX_VOCAB (1 << 24)
#define LLAMA_MAX_CONTEXT (1 << 24)

fsdp_status fsdp_llama_config_validate(const fsdp_llama_config *c)
{
    if (!c)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "Llama config is NULL");
    const fsdp_model_int_field f[] = {
        {"layers", c->n_layer, LLAMA_MAX_LAYERS},
        {"heads", c->n_head, LLAMA_MAX_HEADS},
        {"kv_heads", c->n_kv_head, LLAMA_MAX_HEADS},
        {"hidden", c->n_embd, LLAMA_MAX_WIDTH},
        {"intermediate", c->n_inter, LLAMA_MAX_INTER},
        {"head_dim", c->head_dim, LLAMA_MAX_WIDTH},
        {"vocab", c->vocab_size, LLAMA_MAX_VOCAB},
        {"context", c->max_seq_len, LLAMA_MAX_CONTEXT},
    };
    FSDP_TRY(fsdp_model_check_ints("Llama", f, (int)(sizeof f / sizeof f[0])));
    if (c->n_head % c->n_kv_head)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "Llama config: heads=%d is not a multiple of kv_heads=%d; every "
                              "key/value head serves the same number of query heads",
                              c->n_head, c->n_kv_head);
    if (c->head_dim % 2)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "Llama config: head_dim=%d is odd; rotary embeddings rotate "
                              "channel pairs, so use an even head_dim", c->head_dim);
    if ((long long)c->n_head * c->head_dim > LLAMA_MAX_WIDTH)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "Llama config: heads * head_dim = %lld is more than %d",
                              (long long)c->n_head * c->head_dim, LLAMA_MAX_WIDTH);
    FSDP_TRY(fsdp_model_check_padded_vocab("Llama", c->vocab_size, c->padded_vocab_size));
    if (!(c->norm_eps > 0.0 && c->norm_eps <= 1.0))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "Llama config: norm_eps=%g must be in (0, 1]", c->norm_eps);
    /* the rope table checks theta, the type and its factors */
    float *scratch = malloc((size_t)c->head_dim / 2 * sizeof *scratch + sizeof *scratch);
    if (!scratch)
        return fsdp_error_set(FSDP_STATUS_OOM, "host allocation for a rope table failed");
    fsdp_status st = fsdp_rope_inv_freq(&c->rope, c->head_dim, scratch);
    free(scratch);
    if (st != FSDP_STATUS_OK)
        fsdp_error_prefix("Llama config: ");
    return st;
}

/* ---- the key list ----------------------------------------------------------- */

/* Keys left out of a config: llama-tiny's; the rope scaling keys at their
 * neutral values (factor 1) and Llama 3.1's llama3 frequency factors. */
static const fsdp_llama_config llama_defaults = {
    .n_layer = 2, .n_head = 4, .n_kv_head = 0, .n_embd = 32, .n_inter = 64, .head_dim = 0,
    .vocab_size = 256, .max_seq_len = 64,
    .rope = {.type = FSDP_ROPE_DEFAULT, .theta = 10000.0, .factor = 1.0, .low_freq_factor = 1.0,
             .high_freq_factor = 4.0, .original_max_pos = 8192},
    .qkv_bias = false, .tied = false, .norm_eps = 1e-5,
};

/* Does `config` give key k (as "k=" at the start of an entry)? */
static bool has_key(const char *config, const char *k)
{
    size_t n = strlen(k);
    for (const char *p = config; p; p = strchr(p, ',')) {
        if (*p == ',')
            p++;
        if (!strncmp(p, k, n) && p[n] == '=')
            return true;
    }
    return false;
}

/* Copy `config` into out with the value of every "rope=" entry replaced by
 * its type's index. INVALID_ARG for a value that is not a type name. */
static fsdp_status rope_names_to_index(const char *config, char *out, size_t n)
{
    size_t k = 0;
    const char *p = config;
    for (;;) {
        const char *comma = strchr(p, ',');
        int len = (int)(comma ? (size_t)(comma - p) : strlen(p)), w;
        if (len >= 5 && !strncmp(p, "rope=", 5)) {
            char name[32];
            int vlen = len - 5;
            fsdp_rope_type t;
            if (vlen >= (int)sizeof name ||
                (memcpy(name, p + 5, (size_t)vlen), name[vlen] = '\0',
                 fsdp_rope_type_parse(name, &t) != FSDP_STATUS_OK))
                return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                      "Llama config '%.160s': rope=%.*s is not a rope scaling "
                                      "type; use rope=default, rope=linear or rope=llama3",
                                      config, vlen < 32 ? vlen : 32, p + 5);
            w = snprintf(out + k, n - k, "rope=%d%s", (int)t, comma ? "," : "");
        } else {
            w = snprintf(out + k, n - k, "%.*s%s", len, p, comma ? "," : "");
        }
        if (w < 0 || (size_t)w >= n - k)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "Llama config '%.64s...' is too long", config);
        k += (size_t)w;
        if (!comma)
            return FSDP_STATUS_OK;
        p = comma + 1;
    }
}

void fsdp_llama_rope_neutralize(fsdp_rope_spec *r)
{
    const fsdp_rope_spec *d = &llama_defaults.rope;
    if (r->type == FSDP_ROPE_DEFAULT)
        r->factor = d->factor;
    if (r->type != FSDP_ROPE_LLAMA3) {
        r->low_freq_factor = d->low_freq_factor;
        r->high_freq_factor = d->high_freq_factor;
        r->original_max_pos = d->original_max_pos;
    }
}

fsdp_status fsdp_llama_config_from_keys(const char *keys, fsdp_llama_config *cfg)
{
    fsdp_llama_config c = llama_defaults;
    if (!keys)
        keys = "";
    char mapped[1024];
    if (strlen(keys) >= sizeof mapped)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "Llama config '%.64s...' is too long",
                              keys);
    mapped[0] = '\0';
    if (*keys)
        FSDP_TRY(rope_names_to_index(keys, mapped, sizeof mapped));
    int rope = (int)c.rope.type, qkv_bias = c.qkv_bias, tied = c.tied;
    double theta = c.rope.theta, factor = c.rope.factor, low = c.rope.low_freq_factor,
           high = c.rope.high_freq_factor, eps = c.norm_eps;
    int orig = c.rope.original_max_pos;
    const fsdp_model_key table[] = {
        {"layers", FSDP_MODEL_KEY_INT, &c.n_layer, 1, LLAMA_MAX_LAYERS},
        {"heads", FSDP_MODEL_KEY_INT, &c.n_head, 1, LLAMA_MAX_HEADS},
        {"kv_heads", FSDP_MODEL_KEY_INT, &c.n_kv_head, 1, LLAMA_MAX_HEADS},
        {"hidden", FSDP_MODEL_KEY_INT, &c.n_embd, 1, LLAMA_MAX_WIDTH},
        {"intermediate", FSDP_MODEL_KEY_INT, &c.n_inter, 1, LLAMA_MAX_INTER},
        {"head_dim", FSDP_MODEL_KEY_INT, &c.head_dim, 2, LLAMA_MAX_WIDTH},
        {"vocab", FSDP_MODEL_KEY_INT, &c.vocab_size, 1, LLAMA_MAX_VOCAB},
        {"context", FSDP_MODEL_KEY_INT, &c.max_seq_len, 1, LLAMA_MAX_CONTEXT},
        {"rope_theta", FSDP_MODEL_KEY_FLOAT, &theta, 1e-6, 1e12},
        {"rope", FSDP_MODEL_KEY_INT, &rope, 0, FSDP_ROPE_TYPE_COUNT - 1},
        {"rope_factor", FSDP_MODEL_KEY_FLOAT, &factor, 1e-6, 1e6},
        {"rope_low_freq", FSDP_MODEL_KEY_FLOAT, &low, 1e-6, 1e6},
        {"rope_high_freq", FSDP_MODEL_KEY_FLOAT, &high, 1e-6, 1e6},
        {"rope_orig_context", FSDP_MODEL_KEY_INT, &orig, 1, LLAMA_MAX_CONTEXT},
        {"qkv_bias", FSDP_MODEL_KEY_INT, &qkv_bias, 0, 1},
        {"tied", FSDP_MODEL_KEY_INT, &tied, 0, 1},
        {"norm_eps", FSDP_MODEL_KEY_FLOAT, &eps, 1e-30, 1},
    };
    FSDP_TRY(fsdp_model_keys_parse(&fsdp_llama_family, mapped, table,
                                   (int)(sizeof table / sizeof table[0])));
    /* scaling keys the type does not read must keep their neutral values */
    const fsdp_rope_spec *d = &llama_defaults.rope;
    const struct {
        const char *key;
        bool read, neutral;
    } scale[] = {
        {"rope_factor", rope != FSDP_ROPE_DEFAULT, factor == d->factor},
        {"rope_low_freq", rope == FSDP_ROPE_LLAMA3, low == d->low_freq_factor},
        {"rope_high_freq", rope == FSDP_ROPE_LLAMA3, high == d->high_freq_factor},
        {"rope_orig_context", rope == FSDP_ROPE_LLAMA3, orig == d->original_max_pos},
    };
    for (size_t i = 0; i < sizeof scale / sizeof scale[0]; i++)
        if (!scale[i].read && !scale[i].neutral)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "Llama config '%.160s': %s has no effect with rope=%s; leave it "
                                  "out or pick a scaling type that reads it",
                                  keys, scale[i].key, fsdp_rope_type_name((fsdp_rope_type)rope));
    if (rope != FSDP_ROPE_DEFAULT && !has_key(mapped, "rope_factor"))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "Llama config '%.160s': rope=%s needs rope_factor (the scaling "
                              "factor, e.g. 8 for Llama 3.1)",
                              keys, fsdp_rope_type_name((fsdp_rope_type)rope));
    if (!has_key(mapped, "kv_heads"))
        c.n_kv_head = c.n_head;
    if (!has_key(mapped, "head_dim")) {
        if (c.n_embd % c.n_head)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "Llama config '%.160s': hidden=%d is not divisible by "
                                  "heads=%d; give head_dim",
                                  keys, c.n_embd, c.n_head);
        c.head_dim = c.n_embd / c.n_head;
    }
    c.rope = (fsdp_rope_spec){.type = (fsdp_rope_type)rope, .theta = theta, .factor = factor,
                              .low_freq_factor = low, .high_freq_factor = high,
                              .original_max_pos = orig};
    c.qkv_bias = qkv_bias;
    c.tied = tied;
    c.norm_eps = eps;
    c.padded_vocab_size = fsdp_model_round_vocab(c.vocab_size);
    FSDP_TRY(fsdp_llama_config_validate(&c));
    *cfg = c;
    return FSDP_STATUS_OK;
}

void fsdp_llama_fmt_num(char *buf, size_t n, double v)
{
    if (v == floor(v) && fabs(v) < 1e15) { /* integers as integers: 500000, not 5e+05 */
        snprintf(buf, n, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

void fsdp_llama_config_format(const fsdp_llama_config *c, char *buf, size_t n)
{
    char theta[32], eps[32], factor[32], low[32], high[32];
    fsdp_llama_fmt_num(theta, sizeof theta, c->rope.theta);
    fsdp_llama_fmt_num(eps, sizeof eps, c->norm_eps);
    fsdp_llama_fmt_num(factor, sizeof factor, c->rope.factor);
    fsdp_llama_fmt_num(low, sizeof low, c->rope.low_freq_factor);
    fsdp_llama_fmt_num(high, sizeof high, c->rope.high_freq_factor);
    snprintf(buf, n,
             "layers=%d,heads=%d,kv_heads=%d,hidden=%d,intermediate=%d,head_dim=%d,vocab=%d,"
             "context=%d,rope_theta=%s,rope=%s,rope_factor=%s,rope_low_freq=%s,"
             "rope_high_freq=%s,rope_orig_context=%d,qkv_bias=%d,tied=%d,norm_eps=%s",
             c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->n_inter, c->head_dim,
             c->vocab_size, c->max_seq_len, theta, fsdp_rope_type_name(c->rope.type), factor,
             low, high, c->rope.original_max_pos, c->qkv_bias ? 1 : 0, c->tied ? 1 : 0, eps);
}
