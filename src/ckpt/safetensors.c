/*
 * safetensors.c - read and write Hugging Face safetensors files holding
 * GPT-2 weights (the layout and the name mapping are in safetensors.h).
 *
 * The header is hostile input: its length is bounded before anything is
 * allocated, the JSON goes through the strict reader of core/json.h, and
 * every tensor's dtype, shape and byte range are checked against each
 * other and against the file's size in overflow-checked 64-bit arithmetic
 * before any offset is used. The tensors must tile the data section
 * exactly (no gaps, overlaps or trailing bytes), as the reference
 * implementation requires, so a corrupted offset cannot alias two tensors.
 * Numbers in JSON are doubles: integers above 2^53 are refused.
 * Assumes a little-endian host, like the format.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "core/fileio.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors files are little-endian; add byte swapping for this host");

#define ST_MAX_NAME 256            /* longest tensor name accepted */
#define ST_MAX_INT ((uint64_t)1 << 53)
#define ST_CHUNK 65536             /* elements converted per write */

/* ---- dtypes ---------------------------------------------------------------- */

static const struct st_dtype {
    const char *name;
    int bytes;
    fsdp_file_dtype dt;
} st_dtypes[] = {
    {"F32", 4, FSDP_FILE_F32},     {"BF16", 2, FSDP_FILE_BF16},   {"F16", 2, FSDP_FILE_F16},
    {"F64", 8, FSDP_FILE_OTHER},   {"I64", 8, FSDP_FILE_OTHER},   {"U64", 8, FSDP_FILE_OTHER},
    {"I32", 4, FSDP_FILE_OTHER},   {"U32", 4, FSDP_FILE_OTHER},   {"I16", 2, FSDP_FILE_OTHER},
    {"U16", 2, FSDP_FILE_OTHER},   {"I8", 1, FSDP_FILE_OTHER},    {"U8", 1, FSDP_FILE_OTHER},
    {"BOOL", 1, FSDP_FILE_OTHER},  {"F8_E4M3", 1, FSDP_FILE_OTHER},
    {"F8_E5M2", 1, FSDP_FILE_OTHER},
};
#define ST_N_DTYPES ((int)(sizeof st_dtypes / sizeof st_dtypes[0]))

/* ---- errors ---------------------------------------------------------------- */

static fsdp_status bad(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fsdp_status bad(const char *path, const char *fmt, ...)
{
    char msg[FSDP_ERROR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fsdp_error_set(FSDP_STATUS_FORMAT, "safetensors file '%s': %s", path, msg);
}

void fsdp_st_free(fsdp_st_file *f)
{
    if (!f)
        return;
    if (f->tensors)
        for (int i = 0; i < f->n_tensors; i++)
            free(f->tensors[i].name);
    free(f->tensors);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* A JSON number that is an integer in [0, 2^53]. */
static bool json_uint(const fsdp_json *v, uint64_t *out)
{
    if (!v || v->type != FSDP_JSON_NUMBER || !(v->number >= 0) ||
        v->number > (double)ST_MAX_INT || v->number != (double)(uint64_t)v->number)
        return false;
    *out = (uint64_t)v->number;
    return true;
}

/* Tensor names end up in messages and lookups: printable, NUL-free, bounded. */
static bool valid_name(const fsdp_json *key_owner)
{
    const char *s = key_owner->key;
    size_t n = strlen(s);
    if (n == 0 || n > ST_MAX_NAME)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

static fsdp_status parse_metadata(const char *path, const fsdp_json *md, fsdp_st_file *f)
{
    if (md->type != FSDP_JSON_OBJECT)
        return bad(path, "\"__metadata__\" is a %s, not an object of strings",
                   fsdp_json_type_name(md->type));
    for (const fsdp_json *e = md->child; e; e = e->next) {
        if (e->type != FSDP_JSON_STRING)
            return bad(path, "\"__metadata__\" entry \"%.64s\" is a %s; metadata values must be "
                             "strings", e->key, fsdp_json_type_name(e->type));
        if (strcmp(e->key, "n_head"))
            continue;
        char *end = NULL;
        errno = 0;
        long h = strtol(e->str, &end, 10);
        if (errno || end == e->str || *end || strlen(e->str) != e->len || h < 1 || h > 4096)
            return bad(path, "metadata \"n_head\" is \"%.32s\", not a head count in 1..4096",
                       e->str);
        f->n_head = (int)h;
    }
    return FSDP_STATUS_OK;
}

/* One tensor's entry: {"dtype": .., "shape": [..], "data_offsets": [b, e]}. */
static fsdp_status parse_tensor(const char *path, const fsdp_json *v, uint64_t data_bytes,
                                fsdp_st_tensor *t)
{
    const char *name = v->key;
    if (v->type != FSDP_JSON_OBJECT)
        return bad(path, "tensor '%.80s' is described by a %s, not an object", name,
                   fsdp_json_type_name(v->type));
    const fsdp_json *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const fsdp_json *e = v->child; e; e = e->next) {
        const fsdp_json **slot = !strcmp(e->key, "dtype")          ? &dtype
                                 : !strcmp(e->key, "shape")        ? &shape
                                 : !strcmp(e->key, "data_offsets") ? &offs
                                                                   : NULL;
        if (!slot)
            return bad(path, "tensor '%.80s' has an unknown field \"%.32s\" (expected dtype, "
                             "shape, data_offsets)", name, e->key);
        if (*slot)
            return bad(path, "tensor '%.80s' has field \"%s\" twice", name, e->key);
        *slot = e;
    }
    if (!dtype || !shape || !offs)
        return bad(path, "tensor '%.80s' lacks its \"%s\"", name,
                   !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (dtype->type != FSDP_JSON_STRING)
        return bad(path, "tensor '%.80s': dtype is not a string", name);
    int k = 0;
    while (k < ST_N_DTYPES && strcmp(dtype->str, st_dtypes[k].name))
        k++;
    if (k == ST_N_DTYPES || strlen(dtype->str) != dtype->len)
        return bad(path, "tensor '%.80s' has unknown dtype \"%.16s\"", name, dtype->str);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", st_dtypes[k].name);
    t->dtype = st_dtypes[k].dt;
    t->elem_bytes = st_dtypes[k].bytes;
    if (shape->type != FSDP_JSON_ARRAY || shape->n > FSDP_ST_MAX_DIMS)
        return bad(path, "tensor '%.80s': shape must be an array of at most %d dimensions", name,
                   FSDP_ST_MAX_DIMS);
    t->ndim = (int)shape->n;
    t->numel = 1;
    int d = 0;
    for (const fsdp_json *e = shape->child; e; e = e->next, d++) {
        if (!json_uint(e, &t->shape[d]))
            return bad(path, "tensor '%.80s': shape dimension %d is not an integer in 0..2^53",
                       name, d);
        if (__builtin_mul_overflow(t->numel, t->shape[d], &t->numel))
            return bad(path, "tensor '%.80s': its shape overflows 64 bits", name);
    }
    if (offs->type != FSDP_JSON_ARRAY || offs->n != 2 || !json_uint(offs->child, &t->begin) ||
        !json_uint(offs->child->next, &t->end) || t->end < t->begin)
        return bad(path, "tensor '%.80s': data_offsets must be [begin, end] with integers "
                         "0 <= begin <= end", name);
    uint64_t bytes;
    if (__builtin_mul_overflow(t->numel, (uint64_t)t->elem_bytes, &bytes) ||
        bytes != t->end - t->begin)
        return bad(path, "tensor '%.80s': %s of %" PRIu64 " elements needs %" PRIu64 " bytes, but "
                         "its data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64, name,
                   t->dtype_name, t->numel, t->numel * (uint64_t)t->elem_bytes, t->begin,
                   t->end, t->end - t->begin);
    if (t->end > data_bytes)
        return bad(path, "tensor '%.80s' ends at byte %" PRIu64 " of the data section, which has "
                         "only %" PRIu64 " bytes; the file is truncated or its header is corrupt",
                   name, t->end, data_bytes);
    t->name = strdup(name);
    if (!t->name)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", path);
    return FSDP_STATUS_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const fsdp_st_tensor *)a)->name, ((const fsdp_st_tensor *)b)->name);
}

static int cmp_offset(const void *a, const void *b)
{
    const fsdp_st_tensor *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) /* empty tensors first */
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Parse header bytes hdr[0..n) of a file of file_bytes bytes. */
static fsdp_status parse_header(const char *path, const char *hdr, uint64_t n,
                                uint64_t file_bytes, fsdp_st_file *f)
{
    memset(f, 0, sizeof *f);
    fsdp_json *root = NULL;
    fsdp_status st;
    f->path = strdup(path);
    if (!f->path)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", path);
    f->file_bytes = file_bytes;
    f->data_offset = 8 + n;
    uint64_t data_bytes = file_bytes - f->data_offset;
    if (n == 0 || hdr[0] != '{') {
        st = bad(path, "the header does not start with '{'; this is not a safetensors file");
        goto fail;
    }
    if (fsdp_json_parse(hdr, (size_t)n, &root) != FSDP_STATUS_OK) {
        fsdp_error_prefix("safetensors file '%s': the header is not valid JSON", path);
        st = FSDP_STATUS_FORMAT;
        goto fail;
    }
    if (root->type != FSDP_JSON_OBJECT) {
        st = bad(path, "the header is a JSON %s, not an object", fsdp_json_type_name(root->type));
        goto fail;
    }
    size_t n_md = 0;
    for (const fsdp_json *e = root->child; e; e = e->next)
        n_md += !strcmp(e->key, "__metadata__");
    if (n_md > 1) {
        st = bad(path, "\"__metadata__\" appears %zu times", n_md);
        goto fail;
    }
    f->tensors = calloc(root->n - n_md + 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", path);
        goto fail;
    }
    for (const fsdp_json *e = root->child; e; e = e->next) {
        if (!strcmp(e->key, "__metadata__")) {
            FSDP_CHECK(parse_metadata(path, e, f));
            continue;
        }
        if (!valid_name(e)) {
            st = bad(path, "a tensor name is empty, longer than %d bytes or holds control "
                           "characters", ST_MAX_NAME);
            goto fail;
        }
        FSDP_CHECK(parse_tensor(path, e, data_bytes, &f->tensors[f->n_tensors]));
        f->n_tensors++;
    }
    /* names unique */
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_name);
    for (int i = 1; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name)) {
            st = bad(path, "tensor '%.80s' appears twice in the header", f->tensors[i].name);
            goto fail;
        }
    /* the tensors tile the data section */
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_offset);
    uint64_t at = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const fsdp_st_tensor *t = &f->tensors[i];
        if (t->begin != at) {
            st = bad(path, "tensor '%.80s' starts at byte %" PRIu64 " of the data section, but "
                           "the data before it ends at %" PRIu64 " (tensors must not overlap or "
                           "leave gaps); the header is corrupt", t->name, t->begin, at);
            goto fail;
        }
        at = t->end;
    }
    if (at != data_bytes) {
        st = bad(path, "the tensors end at byte %" PRIu64 " of the data section but the file "
                       "holds %" PRIu64 " data bytes; it was modified or is not a safetensors "
                       "file", at, data_bytes);
        goto fail;
    }
    fsdp_json_free(root);
    return FSDP_STATUS_OK;
fail:
    fsdp_json_free(root);
    fsdp_st_free(f);
    return st;
}

static fsdp_status check_length(const char *path, uint64_t file_bytes, uint64_t n)
{
    if (file_bytes < 8)
        return bad(path, "it is %" PRIu64 " bytes, shorter than the 8-byte header length; it is "
                         "truncated or not a safetensors file", file_bytes);
    if (n > FSDP_ST_MAX_HEADER_BYTES || n > file_bytes - 8 || n < 2)
        return bad(path, "its header length field says %" PRIu64 " bytes, but the file has %" PRIu64
                         " bytes after it (and headers are 2 bytes to 100 MiB); it is truncated "
                         "or not a safetensors file", n, file_bytes - 8);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_st_parse_buffer(const char *label, const void *data, size_t n, fsdp_st_file *out)
{
    memset(out, 0, sizeof *out);
    uint64_t hn = 0;
    if (n >= 8)
        memcpy(&hn, data, 8);
    FSDP_TRY(check_length(label, n, hn));
    return parse_header(label, (const char *)data + 8, hn, n, out);
}

fsdp_status fsdp_st_open(const char *path, fsdp_st_file *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open safetensors file '%s': %s", path,
                              strerror(errno));
    fsdp_status st;
    char *hdr = NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = fsdp_error_set(FSDP_STATUS_IO, "safetensors file '%s' is not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size, n = 0;
    if (size >= 8 && pread(fd, &n, 8, 0) != 8) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot read safetensors file '%s': %s", path,
                            strerror(errno));
        goto fail;
    }
    FSDP_CHECK(check_length(path, size, n));
    hdr = malloc((size_t)n);
    if (!hdr) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the %" PRIu64 "-byte header "
                                             "of '%s'", n, path);
        goto fail;
    }
    for (uint64_t got = 0; got < n;) {
        ssize_t k = pread(fd, hdr + got, (size_t)(n - got), (off_t)(8 + got));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot read the header of safetensors file '%s': "
                                                "%s", path, k < 0 ? strerror(errno) : "short read");
            goto fail;
        }
        got += (uint64_t)k;
    }
    st = parse_header(path, hdr, n, size, out);
fail:
    free(hdr);
    close(fd);
    return st;
}

/* ---- the GPT-2 mapping ------------------------------------------------------- */

/* Per-block parameters: HF shape in multiples of C (d1 = 0: a vector);
 * `conv` marks HF Conv1D weights, stored as the transpose of fsdp's. */
static const struct hf_param {
    const char *suffix;
    int d0, d1;
    bool conv;
} hf_block[] = {
    {"ln_1.weight", 1, 0, false},       {"ln_1.bias", 1, 0, false},
    {"attn.c_attn.weight", 1, 3, true}, {"attn.c_attn.bias", 3, 0, false},
    {"attn.c_proj.weight", 1, 1, true}, {"attn.c_proj.bias", 1, 0, false},
    {"ln_2.weight", 1, 0, false},       {"ln_2.bias", 1, 0, false},
    {"mlp.c_fc.weight", 1, 4, true},    {"mlp.c_fc.bias", 4, 0, false},
    {"mlp.c_proj.weight", 4, 1, true},  {"mlp.c_proj.bias", 1, 0, false},
};
#define HF_BLOCK_N ((int)(sizeof hf_block / sizeof hf_block[0]))

enum { ROOT_WTE = 0, ROOT_WPE, ROOT_LNF_W, ROOT_LNF_B, ROOT_N };
static const char *const hf_root[ROOT_N] = {"wte.weight", "wpe.weight", "ln_f.weight",
                                            "ln_f.bias"};

/* What a tensor name denotes. */
typedef struct hf_name {
    enum { HF_ROOT, HF_BLOCK, HF_IGNORED, HF_UNKNOWN } kind;
    int index;   /* HF_ROOT: ROOT_*; HF_BLOCK: into hf_block */
    int layer;   /* HF_BLOCK */
} hf_name;

/* Strip the optional "transformer." prefix. */
static const char *canonical(const char *name)
{
    return strncmp(name, "transformer.", 12) ? name : name + 12;
}

static hf_name classify(const char *full)
{
    const char *s = canonical(full);
    hf_name r = {.kind = HF_UNKNOWN};
    if (!strcmp(full, "lm_head.weight"))
        return (hf_name){.kind = HF_IGNORED};
    for (int i = 0; i < ROOT_N; i++)
        if (!strcmp(s, hf_root[i]))
            return (hf_name){.kind = HF_ROOT, .index = i};
    if (strncmp(s, "h.", 2))
        return r;
    s += 2;
    /* layer index: decimal, no leading zeros, < 4096 */
    int l = 0, digits = 0;
    while (*s >= '0' && *s <= '9' && digits < 5) {
        l = l * 10 + (*s++ - '0');
        digits++;
    }
    if (digits == 0 || digits > 4 || (digits > 1 && s[-digits] == '0') || l >= 4096 || *s != '.')
        return r;
    s++;
    if (!strcmp(s, "attn.bias") || !strcmp(s, "attn.masked_bias"))
        return (hf_name){.kind = HF_IGNORED, .layer = l};
    for (int i = 0; i < HF_BLOCK_N; i++)
        if (!strcmp(s, hf_block[i].suffix))
            return (hf_name){.kind = HF_BLOCK, .index = i, .layer = l};
    return r;
}

/* Expected HF shape of a tensor for cfg: ndim and dims. */
static int expected_shape(hf_name h, const fsdp_gpt2_config *c, uint64_t *d)
{
    uint64_t C = (uint64_t)c->n_embd;
    if (h.kind == HF_ROOT) {
        switch (h.index) {
        case ROOT_WTE: d[0] = (uint64_t)c->vocab_size; d[1] = C; return 2;
        case ROOT_WPE: d[0] = (uint64_t)c->max_seq_len; d[1] = C; return 2;
        default: d[0] = C; return 1;
        }
    }
    const struct hf_param *p = &hf_block[h.index];
    d[0] = (uint64_t)p->d0 * C;
    d[1] = (uint64_t)p->d1 * C;
    return p->d1 ? 2 : 1;
}

static void fmt_shape(char *buf, size_t n, int ndim, const uint64_t *d)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRIu64, i ? ", " : "", d[i]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

fsdp_status fsdp_st_gpt2_config(const fsdp_st_file *f, fsdp_gpt2_config *cfg)
{
    const char *path = f->path;
    const fsdp_st_tensor *root[ROOT_N] = {NULL};
    int max_layer = -1;
    for (int i = 0; i < f->n_tensors; i++) {
        const fsdp_st_tensor *t = &f->tensors[i];
        hf_name h = classify(t->name);
        if (h.kind == HF_UNKNOWN)
            return bad(path, "tensor '%.80s' is not a GPT-2 parameter (expected Hugging Face "
                             "GPT-2 names such as 'wte.weight' or 'h.0.attn.c_attn.weight')",
                       t->name);
        if (h.kind == HF_ROOT) {
            if (root[h.index])
                return bad(path, "tensors '%.80s' and '%.80s' are both '%s'", root[h.index]->name,
                           t->name, hf_root[h.index]);
            root[h.index] = t;
        }
        if (h.kind == HF_BLOCK && h.layer > max_layer)
            max_layer = h.layer;
    }
    for (int i = 0; i < ROOT_N; i++)
        if (!root[i])
            return bad(path, "tensor '%s' is missing; this is not a complete GPT-2", hf_root[i]);
    const fsdp_st_tensor *wte = root[ROOT_WTE], *wpe = root[ROOT_WPE];
    if (wte->ndim != 2 || wpe->ndim != 2 || wte->shape[1] != wpe->shape[1])
        return bad(path, "'%.80s' and '%.80s' must be matrices (vocab, channels) and (context, "
                         "channels) with the same channels", wte->name, wpe->name);
    if (max_layer < 0)
        return bad(path, "it holds no transformer blocks (no 'h.0.*' tensors)");
    uint64_t C = wte->shape[1];
    fsdp_gpt2_config c = {
        .n_layer = max_layer + 1,
        .n_embd = C <= 65536 ? (int)C : 0,
        .vocab_size = wte->shape[0] <= (1u << 24) ? (int)wte->shape[0] : 0,
        .max_seq_len = wpe->shape[0] <= (1u << 20) ? (int)wpe->shape[0] : 0,
    };
    c.padded_vocab_size = (c.vocab_size + 127) / 128 * 128;
    if (f->n_head)
        c.n_head = f->n_head;
    else if (C % 64 == 0 && C > 0)
        c.n_head = (int)(C / 64);
    else
        return bad(path, "cannot tell the number of attention heads: the header has no "
                         "\"n_head\" in \"__metadata__\" and channels=%" PRIu64 " is not a "
                         "multiple of 64; add \"n_head\": \"<heads>\" to \"__metadata__\"", C);
    if (fsdp_gpt2_config_validate(&c) != FSDP_STATUS_OK) {
        fsdp_error_prefix("safetensors file '%s' describes a GPT-2 fsdp cannot build (vocab "
                          "%" PRIu64 ", context %" PRIu64 ", channels %" PRIu64 ")",
                          path, wte->shape[0], wpe->shape[0], C);
        return FSDP_STATUS_FORMAT;
    }
    /* every tensor's shape and dtype; every parameter present once */
    size_t n_block = (size_t)c.n_layer * HF_BLOCK_N;
    const fsdp_st_tensor **seen = calloc(n_block + 1, sizeof *seen);
    if (!seen)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory checking '%s'", path);
    fsdp_status st = FSDP_STATUS_OK;
    for (int i = 0; i < f->n_tensors && st == FSDP_STATUS_OK; i++) {
        const fsdp_st_tensor *t = &f->tensors[i];
        hf_name h = classify(t->name);
        if (h.kind == HF_IGNORED)
            continue;
        if (h.kind == HF_BLOCK) {
            const fsdp_st_tensor **slot = &seen[(size_t)h.layer * HF_BLOCK_N + (size_t)h.index];
            if (*slot) {
                st = bad(path, "tensors '%.80s' and '%.80s' are the same parameter", (*slot)->name,
                         t->name);
                break;
            }
            *slot = t;
        }
        uint64_t d[2];
        int nd = expected_shape(h, &c, d);
        bool same = t->ndim == nd;
        for (int k = 0; same && k < nd; k++)
            same = t->shape[k] == d[k];
        if (!same) {
            char a[128], b[64];
            fmt_shape(a, sizeof a, t->ndim, t->shape);
            fmt_shape(b, sizeof b, nd, d);
            st = bad(path, "tensor '%.80s' has shape %s, but a GPT-2 with channels=%d, vocab=%d, "
                           "context=%d needs %s", t->name, a, c.n_embd, c.vocab_size,
                     c.max_seq_len, b);
            break;
        }
        if (t->dtype == FSDP_FILE_OTHER) {
            st = bad(path, "tensor '%.80s' is %s; fsdp imports F32, BF16 and F16 weights",
                     t->name, t->dtype_name);
            break;
        }
    }
    for (size_t k = 0; k < n_block && st == FSDP_STATUS_OK; k++)
        if (!seen[k])
            st = bad(path, "tensor 'h.%zu.%s' is missing (the file has blocks up to h.%d)",
                     k / HF_BLOCK_N, hf_block[k % HF_BLOCK_N].suffix, c.n_layer - 1);
    free(seen);
    if (st == FSDP_STATUS_OK)
        *cfg = c;
    return st;
}

static bool config_equal(const fsdp_gpt2_config *a, const fsdp_gpt2_config *b)
{
    return a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->vocab_size == b->vocab_size && a->padded_vocab_size == b->padded_vocab_size &&
           a->max_seq_len == b->max_seq_len;
}

fsdp_status fsdp_st_gpt2_locate(const fsdp_st_file *f, const fsdp_model *m, fsdp_tensor_src *src)
{
    fsdp_gpt2_config fc;
    FSDP_TRY(fsdp_st_gpt2_config(f, &fc));
    const fsdp_gpt2_config *mc = fsdp_gpt2_config_of(m);
    if (!mc || !config_equal(&fc, mc))
        return bad(f->path, "it holds L=%d NH=%d C=%d V=%d maxT=%d but the model is '%s'; build "
                            "the model from the file's config", fc.n_layer, fc.n_head, fc.n_embd,
                   fc.vocab_size, fc.max_seq_len, m->name);
    int *base = calloc((size_t)m->n_units + 1, sizeof *base);
    char *filled = NULL;
    if (!base)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    int n_params = 0;
    for (int u = 0; u < m->n_units; u++) {
        base[u] = n_params;
        n_params += m->units[u].n_params;
    }
    filled = calloc((size_t)n_params + 1, 1);
    fsdp_status st = FSDP_STATUS_OK;
    if (!filled) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        goto done;
    }
    for (int i = 0; i < f->n_tensors; i++) {
        const fsdp_st_tensor *t = &f->tensors[i];
        hf_name h = classify(t->name);
        if (h.kind == HF_IGNORED)
            continue;
        int unit = -1;
        const fsdp_param_spec *p = fsdp_model_find_param(m, canonical(t->name), &unit);
        if (!p || p->numel < t->numel) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "model '%s' has no parameter for tensor "
                                "'%.80s' of '%s'", m->name, t->name, f->path);
            goto done;
        }
        int k = base[unit] + (int)(p - m->units[unit].params);
        bool conv = h.kind == HF_BLOCK && hf_block[h.index].conv;
        src[k] = (fsdp_tensor_src){
            .offset = f->data_offset + t->begin,
            .dtype = t->dtype,
            .file_numel = t->numel,
            .transposed = conv,
            .rows = (uint64_t)p->shape[0],
            .cols = p->ndim == 2 ? (uint64_t)p->shape[1] : 1,
        };
        filled[k] = 1;
    }
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++)
            if (!filled[base[u] + i]) {
                st = bad(f->path, "it has no tensor for parameter '%s'",
                         m->units[u].params[i].name);
                goto done;
            }
done:
    free(filled);
    free(base);
    return st;
}

/* ---- write ------------------------------------------------------------------- */

/* Writes n fp32 values as dt into f, converting through buf (ST_CHUNK). */
static bool put_values(FILE *f, const float *x, size_t n, fsdp_dtype dt, uint16_t *buf)
{
    if (dt == FSDP_DTYPE_F32)
        return fwrite(x, 4, n, f) == n;
    while (n > 0) {
        size_t k = n < ST_CHUNK ? n : ST_CHUNK;
        for (size_t i = 0; i < k; i++)
            buf[i] = fsdp_f32_to_bf16(x[i]);
        if (fwrite(buf, 2, k, f) != k)
            return false;
        x += k;
        n -= k;
    }
    return true;
}

fsdp_status fsdp_st_write(const char *path, const fsdp_model *m, const float *const *units,
                          fsdp_dtype dt)
{
    const fsdp_gpt2_config *c = m ? fsdp_gpt2_config_of(m) : NULL;
    if (!path || !units || !c)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "safetensors export of '%s' needs a GPT-2 model and its units",
                              path ? path : "(null)");
    if (dt != FSDP_DTYPE_F32 && dt != FSDP_DTYPE_BF16)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "safetensors export writes F32 or BF16, not dtype %d", (int)dt);
    size_t esz = fsdp_dtype_size(dt);
    const char *dname = dt == FSDP_DTYPE_F32 ? "F32" : "BF16";
    int V = c->vocab_size, C = c->n_embd;

    /* header: metadata, then the parameters in model order */
    fsdp_sbuf h = {0};
    fsdp_sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\",\"n_head\":\"%d\",\"n_layer\":\"%d\","
                  "\"n_embd\":\"%d\",\"n_ctx\":\"%d\",\"vocab_size\":\"%d\"}",
              c->n_head, c->n_layer, c->n_embd, c->max_seq_len, V);
    uint64_t at = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const fsdp_param_spec *p = &m->units[u].params[i];
            hf_name hn = classify(p->name);
            uint64_t d[2];
            int nd = expected_shape(hn, c, d);
            uint64_t numel = nd == 2 ? d[0] * d[1] : d[0];
            fsdp_sbuf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%" PRIu64, p->name, dname, d[0]);
            if (nd == 2)
                fsdp_sbuf_printf(&h, ",%" PRIu64, d[1]);
            fsdp_sbuf_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at, at + numel * esz);
            at += numel * esz;
        }
    fsdp_sbuf_printf(&h, "}");
    while (!h.oom && h.n % 8) /* pad with spaces so the data section is 8-aligned */
        fsdp_sbuf_printf(&h, " ");
    if (h.oom) {
        free(h.p);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", path);
    }

    fsdp_status st = FSDP_STATUS_OK;
    fsdp_atomic_file af = {0};
    uint16_t *buf = malloc(ST_CHUNK * sizeof *buf);
    float *row = malloc((size_t)4 * C * sizeof *row);
    if (!buf || !row) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", path);
        goto fail;
    }
    FSDP_CHECK(fsdp_atomic_open(&af, path, "safetensors file"));
    FILE *f = af.f;
    uint64_t hn = h.n;
    bool ok = fwrite(&hn, 8, 1, f) == 1 && fwrite(h.p, 1, h.n, f) == h.n;
    for (int u = 0; ok && u < m->n_units; u++)
        for (int i = 0; ok && i < m->units[u].n_params; i++) {
            const fsdp_param_spec *p = &m->units[u].params[i];
            const float *x = units[u] + p->offset;
            hf_name hn2 = classify(p->name);
            if (hn2.kind == HF_BLOCK && hf_block[hn2.index].conv) {
                /* fsdp (OC, IC) -> HF (IC, OC): one HF row at a time */
                size_t OC = (size_t)p->shape[0], IC = (size_t)p->shape[1];
                for (size_t k = 0; ok && k < IC; k++) {
                    for (size_t o = 0; o < OC; o++)
                        row[o] = x[o * IC + k];
                    ok = put_values(f, row, OC, dt, buf);
                }
            } else {
                /* wte: only the V real rows */
                size_t n = hn2.kind == HF_ROOT && hn2.index == ROOT_WTE ? (size_t)V * C : p->numel;
                ok = put_values(f, x, n, dt, buf);
            }
        }
    FSDP_CHECK(fsdp_atomic_commit(&af, ok));
    FSDP_INFO(FSDP_SUB_CKPT, "wrote '%s' (%s, %zu parameters) from model '%s'", path, dname,
              m->numel, m->name);
fail:
    fsdp_atomic_abort(&af);
    free(row);
    free(buf);
    free(h.p);
    return st;
}
