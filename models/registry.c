/*
 * registry.c - the table of model families, spec parsing and the strict
 * key=value reader every family uses for its configs (registry.h,
 * family.h).
 *
 * The table below is the only place that lists families; named shapes,
 * the --model help text and checkpoints' model_family lines all come from
 * it, so a family's names are spelled once, in its own file.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/registry.h"

extern const fsdp_model_family fsdp_gpt2_family; /* models/gpt2_family.c */
extern const fsdp_model_family fsdp_llama_family; /* models/llama_family.c */

static const fsdp_model_family *const families[] = {
    &fsdp_gpt2_family,
    &fsdp_llama_family,
};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

int fsdp_model_family_count(void) { return N_FAMILIES; }

const fsdp_model_family *fsdp_model_family_at(int i)
{
    return i >= 0 && i < N_FAMILIES ? families[i] : NULL;
}

const fsdp_model_family *fsdp_model_family_find(const char *name)
{
    for (int i = 0; name && i < N_FAMILIES; i++)
        if (!strcmp(families[i]->name, name))
            return families[i];
    return NULL;
}

/* ---- specs ------------------------------------------------------------------ */

static const fsdp_model_shape *find_shape(const char *name, const fsdp_model_family **family)
{
    for (int i = 0; i < N_FAMILIES; i++)
        for (int k = 0; k < families[i]->n_shapes; k++)
            if (!strcmp(families[i]->shapes[k].name, name)) {
                *family = families[i];
                return &families[i]->shapes[k];
            }
    return NULL;
}

/* The family whose name or alias is value[0..len). */
static const fsdp_model_family *find_prefix(const char *value, size_t len)
{
    for (int i = 0; i < N_FAMILIES; i++) {
        const char *a = families[i]->alias;
        if ((strlen(families[i]->name) == len && !strncmp(families[i]->name, value, len)) ||
            (a && strlen(a) == len && !strncmp(a, value, len)))
            return families[i];
    }
    return NULL;
}

bool fsdp_model_is_spec(const char *value)
{
    if (!value)
        return false;
    const fsdp_model_family *f;
    if (find_shape(value, &f))
        return true;
    const char *colon = strchr(value, ':');
    return find_prefix(value, colon ? (size_t)(colon - value) : strlen(value)) != NULL;
}

fsdp_status fsdp_model_build(const fsdp_model_family *f, const char *config, fsdp_model *m)
{
    memset(m, 0, sizeof *m);
    if (!f || !config)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "no model family or config given");
    fsdp_status st = f->build(m, config);
    if (st != FSDP_STATUS_OK) {
        fsdp_model_free(m);
        return st;
    }
    m->family = f;
    FSDP_ASSERT(fsdp_model_relayout(m) == FSDP_STATUS_OK); /* nothing frozen yet */
    const char *name = NULL;
    for (int k = 0; k < f->n_shapes && !name; k++)
        if (!strcmp(f->shapes[k].config, m->config))
            name = f->shapes[k].name;
    if (name)
        snprintf(m->name, sizeof m->name, "%s", name);
    else
        fsdp_model_spec_of(m, m->name, sizeof m->name);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_model_from_spec(const char *spec, fsdp_model *m)
{
    memset(m, 0, sizeof *m);
    char help[1024];
    if (!spec || !*spec) {
        fsdp_model_spec_help(help, sizeof help);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "no model given; use %s", help);
    }
    const fsdp_model_family *f = NULL;
    const fsdp_model_shape *shape = find_shape(spec, &f);
    if (shape)
        return fsdp_model_build(f, shape->config, m);
    const char *colon = strchr(spec, ':');
    size_t plen = colon ? (size_t)(colon - spec) : strlen(spec);
    f = find_prefix(spec, plen);
    if (f && !colon)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "model '%s' needs a config: %.*s:%s",
                              spec, (int)plen, spec, f->grammar);
    if (!f) {
        fsdp_model_spec_help(help, sizeof help);
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown model '%s'; use %s", spec, help);
    }
    return fsdp_model_build(f, colon + 1, m);
}

void fsdp_model_spec_of(const fsdp_model *m, char *buf, size_t n)
{
    snprintf(buf, n, "%s:%s", m->family ? m->family->name : "?", m->config);
}

size_t fsdp_model_spec_help(char *buf, size_t n)
{
    size_t k = 0;
#define PUT(...) (k += (size_t)snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, __VA_ARGS__))
    for (int i = 0; i < N_FAMILIES; i++) {
        const fsdp_model_family *f = families[i];
        for (int s = 0; s < f->n_shapes; s++)
            PUT("%s%s", s ? "|" : i ? "; " : "", f->shapes[s].name);
        if (f->n_shapes)
            PUT(" (%s)", f->title);
    }
    for (int i = 0; i < N_FAMILIES; i++) {
        const fsdp_model_family *f = families[i];
        PUT("%s%s:%s (%s", i ? " or " : ", or ", f->name, f->grammar, f->doc);
        if (f->alias)
            PUT("; also spelled %s:...", f->alias);
        PUT(")");
    }
#undef PUT
    if (n)
        buf[k < n ? k : n - 1] = '\0';
    return k < n ? k : n - 1;
}

/* ---- the key=value reader ------------------------------------------------------ */

static fsdp_status key_error(const fsdp_model_family *f, const char *config, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static fsdp_status key_error(const fsdp_model_family *f, const char *config, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s config '%.160s': %s; the keys are %s",
                          f->title, config, what, f->grammar);
}

/* A strict decimal number: an optional '-', digits, and for floats a
 * fraction and exponent as strtod reads them; no spaces, no '+', no hex. */
static bool read_number(const char *s, fsdp_model_key_type type, double *out)
{
    const char *p = *s == '-' ? s + 1 : s;
    if (*p < '0' || *p > '9')
        return false;
    char *end = NULL;
    errno = 0;
    if (type == FSDP_MODEL_KEY_INT) {
        long long v = strtoll(s, &end, 10);
        if (errno || *end)
            return false;
        *out = (double)v;
        return true;
    }
    for (const char *c = s; *c; c++)
        if (*c == 'x' || *c == 'X' || *c == 'n' || *c == 'N' || *c == 'i' || *c == 'I')
            return false; /* hex floats, nan, inf */
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

fsdp_status fsdp_model_keys_parse(const fsdp_model_family *f, const char *config,
                                  const fsdp_model_key *keys, int n_keys)
{
    FSDP_ASSERT(f && keys && n_keys > 0 && n_keys <= 64);
    if (!config || !*config)
        return key_error(f, config ? config : "", "it is empty; give at least one key");
    uint64_t seen = 0;
    double vals[64];
    const char *p = config;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0)
            return key_error(f, config, "it has an empty entry (a leading, doubled or trailing "
                                        "comma)");
        const char *eq = memchr(p, '=', len);
        if (!eq)
            return key_error(f, config, "'%.*s' is not key=value", (int)len, p);
        size_t klen = (size_t)(eq - p);
        int k = 0;
        while (k < n_keys && (strlen(keys[k].key) != klen || strncmp(keys[k].key, p, klen)))
            k++;
        if (k == n_keys)
            return key_error(f, config, "unknown key '%.*s'", (int)klen, p);
        if (seen >> k & 1)
            return key_error(f, config, "key '%s' is given twice", keys[k].key);
        seen |= (uint64_t)1 << k;
        char val[64];
        size_t vlen = len - klen - 1;
        double v = 0;
        if (vlen >= sizeof val ||
            (memcpy(val, eq + 1, vlen), val[vlen] = '\0', !read_number(val, keys[k].type, &v)))
            return key_error(f, config, "'%.*s' needs %s value", (int)len, p,
                             keys[k].type == FSDP_MODEL_KEY_INT ? "an integer" : "a number");
        if (!(v >= keys[k].min && v <= keys[k].max)) {
            if (keys[k].type == FSDP_MODEL_KEY_INT)
                return key_error(f, config, "%s=%s is out of range; use %.0f..%.0f", keys[k].key,
                                 val, keys[k].min, keys[k].max);
            return key_error(f, config, "%s=%s is out of range; use %g..%g", keys[k].key, val,
                             keys[k].min, keys[k].max);
        }
        vals[k] = v;
        if (!comma)
            break;
        p = comma + 1;
    }
    for (int k = 0; k < n_keys; k++) {
        if (!(seen >> k & 1))
            continue;
        if (keys[k].type == FSDP_MODEL_KEY_INT)
            *(int *)keys[k].dst = (int)vals[k];
        else
            *(double *)keys[k].dst = vals[k];
    }
    return FSDP_STATUS_OK;
}

int fsdp_model_round_vocab(int vocab) { return (vocab + 127) / 128 * 128; }

fsdp_status fsdp_model_check_ints(const char *title, const fsdp_model_int_field *f, int n)
{
    for (int i = 0; i < n; i++)
        if (f[i].v < 1 || f[i].v > f[i].max)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "%s config: %s=%d is out of range; use 1..%d", title, f[i].key,
                                  f[i].v, f[i].max);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_model_check_padded_vocab(const char *title, int vocab, int padded)
{
    if (padded != fsdp_model_round_vocab(vocab))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s config: padded vocab %d is not vocab=%d rounded up to a "
                              "multiple of 128 (%d)",
                              title, padded, vocab, fsdp_model_round_vocab(vocab));
    return FSDP_STATUS_OK;
}
