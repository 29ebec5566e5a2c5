/*
 * hfdir.c - reading Hugging Face model directories (hfdir.h): config.json,
 * the index of a sharded model, every shard's header, and the format
 * table's entry (the writer is hfdir_write.c).
 *
 * Everything a directory says is checked before a parameter is read:
 * config.json and the index are size-bounded regular files, the index and
 * the shards' headers agree tensor by tensor (no tensor the index does not
 * place, none it places in a file that lacks it), and the tensors are then
 * held against the model built from config.json by the single-file
 * reader's fsdp_st_locate, which names the file of every mismatch.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/bnb4.h"
#include "ckpt/hfdir.h"
#include "ckpt/safetensors.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"

const char *const fsdp_hfdir_companions[] = {
    "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json",
    "generation_config.json", "vocab.json",         "merges.txt",
    "added_tokens.json",   "tokenizer.model",       "chat_template.jinja",
    "chat_template.json",  NULL,
};

#define HF_MAX_ENTRY 4096 /* one index entry's or metadata's value, in bytes */

/* The format's state after open: the parsed shard files. */
typedef struct hf_impl {
    bool bnb4;            /* config.json's quantization_config: bitsandbytes NF4 (bnb4.h) */
    int n_files;
    fsdp_st_file *files;  /* [n_files]: model.safetensors, or the index's files in its order */
} hf_impl;

static bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* dir/name into buf; INVALID_ARG when it does not fit. */
static fsdp_status join(char *buf, size_t n, const char *dir, const char *name)
{
    if (snprintf(buf, n, "%s/%s", dir, name) < (int)n)
        return FSDP_STATUS_OK;
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "path '%.64s.../%s' is too long", dir, name);
}

fsdp_status fsdp_hfdir_read_file(const char *path, size_t max, const char *what, char **buf,
                                 size_t *n)
{
    *buf = NULL;
    *n = 0;
    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open %s '%s': %s", what, path,
                              strerror(errno));
    struct stat sb;
    fsdp_status st = FSDP_STATUS_OK;
    char *b = NULL;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = fsdp_error_set(FSDP_STATUS_IO, "%s '%s' is not a regular file", what, path);
    } else if ((uint64_t)sb.st_size > max) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s '%s' is %" PRIu64 " bytes; more than the "
                            "%zu such a file may have", what, path, (uint64_t)sb.st_size, max);
    } else if (!(b = malloc((size_t)sb.st_size + 1))) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", path);
    } else {
        st = fsdp_pread_all(fd, b, (size_t)sb.st_size, 0, what, path);
    }
    close(fd);
    if (st != FSDP_STATUS_OK) {
        free(b);
        return st;
    }
    b[sb.st_size] = '\0';
    *buf = b;
    *n = (size_t)sb.st_size;
    return FSDP_STATUS_OK;
}

/* ---- config.json ------------------------------------------------------------------ */

/* "gpt2, llama, qwen2": every model_type some family reads. */
static void model_types(char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < fsdp_model_family_count(); i++) {
        const fsdp_safetensors_mapping *map = fsdp_model_family_at(i)->safetensors;
        for (int j = 0; map && map->hf_model_types && map->hf_model_types[j] && k < n; j++)
            k += (size_t)snprintf(buf + k, n - k, "%s%s", k ? ", " : "", map->hf_model_types[j]);
    }
}

static const fsdp_model_family *family_of_type(const char *type)
{
    for (int i = 0; i < fsdp_model_family_count(); i++) {
        const fsdp_model_family *f = fsdp_model_family_at(i);
        const fsdp_safetensors_mapping *map = f->safetensors;
        for (int j = 0; map && map->hf_model_types && map->hf_model_types[j]; j++)
            if (!strcmp(map->hf_model_types[j], type))
                return map->hf_config ? f : NULL;
    }
    return NULL;
}

/* At least one architecture is a causal language model (the weights of
 * *ForSequenceClassification and the like are another network's). */
static fsdp_status check_architectures(const char *label, const fsdp_json *arch)
{
    if (!arch || arch->type == FSDP_JSON_NULL)
        return FSDP_STATUS_OK;
    if (arch->type != FSDP_JSON_ARRAY || arch->n == 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"architectures\" must be a non-empty "
                              "array of class names", label);
    for (const fsdp_json *a = arch->child; a; a = a->next) {
        if (a->type != FSDP_JSON_STRING)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"architectures\" must hold class "
                                  "names (strings)", label);
        size_t n = strlen(a->str);
        if (!fsdp_json_name(a))
            return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"architectures\" holds a name with "
                                  "\\u0000 (a NUL character)", label);
        if ((n > 11 && !strcmp(a->str + n - 11, "ForCausalLM")) ||
            (n > 11 && !strcmp(a->str + n - 11, "LMHeadModel")))
            return FSDP_STATUS_OK;
    }
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "%s: \"architectures\" names \"%.64s\", not a "
                          "causal language model; fsdp reads *ForCausalLM and *LMHeadModel "
                          "checkpoints", label, arch->child->str);
}

/* Take a bitsandbytes 4-bit NF4 "quantization_config" out of root (the
 * directory's concern, not the family's); anything else is refused. */
static fsdp_status take_quantization(const char *label, fsdp_json *root, bool *bnb4)
{
    fsdp_json **at = &root->child;
    while (*at && strcmp((*at)->key, "quantization_config"))
        at = &(*at)->next;
    if (!*at)
        return FSDP_STATUS_OK;
    FSDP_TRY(fsdp_bnb4_check_config(label, *at));
    fsdp_json *qc = *at;
    *at = qc->next;
    qc->next = NULL;
    root->n--;
    fsdp_json_free(qc);
    if (bnb4)
        *bnb4 = true;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_hfdir_parse_config(const char *label, const char *text, size_t n,
                                    const fsdp_model_family **family, char *config,
                                    size_t config_size, bool *bnb4)
{
    *family = NULL;
    if (bnb4)
        *bnb4 = false;
    fsdp_json *root = NULL;
    if (fsdp_json_parse(text, n, &root) != FSDP_STATUS_OK) {
        fsdp_error_prefix("%s is not valid JSON", label);
        return FSDP_STATUS_FORMAT;
    }
    fsdp_status st = FSDP_STATUS_OK;
    char types[256];
    model_types(types, sizeof types);
    const fsdp_json *type = fsdp_json_get(root, "model_type");
    const fsdp_model_family *f = NULL;
    if (root->type != FSDP_JSON_OBJECT) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s is a JSON %s, not an object", label,
                            fsdp_json_type_name(root->type));
    } else if (!fsdp_json_name(type)) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s has no \"model_type\" string%s; fsdp reads "
                            "model types %s", label, type && type->type == FSDP_JSON_STRING
                                                         ? " (it holds \\u0000)" : "", types);
    } else if (!(f = family_of_type(type->str))) {
        st = fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "%s: model_type \"%.64s\" is not one fsdp "
                            "reads (%s)", label, type->str, types);
    } else {
        st = check_architectures(label, fsdp_json_get(root, "architectures"));
    }
    if (st == FSDP_STATUS_OK)
        st = take_quantization(label, root, bnb4);
    if (st == FSDP_STATUS_OK &&
        (st = f->safetensors->hf_config(root, config, config_size)) != FSDP_STATUS_OK)
        fsdp_error_prefix("%s (model_type \"%s\")", label, type->str);
    fsdp_json_free(root);
    if (st == FSDP_STATUS_OK)
        *family = f;
    return st;
}

/* ---- model.safetensors.index.json ---------------------------------------------------- */

/* The index walk's state: entries as read, file names not yet shared. */
struct index_walk {
    const char *label;
    fsdp_hfdir_index *x;
    char **entry_file;     /* [n_tensors] the file name of each entry (owned) */
    int cap;
    bool has_map;
};

/* A file name the index may name: a plain name in the directory. */
static bool plain_safetensors_name(const char *s, size_t len)
{
    if (len < 13 || len > 255 || strlen(s) != len || strcmp(s + len - 12, ".safetensors"))
        return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] == '/' || s[i] == '\\' || (unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return s[0] != '.';
}

static fsdp_status on_weight(void *arg, const char *key, size_t key_len, const char *value,
                             size_t value_n, size_t offset)
{
    struct index_walk *w = arg;
    fsdp_hfdir_index *x = w->x;
    if (key_len == 0 || key_len > 256 || strlen(key) != key_len)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: weight_map has a tensor name that is "
                              "empty, longer than 256 bytes or holds a NUL (byte %zu)", w->label,
                              offset);
    fsdp_json *v = NULL;
    FSDP_TRY(fsdp_st_json_value(w->label, key, value, value_n, offset, HF_MAX_ENTRY, &v));
    fsdp_status st = FSDP_STATUS_OK;
    if (v->type != FSDP_JSON_STRING || !plain_safetensors_name(v->str, v->len)) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s: weight_map places tensor '%.80s' in %s%.80s%s, "
                            "not in a file of the directory named *.safetensors", w->label, key,
                            v->type == FSDP_JSON_STRING ? "'" : "a JSON ",
                            v->type == FSDP_JSON_STRING ? v->str : fsdp_json_type_name(v->type),
                            v->type == FSDP_JSON_STRING ? "'" : "");
    } else if (x->n_tensors >= w->cap) {
        int want = w->cap ? 2 * w->cap : 64;
        char **t = realloc(x->tensors, (size_t)want * sizeof *t);
        if (t)
            x->tensors = t;
        char **f = t ? realloc(w->entry_file, (size_t)want * sizeof *f) : NULL;
        if (f)
            w->entry_file = f;
        if (!t || !f)
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s", w->label);
        else
            w->cap = want;
    }
    if (st == FSDP_STATUS_OK) {
        int i = x->n_tensors;
        x->tensors[i] = strdup(key);
        w->entry_file[i] = strdup(v->str);
        if (x->tensors[i] && w->entry_file[i]) {
            x->n_tensors++;
        } else {
            free(x->tensors[i]);
            free(w->entry_file[i]);
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s", w->label);
        }
    }
    fsdp_json_free(v);
    return st;
}

static fsdp_status on_index_member(void *arg, const char *key, size_t key_len,
                                   const char *value, size_t value_n, size_t offset)
{
    struct index_walk *w = arg;
    (void)key_len;
    if (!strcmp(key, "weight_map")) {
        if (w->has_map)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"weight_map\" appears twice",
                                  w->label);
        w->has_map = true;
        if (value[0] != '{')
            return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"weight_map\" is a JSON %s, not an "
                                  "object of tensor names to file names", w->label,
                                  fsdp_st_json_raw_type(value, value_n));
        return fsdp_st_json_members(w->label, value, value_n, on_weight, w);
    }
    if (!strcmp(key, "metadata")) {
        fsdp_json *md = NULL;
        FSDP_TRY(fsdp_st_json_value(w->label, key, value, value_n, offset, HF_MAX_ENTRY, &md));
        const fsdp_json *ts = fsdp_json_get(md, "total_size");
        fsdp_status st = FSDP_STATUS_OK;
        if (md->type != FSDP_JSON_OBJECT)
            st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"metadata\" is a JSON %s, not an "
                                "object", w->label, fsdp_json_type_name(md->type));
        else if (ts && (ts->type != FSDP_JSON_NUMBER || !(ts->number >= 0) ||
                        ts->number > 9.007199254740992e15))
            st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s: metadata.total_size is not a byte "
                                "count", w->label);
        else if (ts)
            w->x->total_size = (uint64_t)ts->number;
        fsdp_json_free(md);
        return st;
    }
    return FSDP_STATUS_OK; /* other keys: not ours (transformers ignores them too) */
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Entry order by tensor name, carrying each entry's file. */
struct entry {
    char *tensor, *file;
};

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->tensor, ((const struct entry *)b)->tensor);
}

void fsdp_hfdir_index_free(fsdp_hfdir_index *x)
{
    if (!x)
        return;
    for (int i = 0; i < x->n_files; i++)
        free(x->files[i]);
    for (int i = 0; i < x->n_tensors; i++)
        free(x->tensors[i]);
    free(x->files);
    free(x->tensors);
    free(x->file_of);
    memset(x, 0, sizeof *x);
}

/* Sort the entries by tensor name (refusing repeats), and share the file
 * names: x->files sorted and unique, x->file_of per entry. */
static fsdp_status index_finish(struct index_walk *w)
{
    fsdp_hfdir_index *x = w->x;
    int n = x->n_tensors;
    struct entry *e = calloc((size_t)n + 1, sizeof *e);
    char **names = calloc((size_t)n + 1, sizeof *names);
    x->file_of = calloc((size_t)n + 1, sizeof *x->file_of);
    if (!e || !names || !x->file_of) {
        free(e);
        free(names);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s", w->label);
    }
    for (int i = 0; i < n; i++)
        e[i] = (struct entry){x->tensors[i], w->entry_file[i]};
    qsort(e, (size_t)n, sizeof *e, cmp_entry);
    fsdp_status st = FSDP_STATUS_OK;
    for (int i = 0; i < n; i++) {
        x->tensors[i] = e[i].tensor;
        w->entry_file[i] = e[i].file;
        names[i] = e[i].file;
        if (i > 0 && !strcmp(e[i - 1].tensor, e[i].tensor) && st == FSDP_STATUS_OK)
            st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s: tensor '%.80s' appears twice in "
                                "weight_map", w->label, e[i].tensor);
    }
    free(e);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 || strcmp(names[i - 1], names[i]))
            names[k++] = names[i];
    if (st == FSDP_STATUS_OK && k > FSDP_HF_MAX_FILES)
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s names %d files; fsdp reads at most %d",
                            w->label, k, FSDP_HF_MAX_FILES);
    if (st == FSDP_STATUS_OK && !(x->files = calloc((size_t)k + 1, sizeof *x->files)))
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s", w->label);
    for (int i = 0; i < k && st == FSDP_STATUS_OK; i++, x->n_files++)
        if (!(x->files[i] = strdup(names[i])))
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s", w->label);
    for (int i = 0; i < n && st == FSDP_STATUS_OK; i++) {
        char **at = bsearch(&w->entry_file[i], x->files, (size_t)x->n_files, sizeof *x->files,
                            cmp_str);
        x->file_of[i] = (int)(at - x->files);
    }
    free(names);
    return st;
}

fsdp_status fsdp_hfdir_parse_index(const char *label, const char *text, size_t n,
                                   fsdp_hfdir_index *out)
{
    memset(out, 0, sizeof *out);
    struct index_walk w = {.label = label, .x = out};
    fsdp_status st = fsdp_st_json_members(label, text, n, NULL, NULL);
    if (st == FSDP_STATUS_OK)
        st = fsdp_st_json_members(label, text, n, on_index_member, &w);
    if (st == FSDP_STATUS_OK && !w.has_map)
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s has no \"weight_map\"", label);
    if (st == FSDP_STATUS_OK && out->n_tensors == 0)
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"weight_map\" lists no tensors", label);
    if (st == FSDP_STATUS_OK)
        st = index_finish(&w);
    for (int i = 0; i < out->n_tensors; i++)
        free(w.entry_file[i]);
    free(w.entry_file);
    if (st != FSDP_STATUS_OK)
        fsdp_hfdir_index_free(out);
    return st;
}

/* ---- the directory ----------------------------------------------------------------- */

/* Index and headers agree: every tensor of every file is placed in that
 * file by the index, and every entry of the index was found so. */
static fsdp_status check_index(const char *index_path, const fsdp_hfdir_index *x,
                               const fsdp_st_file *files)
{
    int found = 0;
    for (int fi = 0; fi < x->n_files; fi++)
        for (int i = 0; i < files[fi].n_tensors; i++) {
            const char *t = files[fi].tensors[i].name;
            char **at = bsearch(&t, x->tensors, (size_t)x->n_tensors, sizeof *x->tensors,
                                cmp_str);
            if (!at)
                return fsdp_error_set(FSDP_STATUS_FORMAT, "safetensors file '%s' holds tensor "
                                      "'%.80s', which index '%s' does not list", files[fi].path,
                                      t, index_path);
            int e = (int)(at - x->tensors);
            if (x->file_of[e] != fi)
                return fsdp_error_set(FSDP_STATUS_FORMAT, "safetensors file '%s' holds tensor "
                                      "'%.80s', which index '%s' places in '%s'", files[fi].path,
                                      t, index_path, x->files[x->file_of[e]]);
            found++;
        }
    if (found == x->n_tensors)
        return FSDP_STATUS_OK;
    /* some entry was not found in its file: name the first */
    for (int e = 0; e < x->n_tensors; e++) {
        const fsdp_st_file *f = &files[x->file_of[e]];
        bool there = false;
        for (int i = 0; i < f->n_tensors && !there; i++)
            there = !strcmp(f->tensors[i].name, x->tensors[e]);
        if (!there)
            return fsdp_error_set(FSDP_STATUS_FORMAT, "index '%s' places tensor '%.80s' in "
                                  "'%s', which does not hold it", index_path, x->tensors[e],
                                  f->path);
    }
    return FSDP_STATUS_INTERNAL;
}

/* A directory holding config.json or the weights' files. */
static bool hf_claims(const char *path)
{
    static const char *const marks[] = {FSDP_HF_CONFIG, FSDP_HF_WEIGHTS, FSDP_HF_INDEX};
    char p[FSDP_CKPT_PATH_MAX + 64];
    struct stat sb;
    if (!is_dir(path))
        return false;
    for (int i = 0; i < 3; i++)
        if (snprintf(p, sizeof p, "%s/%s", path, marks[i]) < (int)sizeof p && stat(p, &sb) == 0)
            return true;
    return false;
}

bool fsdp_modelfile_tokenizer_of(const char *value, char *buf, size_t n)
{
    return value && hf_claims(value) && snprintf(buf, n, "%s/tokenizer.json", value) < (int)n &&
           is_file(buf);
}

/* The shard files: model.safetensors, else the index's files. */
static fsdp_status open_files(fsdp_modelfile *mf, hf_impl *h)
{
    const char *dir = mf->path;
    char p[FSDP_CKPT_PATH_MAX + 300];
    FSDP_TRY(join(p, sizeof p, dir, FSDP_HF_WEIGHTS));
    struct stat sb;
    if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "Hugging Face directory '%s': %s is a "
                              "directory, not a safetensors file", dir, FSDP_HF_WEIGHTS);
    if (stat(p, &sb) == 0) { /* not a regular file: the reader says what it is */
        if (!(h->files = calloc(1, sizeof *h->files)))
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        FSDP_TRY(fsdp_st_open(p, &h->files[0]));
        h->n_files = 1;
        return FSDP_STATUS_OK;
    }
    char index[FSDP_CKPT_PATH_MAX + 64];
    FSDP_TRY(join(index, sizeof index, dir, FSDP_HF_INDEX));
    if (!is_file(index)) {
        char bin[FSDP_CKPT_PATH_MAX + 32];
        bool pickle = join(bin, sizeof bin, dir, "pytorch_model.bin") == FSDP_STATUS_OK &&
                      is_file(bin);
        snprintf(bin, sizeof bin, "%s/pytorch_model.bin.index.json", dir);
        pickle = pickle || is_file(bin);
        return fsdp_error_set(FSDP_STATUS_FORMAT, "Hugging Face directory '%s' holds neither %s "
                              "nor %s%s", dir, FSDP_HF_WEIGHTS, FSDP_HF_INDEX,
                              pickle ? "; its pytorch_model.bin weights (pickle) are not read: "
                                       "save them with safe_serialization=True" : "");
    }
    char *text = NULL, label[FSDP_CKPT_PATH_MAX + 64];
    size_t n = 0;
    fsdp_hfdir_index x;
    snprintf(label, sizeof label, "index '%s'", index);
    FSDP_TRY(fsdp_hfdir_read_file(index, FSDP_HF_INDEX_MAX_BYTES, "index", &text, &n));
    fsdp_status st = fsdp_hfdir_parse_index(label, text, n, &x);
    free(text);
    if (st != FSDP_STATUS_OK)
        return st;
    if (!(h->files = calloc((size_t)x.n_files, sizeof *h->files)))
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    for (int i = 0; i < x.n_files && st == FSDP_STATUS_OK; i++) {
        if ((st = join(p, sizeof p, dir, x.files[i])) != FSDP_STATUS_OK)
            break;
        if (!is_file(p))
            st = fsdp_error_set(FSDP_STATUS_FORMAT, "index '%s' places tensors in '%s', which "
                                "is not a file of the directory (a download that did not "
                                "finish?)", index, x.files[i]);
        else if ((st = fsdp_st_open(p, &h->files[i])) == FSDP_STATUS_OK)
            h->n_files++;
    }
    if (st == FSDP_STATUS_OK)
        st = check_index(index, &x, h->files);
    fsdp_hfdir_index_free(&x);
    return st;
}

/* An fd for every file, checked to be the file whose header was read. */
static fsdp_status open_parts(fsdp_modelfile *mf, const hf_impl *h)
{
    mf->part_fd = malloc((size_t)h->n_files * sizeof *mf->part_fd);
    mf->part_path = calloc((size_t)h->n_files, sizeof *mf->part_path);
    if (!mf->part_fd || !mf->part_path)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    for (int i = 0; i < h->n_files; i++) {
        const fsdp_st_file *f = &h->files[i];
        mf->part_fd[i] = -1;
        mf->n_parts++;
        if (!(mf->part_path[i] = strdup(f->path)))
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s': %s%s", f->path,
                                  strerror(errno), errno == EMFILE ? " (raise the open-file "
                                  "limit: ulimit -n)" : "");
        mf->part_fd[i] = fd;
        struct stat sb;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
            (uint64_t)sb.st_size != f->file_bytes)
            return fsdp_error_set(FSDP_STATUS_IO, "safetensors file '%s' changed while it was "
                                  "opened", f->path);
    }
    return FSDP_STATUS_OK;
}

static fsdp_status hf_open(fsdp_modelfile *mf, const char *path)
{
    FSDP_TRY(fsdp_modelfile_set_path(mf, path));
    FSDP_TRY(fsdp_modelfile_impl_alloc(mf, sizeof(hf_impl)));
    hf_impl *h = mf->impl;
    char cfg[FSDP_CKPT_PATH_MAX + 16], label[FSDP_CKPT_PATH_MAX + 64], *text = NULL;
    size_t n = 0;
    FSDP_TRY(join(cfg, sizeof cfg, path, FSDP_HF_CONFIG));
    struct stat sb;
    if (lstat(cfg, &sb) != 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "Hugging Face directory '%s' has no "
                              FSDP_HF_CONFIG " (the model's shape and kind): copy it from the "
                              "model's repository", path);
    snprintf(label, sizeof label, "Hugging Face directory '%s': " FSDP_HF_CONFIG, path);
    FSDP_TRY(fsdp_hfdir_read_file(cfg, FSDP_HF_CONFIG_MAX_BYTES, "model config", &text, &n));
    fsdp_status st = fsdp_hfdir_parse_config(label, text, n, &mf->family, mf->config,
                                             sizeof mf->config, &h->bnb4);
    free(text);
    FSDP_TRY(st);
    FSDP_TRY(open_files(mf, h));
    FSDP_TRY(open_parts(mf, h));
    if (h->bnb4)
        FSDP_TRY(fsdp_bnb4_open(&mf->bnb4, h->files, mf->part_fd, h->n_files));
    /* the whole check now, so that a bad directory fails at open */
    fsdp_model m;
    FSDP_TRY(fsdp_modelfile_build("Hugging Face directory", path, mf->family, mf->config, &m));
    int np = 0;
    for (int u = 0; u < m.n_units; u++)
        np += m.units[u].n_params;
    fsdp_tensor_src *src = calloc((size_t)np + 1, sizeof *src);
    snprintf(label, sizeof label, "Hugging Face directory '%s'", path);
    st = src ? fsdp_st_locate_bnb4(h->files, h->n_files, label,
                                   m.family->safetensors->hf_prefix, &m, mf->bnb4, src)
             : fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    if (st == FSDP_STATUS_OK) {
        static const char *const names[] = {"fp32", "bf16", "fp16"};
        static const char *const nf4_names[] = {"nf4+fp32", "nf4+bf16", "nf4+fp16"};
        int first = 0;
        while (first < np && src[first].nf4)
            first++;
        mf->dtype_name = first == np ? "nf4" : mf->bnb4 && mf->bnb4->n
                                                   ? nf4_names[src[first].dtype]
                                                   : names[src[first].dtype];
        for (int k = first + 1; k < np; k++)
            if (!src[k].nf4 && src[k].dtype != src[first].dtype)
                mf->dtype_name = "mixed";
    }
    free(src);
    fsdp_model_free(&m);
    return st;
}

static fsdp_status hf_bind(fsdp_modelfile *mf, const fsdp_model *m)
{
    const hf_impl *h = mf->impl;
    char label[FSDP_CKPT_PATH_MAX + 32];
    snprintf(label, sizeof label, "Hugging Face directory '%s'", mf->path);
    FSDP_TRY(fsdp_flat_prepare(mf, m));
    return fsdp_st_locate_bnb4(h->files, h->n_files, label, m->family->safetensors->hf_prefix,
                               m, mf->bnb4, mf->src);
}

static void hf_close(fsdp_modelfile *mf)
{
    hf_impl *h = mf->impl;
    if (!h)
        return;
    for (int i = 0; i < h->n_files; i++)
        fsdp_st_free(&h->files[i]);
    free(h->files);
    free(h);
    mf->impl = NULL;
}

const fsdp_modelfile_format fsdp_format_hfdir = {
    /* .short_name = */ "hf",
    /* .name       = */ "Hugging Face directory",
    /* .help       = */ "a Hugging Face directory (config.json + *.safetensors)",
    /* .suffix     = */ NULL, /* a directory */
    /* .bf16       = */ true,
    /* .ships_tokenizer = */ true,
    /* .note       = */ NULL,
    /* .claims     = */ hf_claims,
    /* .open       = */ hf_open,
    /* .bind       = */ hf_bind,
    /* .read_range = */ NULL, /* the flat reader, over the shard files */
    /* .close      = */ hf_close,
    /* .write      = */ fsdp_hfdir_write,
};
