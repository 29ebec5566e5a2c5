/*
 * peft.c - PEFT LoRA adapter directories in and out (peft.h).
 *
 * adapter_config.json is small (bounded by FSDP_PEFT_CONFIG_MAX_BYTES) and
 * parsed whole; its keys are checked one by one against what fsdp's LoRA
 * computes (models/lora.h), so that an adapter trained with settings fsdp
 * would silently compute differently is refused instead. The weights file's
 * header is validated by the safetensors reader (safetensors.c); its data
 * is read only by range, when a rank asks for its shard.
 *
 * Assumes the model's adapters are named by models/lora.h's convention
 * (<module path>.lora_A.weight (r, C), <module path>.lora_B.weight (OC, r))
 * and are trainable, so a writer's caller holds them in [0, train_numel).
 * Only that naming and the scale's formula are used from models/lora.h
 * (fsdp_lora_is_adapter, fsdp_lora_scale), not how it builds the adapters.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/hfdir.h"
#include "ckpt/modelfile_internal.h"
#include "ckpt/peft.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "models/lora.h"

#define READ_CHUNK ((size_t)1 << 14) /* elements converted per pread */
#define LORA_A ".lora_A.weight"
#define LORA_B ".lora_B.weight"

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* ---- adapter_config.json ------------------------------------------------------- */

/* FORMAT/UNSUPPORTED "adapter config '<file>': <message>". */
static fsdp_status cfg_error(const fsdp_peft_dir *d, fsdp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static fsdp_status cfg_error(const fsdp_peft_dir *d, fsdp_status st, const char *fmt, ...)
{
    char msg[FSDP_ERROR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fsdp_error_set(st, "adapter config '%s': %s", d->config_path, msg);
}

static bool is_null(const fsdp_json *v) { return !v || v->type == FSDP_JSON_NULL; }

/* A key whose value is "empty" (absent, null, false, 0, "", [] or {}) is the
 * default PEFT computes with; anything else changes the math. */
static bool is_set(const fsdp_json *v)
{
    if (is_null(v))
        return false;
    switch (v->type) {
    case FSDP_JSON_BOOL: return v->boolean;
    case FSDP_JSON_NUMBER: return v->number != 0.0;
    case FSDP_JSON_STRING: return v->len > 0;
    default: return v->n > 0;
    }
}

/* Keys fsdp does not implement: set, each is refused with what to do. */
static const struct {
    const char *key;
    const char *why;
} unsupported_keys[] = {
    {"use_dora", "DoRA (weight-decomposed LoRA) is not implemented: train a plain LoRA adapter"},
    {"fan_in_fan_out", "fsdp's linear weights are stored (out, in), as Llama's nn.Linear; "
                       "fan_in_fan_out adapters (GPT-2's Conv1D) are not supported"},
    {"modules_to_save", "fully trained extra modules beside the adapters are not supported"},
    {"layers_to_transform", "adapters on some layers only are not supported: target every layer"},
    {"layers_pattern", "adapters on some layers only are not supported: target every layer"},
    {"rank_pattern", "a rank per module is not supported: one r for every adapter"},
    {"alpha_pattern", "an alpha per module is not supported: one lora_alpha for every adapter"},
    {"exclude_modules", "excluded modules are not supported: list the targets instead"},
    {"lora_bias", "a bias on lora_B is not supported"},
    {"target_parameters", "adapters on parameters (not modules) are not supported"},
    {"layer_replication", "replicated layers are not supported"},
    {"trainable_token_indices", "training token embeddings beside the adapters is not "
                                "supported"},
    {"use_qalora", "QA-LoRA (quantization-aware pooling) is not supported"},
    {"alora_invocation_tokens", "activated LoRA (aLoRA) is not supported"},
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static const char *last_component(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

/* names[0..n) joined by commas into c->targets, each reduced to its last
 * component and deduplicated (sorted, in place in names) when `by_last`;
 * false when they do not fit. */
static bool join_targets(const char **names, int n, bool by_last, fsdp_lora_config *c)
{
    const char **v = names;
    for (int i = 0; by_last && i < n; i++) /* names is the caller's scratch */
        v[i] = last_component(names[i]);
    if (by_last)
        qsort(v, (size_t)n, sizeof *v, cmp_str);
    size_t k = 0;
    c->targets[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (by_last && i > 0 && !strcmp(v[i], v[i - 1]))
            continue;
        int w = snprintf(c->targets + k, sizeof c->targets - k, "%s%s", k ? "," : "", v[i]);
        if (w < 0 || (size_t)w >= sizeof c->targets - k)
            return false;
        k += (size_t)w;
    }
    return true;
}

/* target_modules: a list of names (a comma list in c->targets) or
 * "all-linear"; any other string is a regular expression PEFT matches
 * against full module paths, which fsdp does not implement. A list of
 * paths too long to keep (PEFT saves "all-linear" as every module's path)
 * is kept as its modules' last components: binding then holds the file's
 * tensors against the model both ways, so a list that named only some
 * layers is refused there, never trained as more. */
static fsdp_status read_targets(fsdp_peft_dir *d, const fsdp_json *v, fsdp_lora_config *c)
{
    if (is_null(v))
        return cfg_error(d, FSDP_STATUS_UNSUPPORTED, "\"target_modules\" is missing or null "
                         "(PEFT would pick defaults for the model type): list the module names, "
                         "e.g. [\"q_proj\", \"v_proj\"], or write \"all-linear\"");
    if (v->type == FSDP_JSON_STRING) {
        const char *s = fsdp_json_name(v);
        if (s && !strcmp(s, "all-linear")) {
            snprintf(c->targets, sizeof c->targets, "all-linear");
            return FSDP_STATUS_OK;
        }
        return cfg_error(d, FSDP_STATUS_UNSUPPORTED, "\"target_modules\" is the string \"%.80s\", "
                         "which PEFT reads as a regular expression; fsdp does not match regular "
                         "expressions: list the module names instead, e.g. [\"q_proj\", "
                         "\"v_proj\"], or write \"all-linear\"", v->str);
    }
    if (v->type != FSDP_JSON_ARRAY || v->n == 0 || v->n > 1 << 16)
        return cfg_error(d, FSDP_STATUS_FORMAT, "\"target_modules\" must be a non-empty list of "
                         "module names or \"all-linear\", not %s %s",
                         v->type == FSDP_JSON_ARRAY ? "an empty" : "a",
                         fsdp_json_type_name(v->type));
    const char **names = malloc(v->n * sizeof *names);
    if (!names)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'",
                              d->config_path);
    int n = 0;
    for (const fsdp_json *e = v->child; e; e = e->next) {
        const char *s = fsdp_json_name(e);
        if (!s || !*s || strchr(s, ',') || strchr(s, ' ') || strlen(s) > 60) {
            free(names);
            return cfg_error(d, FSDP_STATUS_FORMAT, "\"target_modules\" holds %s%.80s%s; each "
                             "entry must be a module name (\"q_proj\", or a path "
                             "\"model.layers.0.self_attn.q_proj\")",
                             s ? "\"" : "a ", s ? s : fsdp_json_type_name(e->type), s ? "\"" : "");
        }
        names[n++] = s;
    }
    d->targets_by_last = !join_targets(names, n, false, c);
    bool fits = !d->targets_by_last || join_targets(names, n, true, c);
    free(names);
    if (!fits)
        return cfg_error(d, FSDP_STATUS_UNSUPPORTED, "\"target_modules\" names more modules "
                         "than the %zu characters fsdp keeps, even by their last components",
                         sizeof c->targets - 1);
    return FSDP_STATUS_OK;
}

/* A number member that must be an integer in [lo, hi]; def when absent. */
static fsdp_status read_int(const fsdp_peft_dir *d, const fsdp_json *root, const char *key,
                            int def, int lo, int hi, int *out)
{
    const fsdp_json *v = fsdp_json_get(root, key);
    if (!v) {
        *out = def;
        return FSDP_STATUS_OK;
    }
    if (v->type != FSDP_JSON_NUMBER || v->number != floor(v->number) || v->number < lo ||
        v->number > hi)
        return cfg_error(d, FSDP_STATUS_FORMAT, "\"%s\" must be an integer in [%d, %d], not %s%s",
                         key, lo, hi, fsdp_json_type_name(v->type),
                         v->type == FSDP_JSON_NUMBER ? " out of range or fractional" : "");
    *out = (int)v->number;
    return FSDP_STATUS_OK;
}

static fsdp_status parse_config(fsdp_peft_dir *d, const fsdp_json *root)
{
    if (root->type != FSDP_JSON_OBJECT)
        return cfg_error(d, FSDP_STATUS_FORMAT, "it holds a JSON %s, not an object",
                         fsdp_json_type_name(root->type));
    const char *type = fsdp_json_name(fsdp_json_get(root, "peft_type"));
    if (!type || strcmp(type, "LORA"))
        return cfg_error(d, FSDP_STATUS_UNSUPPORTED, "\"peft_type\" is %s%.40s%s; fsdp reads "
                         "LoRA adapters only (\"peft_type\": \"LORA\")", type ? "\"" : "",
                         type ? type : "missing", type ? "\"" : "");
    for (size_t i = 0; i < sizeof unsupported_keys / sizeof unsupported_keys[0]; i++)
        if (is_set(fsdp_json_get(root, unsupported_keys[i].key)))
            return cfg_error(d, FSDP_STATUS_UNSUPPORTED, "\"%s\" is set: %s",
                             unsupported_keys[i].key, unsupported_keys[i].why);
    const fsdp_json *v = fsdp_json_get(root, "lora_dropout");
    if (v && !is_null(v) && (v->type != FSDP_JSON_NUMBER || v->number != 0.0))
        return cfg_error(d, FSDP_STATUS_UNSUPPORTED, "\"lora_dropout\" is %s%g: fsdp trains "
                         "LoRA without dropout; set \"lora_dropout\": 0.0 to continue this adapter "
                         "without it", v->type == FSDP_JSON_NUMBER ? "" : "not a number: ",
                         v->type == FSDP_JSON_NUMBER ? v->number : 0.0);
    const char *bias = fsdp_json_name(v = fsdp_json_get(root, "bias"));
    if (v && !is_null(v) && (!bias || strcmp(bias, "none")))
        return cfg_error(d, FSDP_STATUS_UNSUPPORTED, "\"bias\" is %s%.40s%s: fsdp trains the "
                         "adapters only, with the base's biases frozen (\"bias\": \"none\")",
                         bias ? "\"" : "", bias ? bias : fsdp_json_type_name(v->type),
                         bias ? "\"" : "");
    fsdp_lora_config *c = &d->lora;
    memset(c, 0, sizeof *c);
    FSDP_TRY(read_int(d, root, "r", 8, 1, 4096, &c->r)); /* PEFT's defaults: r 8, alpha 8 */
    c->alpha = 8.0;
    if ((v = fsdp_json_get(root, "lora_alpha"))) {
        if (v->type != FSDP_JSON_NUMBER || !(v->number > 0.0) || !isfinite(v->number))
            return cfg_error(d, FSDP_STATUS_FORMAT, "\"lora_alpha\" must be a positive number, "
                             "not %s", fsdp_json_type_name(v->type));
        c->alpha = v->number;
    }
    if ((v = fsdp_json_get(root, "use_rslora")) && !is_null(v)) {
        if (v->type != FSDP_JSON_BOOL)
            return cfg_error(d, FSDP_STATUS_FORMAT, "\"use_rslora\" must be true or false, not "
                             "%s", fsdp_json_type_name(v->type));
        c->rslora = v->boolean;
    }
    FSDP_TRY(read_targets(d, fsdp_json_get(root, "target_modules"), c));
    v = fsdp_json_get(root, "base_model_name_or_path");
    if (v && !is_null(v) && !fsdp_json_name(v))
        return cfg_error(d, FSDP_STATUS_FORMAT, "\"base_model_name_or_path\" must be a string "
                         "or null, not %s", fsdp_json_type_name(v->type));
    if (v && fsdp_json_name(v) &&
        snprintf(d->base, sizeof d->base, "%s", v->str) >= (int)sizeof d->base)
        return cfg_error(d, FSDP_STATUS_FORMAT, "\"base_model_name_or_path\" is longer than "
                         "%zu bytes", sizeof d->base - 1);
    return FSDP_STATUS_OK;
}

/* ---- adapter_model.safetensors: a truncated file, named by tensor -------------- */

struct trunc_walk {
    const char *label;
    uint64_t data_bytes;
    uint64_t first_begin;      /* the earliest tensor whose data the file lacks */
    char name[128];
};

static fsdp_status on_trunc_member(void *arg, const char *key, size_t key_len,
                                   const char *value, size_t value_n, size_t offset)
{
    (void)key_len;
    struct trunc_walk *w = arg;
    if (!strcmp(key, "__metadata__"))
        return FSDP_STATUS_OK;
    fsdp_json *v = NULL;
    FSDP_TRY(fsdp_st_json_value(w->label, key, value, value_n, offset, 4096, &v));
    const fsdp_json *o = fsdp_json_get(v, "data_offsets");
    const fsdp_json *b = fsdp_json_at(o, 0), *e = fsdp_json_at(o, 1);
    if (b && e && b->type == FSDP_JSON_NUMBER && e->type == FSDP_JSON_NUMBER &&
        e->number > (double)w->data_bytes && b->number < (double)w->first_begin) {
        w->first_begin = (uint64_t)b->number;
        snprintf(w->name, sizeof w->name, "%s", key);
    }
    fsdp_json_free(v);
    return FSDP_STATUS_OK;
}

/* After the safetensors reader refused `path`: if its header is whole but
 * the data section is short, extend the message with the first tensor
 * whose data is missing. Any other failure is left as it was. */
static void name_truncated(const char *path, fsdp_status st)
{
    if (st != FSDP_STATUS_FORMAT)
        return;
    char *orig = strdup(fsdp_error_msg());
    int fd = -1;
    uint64_t size = 0, n = 0;
    char *hdr = NULL;
    bool named = false;
    if (!orig || fsdp_open_regular(path, "adapter weights", &fd, &size) != FSDP_STATUS_OK ||
        size < 8 || pread(fd, &n, 8, 0) != 8 || n < 2 || n > size - 8 ||
        n > FSDP_ST_MAX_HEADER_BYTES || !(hdr = malloc((size_t)n)) ||
        fsdp_pread_all(fd, hdr, (size_t)n, 8, "adapter weights", path) != FSDP_STATUS_OK)
        goto done;
    struct trunc_walk w = {.label = path, .data_bytes = size - 8 - n, .first_begin = UINT64_MAX};
    if (fsdp_st_json_members(path, hdr, (size_t)n, on_trunc_member, &w) == FSDP_STATUS_OK &&
        w.name[0]) {
        fsdp_error_set(st, "%s: tensor '%s' is cut off (the data section holds %" PRIu64
                       " bytes); the file is truncated: copy or save the adapter again", orig,
                       w.name, w.data_bytes);
        named = true;
    }
done:
    if (orig && !named) /* what this walk failed on is not the user's problem */
        fsdp_error_copy(orig);
    if (fd >= 0)
        close(fd);
    free(hdr);
    free(orig);
}

/* ---- open, bind, read ---------------------------------------------------------- */

void fsdp_peft_close(fsdp_peft_dir *d)
{
    if (!d)
        return;
    fsdp_st_free(&d->st);
    if (d->fd > 0)
        close(d->fd);
    free(d->unit_base);
    free(d->tensor_of);
    memset(d, 0, sizeof *d);
    d->fd = -1;
}

fsdp_status fsdp_peft_open(const char *dir, fsdp_peft_dir *d)
{
    memset(d, 0, sizeof *d);
    d->fd = -1;
    if (snprintf(d->path, sizeof d->path, "%s", dir) >= (int)sizeof d->path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "adapter path '%.64s...' is too long",
                              dir);
    snprintf(d->config_path, sizeof d->config_path, "%s/" FSDP_PEFT_CONFIG, dir);
    char *text = NULL;
    size_t n = 0;
    fsdp_json *root = NULL;
    fsdp_status st = fsdp_read_file(d->config_path, "adapter config", FSDP_PEFT_CONFIG_MAX_BYTES,
                                    &text, &n);
    if (st == FSDP_STATUS_IO)
        fsdp_error_prefix("'%s' is not a PEFT adapter directory (it needs " FSDP_PEFT_CONFIG
                          " and " FSDP_PEFT_WEIGHTS "):", dir);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_json_parse(text, n, &root);
        if (st == FSDP_STATUS_FORMAT)
            fsdp_error_prefix("adapter config '%s' is not valid JSON:", d->config_path);
    }
    if (st == FSDP_STATUS_OK)
        st = parse_config(d, root);
    fsdp_json_free(root);
    free(text);
    char wpath[FSDP_CKPT_PATH_MAX + 32];
    snprintf(wpath, sizeof wpath, "%s/" FSDP_PEFT_WEIGHTS, dir);
    if (st == FSDP_STATUS_OK) {
        st = fsdp_st_open(wpath, &d->st);
        name_truncated(wpath, st);
    }
    if (st == FSDP_STATUS_OK)
        st = fsdp_open_regular(wpath, "adapter weights", &d->fd, NULL);
    if (st != FSDP_STATUS_OK)
        fsdp_peft_close(d);
    return st;
}

/* The stored tensor named FSDP_PEFT_PREFIX + name, or -1. */
static int find_tensor(const fsdp_st_file *f, const char *name)
{
    size_t k = strlen(FSDP_PEFT_PREFIX);
    for (int i = 0; i < f->n_tensors; i++)
        if (!strncmp(f->tensors[i].name, FSDP_PEFT_PREFIX, k) &&
            !strcmp(f->tensors[i].name + k, name))
            return i;
    return -1;
}

/* Check the stored tensor t against adapter p (r as the config says). */
static fsdp_status check_tensor(const fsdp_peft_dir *d, const fsdp_st_tensor *t,
                                const fsdp_param_spec *p)
{
    const char *path = d->st.path;
    bool is_a = ends_with(p->name, LORA_A);
    if (t->ndim == 2 && (uint64_t)(is_a ? t->shape[0] : t->shape[1]) != (uint64_t)d->lora.r)
        return fsdp_st_error(path, "tensor '%s' has shape [%" PRIu64 ", %" PRIu64 "]: its rank "
                             "is %" PRIu64 " but " FSDP_PEFT_CONFIG " says r = %d", t->name,
                             t->shape[0], t->shape[1], is_a ? t->shape[0] : t->shape[1],
                             d->lora.r);
    if (t->ndim != 2 || t->shape[0] != (uint64_t)p->shape[0] ||
        t->shape[1] != (uint64_t)p->shape[1]) {
        char got[64] = "[";
        for (int k = 0; k < t->ndim; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRIu64, k ? ", " : "",
                     t->shape[k]);
        snprintf(got + strlen(got), sizeof got - strlen(got), "]");
        return fsdp_st_error(path, "tensor '%s' has shape %s; the model's adapter is [%lld, "
                             "%lld] (is it the adapter of another base model?)", t->name, got,
                             (long long)p->shape[0], (long long)p->shape[1]);
    }
    if (t->dtype == FSDP_FILE_OTHER)
        return fsdp_st_error(path, "tensor '%s' has dtype %s; adapters are read from F32, BF16 "
                             "or F16", t->name, t->dtype_name);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_peft_bind(fsdp_peft_dir *d, const fsdp_model *m)
{
    const char *path = d->st.path;
    if (m->lora.r <= 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "the model has no LoRA adapters to read "
                              "from '%s': build it with the directory's config (r %d, "
                              "target_modules %s)", d->path, d->lora.r, d->lora.targets);
    if (m->lora.r != d->lora.r || fsdp_lora_scale(&m->lora) != fsdp_lora_scale(&d->lora))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "adapter '%s' has r %d and scale %g, but "
                              "the model's adapters have r %d, scale %g: build the model from "
                              "the directory's config", d->path, d->lora.r,
                              fsdp_lora_scale(&d->lora), m->lora.r, fsdp_lora_scale(&m->lora));
    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        n += m->units[u].n_params;
    free(d->unit_base);
    free(d->tensor_of);
    d->unit_base = malloc(((size_t)m->n_units + 1) * sizeof *d->unit_base);
    d->tensor_of = malloc(((size_t)n + 1) * sizeof *d->tensor_of);
    bool *used = calloc((size_t)d->st.n_tensors + 1, sizeof *used);
    fsdp_status st = FSDP_STATUS_OK;
    if (!d->unit_base || !d->tensor_of || !used) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory binding adapter '%s'", d->path);
        goto fail;
    }
    int k = 0, n_adapters = 0;
    for (int u = 0; u < m->n_units; u++) {
        d->unit_base[u] = k;
        for (int i = 0; i < m->units[u].n_params; i++, k++) {
            const fsdp_param_spec *p = &m->units[u].params[i];
            d->tensor_of[k] = -1;
            if (!fsdp_lora_is_adapter(p->name))
                continue;
            n_adapters++;
            int t = find_tensor(&d->st, p->name);
            if (t < 0) {
                st = fsdp_st_error(path, "tensor '" FSDP_PEFT_PREFIX "%s' is missing: the model "
                                   "has that adapter (target_modules %s%s)", p->name,
                                   d->lora.targets, d->targets_by_last ?
                                   ", from a list of paths too long to keep, which must then "
                                   "name every layer's modules" : "");
                goto fail;
            }
            FSDP_CHECK(check_tensor(d, &d->st.tensors[t], p));
            d->tensor_of[k] = t;
            used[t] = true;
        }
    }
    d->unit_base[m->n_units] = k;
    if (n_adapters == 0) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "the model has no LoRA adapters to read "
                            "from '%s'", d->path);
        goto fail;
    }
    for (int t = 0; t < d->st.n_tensors; t++)
        if (!used[t]) {
            const char *name = d->st.tensors[t].name;
            bool prefixed = !strncmp(name, FSDP_PEFT_PREFIX, strlen(FSDP_PEFT_PREFIX));
            st = fsdp_st_error(path, "tensor '%s' is not one of the model's adapters (%s%s); "
                               "the file holds %d tensors, the model %d adapters", name,
                               prefixed ? "target_modules " : "PEFT names start with '"
                                                              FSDP_PEFT_PREFIX "', ",
                               prefixed ? d->lora.targets : "this one does not",
                               d->st.n_tensors, n_adapters);
            goto fail;
        }
    d->model = m;
    free(used);
    return FSDP_STATUS_OK;
fail:
    free(used);
    free(d->unit_base);
    free(d->tensor_of);
    d->unit_base = d->tensor_of = NULL;
    return st;
}

fsdp_status fsdp_peft_read(const fsdp_peft_dir *d, int unit, int param, size_t first, size_t n,
                           float *dst)
{
    const fsdp_model *m = d->model;
    FSDP_ASSERT(m && unit >= 0 && unit < m->n_units && param >= 0 &&
                param < m->units[unit].n_params);
    const fsdp_param_spec *p = &m->units[unit].params[param];
    int k = d->tensor_of[d->unit_base[unit] + param];
    if (k < 0 || first > p->numel || n > p->numel - first)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "reading elements [%zu, %zu) of %s from "
                              "adapter '%s': %s", first, first + n, p->name, d->path,
                              k < 0 ? "not an adapter" : "past its end");
    const fsdp_st_tensor *t = &d->st.tensors[k];
    size_t esz = (size_t)t->elem_bytes;
    void *buf = t->dtype == FSDP_FILE_F32 ? NULL : malloc(READ_CHUNK * esz);
    if (t->dtype != FSDP_FILE_F32 && !buf)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", d->st.path);
    fsdp_status st = FSDP_STATUS_OK;
    for (size_t done = 0; done < n && st == FSDP_STATUS_OK;) {
        size_t c = n - done < READ_CHUNK ? n - done : READ_CHUNK;
        uint64_t off = d->st.data_offset + t->begin + (uint64_t)(first + done) * esz;
        void *to = buf ? buf : (void *)(dst + done);
        st = fsdp_pread_all(d->fd, to, c * esz, off, "adapter weights", d->st.path);
        if (st != FSDP_STATUS_OK)
            fsdp_error_prefix("tensor '%s':", t->name);
        else if (buf)
            fsdp_file_dtype_to_f32(t->dtype, buf, c, dst + done);
        done += c;
    }
    free(buf);
    return st;
}

/* ---- writing ------------------------------------------------------------------- */

/* The adapted module paths of m ("model.layers.0.self_attn.q_proj"), malloc'd
 * each, in model order; *n of them. */
static char **adapted_modules(const fsdp_model *m, int *n)
{
    int cap = 0;
    for (int u = 0; u < m->n_units; u++)
        cap += m->units[u].n_params;
    char **v = calloc((size_t)cap + 1, sizeof *v);
    *n = 0;
    for (int u = 0; v && u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const char *name = m->units[u].params[i].name;
            if (ends_with(name, LORA_A))
                v[(*n)++] = strndup(name, strlen(name) - strlen(LORA_A));
        }
    return v;
}

/* How many base modules of m have the last component `last` (a parameter
 * "<...>.<last>.weight" that is not an adapter). */
static int modules_named(const fsdp_model *m, const char *last)
{
    char tail[96];
    snprintf(tail, sizeof tail, ".%s.weight", last);
    int c = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const char *name = m->units[u].params[i].name;
            c += ends_with(name, tail) && !fsdp_lora_is_adapter(name);
        }
    return c;
}

/* adapter_config.json's text into *text (malloc'd), PEFT's keys sorted. */
static fsdp_status config_text(const fsdp_model *m, char **mods, int n_mods, const char *base,
                               char **text, size_t *n)
{
    /* target_modules: a last component covers every module of that name */
    char **names = calloc((size_t)n_mods + 1, sizeof *names);
    int n_names = 0;
    for (int i = 0; names && i < n_mods; i++) {
        const char *last = last_component(mods[i]);
        int have = 0;
        for (int j = 0; j < n_mods; j++)
            have += !strcmp(last_component(mods[j]), last);
        names[n_names++] = have == modules_named(m, last) ? (char *)last : mods[i];
    }
    if (names)
        qsort(names, (size_t)n_names, sizeof *names, cmp_str);
    FILE *f = open_memstream(text, n);
    if (!names || !f) {
        free(names);
        if (f)
            fclose(f);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for " FSDP_PEFT_CONFIG);
    }
    fprintf(f, "{\n  \"alpha_pattern\": {},\n  \"base_model_name_or_path\": ");
    if (base)
        fsdp_json_write_str(f, base);
    else
        fputs("null", f);
    fprintf(f, ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n"
               "  \"inference_mode\": true,\n  \"init_lora_weights\": true,\n"
               "  \"layers_pattern\": null,\n  \"layers_to_transform\": null,\n"
               "  \"lora_alpha\": %.17g,\n  \"lora_dropout\": 0.0,\n"
               "  \"modules_to_save\": null,\n  \"peft_type\": \"LORA\",\n  \"r\": %d,\n"
               "  \"rank_pattern\": {},\n  \"target_modules\": [",
            m->lora.alpha, m->lora.r);
    for (int i = 0, k = 0; i < n_names; i++)
        if (i == 0 || strcmp(names[i], names[i - 1])) {
            fprintf(f, "%s\n    ", k++ ? "," : "");
            fsdp_json_write_str(f, names[i]);
        }
    fprintf(f, "\n  ],\n  \"task_type\": \"CAUSAL_LM\",\n  \"use_dora\": false,\n"
               "  \"use_rslora\": %s\n}\n", m->lora.rslora ? "true" : "false");
    free(names);
    if (fclose(f) != 0)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for " FSDP_PEFT_CONFIG);
    return FSDP_STATUS_OK;
}

/* One adapter to write: its PEFT name and where its fp32 values are. */
struct out_tensor {
    char name[sizeof FSDP_PEFT_PREFIX + 64];
    const fsdp_param_spec *p;
    const float *x;
};

static int cmp_out(const void *a, const void *b)
{
    return strcmp(((const struct out_tensor *)a)->name, ((const struct out_tensor *)b)->name);
}

/* adapter_model.safetensors: o[0..n) (sorted by name) in F32, {"format": "pt"},
 * the header padded with spaces to a multiple of 8, as the reference writer. */
static fsdp_status write_weights(const char *path, const struct out_tensor *o, int n)
{
    fsdp_sbuf h = {0};
    fsdp_sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0;
    for (int k = 0; k < n; k++) {
        uint64_t bytes = (uint64_t)o[k].p->numel * 4;
        fsdp_sbuf_printf(&h, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],"
                         "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", o[k].name,
                         (long long)o[k].p->shape[0], (long long)o[k].p->shape[1], at,
                         at + bytes);
        at += bytes;
    }
    fsdp_sbuf_printf(&h, "}");
    while (h.n % 8)
        fsdp_sbuf_printf(&h, " ");
    if (h.oom) {
        free(h.p);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", path);
    }
    fsdp_atomic_file af = {0};
    fsdp_status st = fsdp_atomic_open(&af, path, "adapter weights");
    if (st == FSDP_STATUS_OK) {
        uint64_t hn = h.n;
        bool ok = fwrite(&hn, 8, 1, af.f) == 1 && fwrite(h.p, 1, h.n, af.f) == h.n;
        for (int k = 0; ok && k < n; k++) /* little-endian hosts: fp32 as stored */
            ok = fwrite(o[k].x, 4, o[k].p->numel, af.f) == o[k].p->numel;
        st = fsdp_atomic_commit(&af, ok);
    }
    fsdp_atomic_abort(&af);
    free(h.p);
    return st;
}

fsdp_status fsdp_peft_write(const char *dir, const fsdp_model *m, const float *const *units,
                            const char *base)
{
    int n_mods = 0, n = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++)
            n += fsdp_lora_is_adapter(m->units[u].params[i].name);
    if (m->lora.r <= 0 || n == 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "model '%s' has no LoRA adapters to write "
                              "to '%s'", m->name, dir);
    struct out_tensor *o = calloc((size_t)n, sizeof *o);
    char **mods = adapted_modules(m, &n_mods);
    char *text = NULL, tmp[FSDP_CKPT_PATH_MAX], p[FSDP_CKPT_PATH_MAX + 32];
    size_t text_n = 0;
    fsdp_status st = FSDP_STATUS_OK;
    if (!o || !mods) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", dir);
        goto done;
    }
    int k = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const fsdp_param_spec *q = &m->units[u].params[i];
            if (!fsdp_lora_is_adapter(q->name))
                continue;
            FSDP_ASSERT(!q->frozen && q->offset + q->numel <= m->units[u].train_numel);
            snprintf(o[k].name, sizeof o[k].name, FSDP_PEFT_PREFIX "%s", q->name);
            o[k].p = q;
            o[k++].x = units[u] + q->offset;
        }
    qsort(o, (size_t)n, sizeof *o, cmp_out);
    st = config_text(m, mods, n_mods, base, &text, &text_n);
    if (st != FSDP_STATUS_OK)
        goto done;
    st = fsdp_dir_write_begin(dir, "adapter directory", tmp, sizeof tmp);
    if (st != FSDP_STATUS_OK)
        goto done;
    snprintf(p, sizeof p, "%s/" FSDP_PEFT_CONFIG, tmp);
    st = fsdp_write_file_sync(p, text, text_n, "adapter config");
    snprintf(p, sizeof p, "%s/" FSDP_PEFT_WEIGHTS, tmp);
    if (st == FSDP_STATUS_OK)
        st = write_weights(p, o, n);
    st = fsdp_dir_write_end(dir, tmp, st);
    if (st == FSDP_STATUS_OK)
        FSDP_INFO(FSDP_SUB_CKPT, "wrote PEFT adapter directory '%s' (r %d, %d tensors, model "
                  "'%s')", dir, m->lora.r, n, m->name);
done:
    for (int i = 0; mods && i < n_mods; i++)
        free(mods[i]);
    free(mods);
    free(text);
    free(o);
    return st;
}

/* ---- the PEFT adapter directory as an output format (modelfile.h) ----------------- */

static fsdp_status peft_format_write(const char *path, const fsdp_model *m,
                                     const float *const *units,
                                     const fsdp_modelfile_write_opts *o)
{
    if (!m->lora.r)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "model '%s' has no LoRA adapters: a PEFT adapter directory holds "
                              "adapters only (convert a checkpoint of a --lora run, or write "
                              "the whole model with --to hf)", m->name);
    if (o && o->dtype != FSDP_DTYPE_F32)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "PEFT adapter directories are written in fp32 (adapters are "
                              "small): leave out --dtype");
    return fsdp_peft_write(path, m, units, o ? o->base : NULL);
}

const fsdp_modelfile_format fsdp_format_peft = {
    /* .short_name = */ "peft",
    /* .name       = */ "PEFT adapter directory",
    /* .help       = */ "a PEFT LoRA adapter directory",
    /* .suffix     = */ NULL, /* a directory */
    /* .bf16       = */ false,
    /* .ships_tokenizer = */ false,
    /* .note       = */ "LoRA adapters only, for peft.PeftModel.from_pretrained",
    /* .claims     = */ NULL,
    /* .open       = */ NULL, /* written only: --adapter DIR reads one (peft.h) */
    /* .bind       = */ NULL,
    /* .read_range = */ NULL,
    /* .close      = */ NULL,
    /* .write      = */ peft_format_write,
};
