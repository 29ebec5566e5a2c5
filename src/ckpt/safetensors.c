/*
 * safetensors.c - the safetensors container: header parsing and validation
 * (safetensors.h). Which model a file holds and where its parameters are is
 * safetensors_model.c's business.
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
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/json.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors files are little-endian; add byte swapping for this host");

#define ST_MAX_NAME 256            /* longest tensor name accepted */
#define ST_MAX_INT ((uint64_t)1 << 53)

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

fsdp_status fsdp_st_error(const char *path, const char *fmt, ...)
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
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->meta_key);
    free(f->meta_val);
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
static bool valid_name(const char *s, size_t n)
{
    if (n == 0 || n > ST_MAX_NAME || strlen(s) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

/* The header walk's state (parse_header). */
struct header_walk {
    const char *path;
    char label[FSDP_CKPT_PATH_MAX + 64]; /* "safetensors file '<path>': the header" */
    uint64_t data_bytes;
    fsdp_st_file *f;
    int cap_tensors, cap_key, cap_val; /* allocated entries of f's arrays */
    int n_md;                  /* "__metadata__" members seen */
};

/* Room for one more element in an array of `size`-byte elements that has
 * n of *cap; doubles, so memory stays within twice what is kept. */
static bool grow(void **arr, int n, int *cap, size_t size)
{
    if (n < *cap)
        return true;
    int want = *cap ? 2 * *cap : 16;
    void *p = realloc(*arr, (size_t)want * size);
    if (!p)
        return false;
    *arr = p;
    *cap = want;
    return true;
}

static fsdp_status on_meta_member(void *arg, const char *key, size_t key_len, const char *value,
                                  size_t value_n, size_t offset)
{
    struct header_walk *w = arg;
    fsdp_st_file *f = w->f;
    fsdp_json *v = NULL;
    if (value_n == 0 || value[0] != '"')
        return fsdp_st_error(w->path,
                             "\"__metadata__\" entry \"%.64s\" is a %s; metadata values must be "
                             "strings",
                             key, fsdp_st_json_raw_type(value, value_n));
    FSDP_TRY(fsdp_st_json_value(w->label, key, value, value_n, offset,
                                FSDP_ST_MAX_HEADER_BYTES, &v));
    fsdp_status st = FSDP_STATUS_OK;
    if (strlen(v->str) != v->len || strlen(key) != key_len) {
        st = fsdp_st_error(w->path, "\"__metadata__\" entry \"%.64s\" holds a NUL character",
                           key);
    } else if (!grow((void **)&f->meta_key, f->n_meta, &w->cap_key, sizeof *f->meta_key) ||
               !grow((void **)&f->meta_val, f->n_meta, &w->cap_val, sizeof *f->meta_val)) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", w->path);
    } else {
        int i = f->n_meta;
        f->meta_key[i] = strdup(key);
        f->meta_val[i] = strdup(v->str);
        f->n_meta++;
        if (!f->meta_key[i] || !f->meta_val[i])
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", w->path);
    }
    fsdp_json_free(v);
    return st;
}

/* One tensor's entry: {"dtype": .., "shape": [..], "data_offsets": [b, e]}. */
static fsdp_status parse_tensor(const char *path, const char *name, const fsdp_json *v,
                                uint64_t data_bytes, fsdp_st_tensor *t)
{
    if (v->type != FSDP_JSON_OBJECT)
        return fsdp_st_error(path, "tensor '%.80s' is described by a JSON %s, not an object", name,
                   fsdp_json_type_name(v->type));
    const fsdp_json *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const fsdp_json *e = v->child; e; e = e->next) {
        const fsdp_json **slot = !strcmp(e->key, "dtype")          ? &dtype
                                 : !strcmp(e->key, "shape")        ? &shape
                                 : !strcmp(e->key, "data_offsets") ? &offs
                                                                   : NULL;
        if (!slot)
            return fsdp_st_error(path,
                                 "tensor '%.80s' has an unknown field \"%.32s\" (expected dtype, "
                                 "shape, data_offsets)",
                                 name, e->key);
        if (*slot)
            return fsdp_st_error(path, "tensor '%.80s' has field \"%s\" twice", name, e->key);
        *slot = e;
    }
    if (!dtype || !shape || !offs)
        return fsdp_st_error(path, "tensor '%.80s' lacks its \"%s\"", name,
                   !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
    if (dtype->type != FSDP_JSON_STRING)
        return fsdp_st_error(path, "tensor '%.80s': dtype is not a string", name);
    int k = 0;
    while (k < ST_N_DTYPES && strcmp(dtype->str, st_dtypes[k].name))
        k++;
    if (k == ST_N_DTYPES || strlen(dtype->str) != dtype->len)
        return fsdp_st_error(path, "tensor '%.80s' has unknown dtype \"%.16s\"", name, dtype->str);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", st_dtypes[k].name);
    t->dtype = st_dtypes[k].dt;
    t->elem_bytes = st_dtypes[k].bytes;
    if (shape->type != FSDP_JSON_ARRAY || shape->n > FSDP_ST_MAX_DIMS)
        return fsdp_st_error(path,
                             "tensor '%.80s': shape must be an array of at most %d dimensions",
                             name, FSDP_ST_MAX_DIMS);
    t->ndim = (int)shape->n;
    t->numel = 1;
    int d = 0;
    for (const fsdp_json *e = shape->child; e; e = e->next, d++) {
        if (!json_uint(e, &t->shape[d]))
            return fsdp_st_error(
                path, "tensor '%.80s': shape dimension %d is not an integer in 0..2^53", name, d);
        if (__builtin_mul_overflow(t->numel, t->shape[d], &t->numel))
            return fsdp_st_error(path, "tensor '%.80s': its shape overflows 64 bits", name);
    }
    if (offs->type != FSDP_JSON_ARRAY || offs->n != 2 || !json_uint(offs->child, &t->begin) ||
        !json_uint(offs->child->next, &t->end) || t->end < t->begin)
        return fsdp_st_error(path,
                             "tensor '%.80s': data_offsets must be [begin, end] with integers "
                             "0 <= begin <= end",
                             name);
    uint64_t bytes;
    if (__builtin_mul_overflow(t->numel, (uint64_t)t->elem_bytes, &bytes) ||
        bytes != t->end - t->begin)
        return fsdp_st_error(path,
                             "tensor '%.80s': %s of %" PRIu64 " elements needs %" PRIu64
                             " bytes, but "
                             "its data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64,
                             name, t->dtype_name, t->numel, t->numel * (uint64_t)t->elem_bytes,
                             t->begin, t->end, t->end - t->begin);
    if (t->end > data_bytes)
        return fsdp_st_error(
            path,
            "tensor '%.80s' ends at byte %" PRIu64 " of the data section, which has "
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

/* The largest entry a tensor may have: a name's worth of dtype, 8
 * dimensions and two offsets is a few hundred bytes. */
#define ST_MAX_TENSOR_ENTRY 4096

static fsdp_status on_header_member(void *arg, const char *key, size_t key_len,
                                    const char *value, size_t value_n, size_t offset)
{
    struct header_walk *w = arg;
    fsdp_st_file *f = w->f;
    if (!strcmp(key, "__metadata__") && key_len == 12) {
        if (++w->n_md > 1)
            return fsdp_st_error(w->path, "\"__metadata__\" appears twice");
        if (value[0] != '{')
            return fsdp_st_error(w->path, "\"__metadata__\" is a %s, not an object of strings",
                                 fsdp_st_json_raw_type(value, value_n));
        return fsdp_st_json_members(w->label, value, value_n, on_meta_member, w);
    }
    if (!valid_name(key, key_len))
        return fsdp_st_error(w->path,
                             "a tensor name is empty, longer than %d bytes or holds control "
                             "characters",
                             ST_MAX_NAME);
    fsdp_json *v = NULL;
    FSDP_TRY(fsdp_st_json_value(w->label, key, value, value_n, offset, ST_MAX_TENSOR_ENTRY, &v));
    fsdp_status st;
    if (!grow((void **)&f->tensors, f->n_tensors, &w->cap_tensors, sizeof *f->tensors)) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", w->path);
    } else {
        fsdp_st_tensor *t = &f->tensors[f->n_tensors];
        memset(t, 0, sizeof *t);
        st = parse_tensor(w->path, key, v, w->data_bytes, t);
        if (st == FSDP_STATUS_OK)
            f->n_tensors++;
    }
    fsdp_json_free(v);
    return st;
}

/* Parse header bytes hdr[0..n) of a file of file_bytes bytes. Memory: the
 * tensors and metadata kept, at most twice over (their arrays double), and
 * one entry's tree at a time (safetensors_json.c). */
static fsdp_status parse_header(const char *path, const char *hdr, uint64_t n,
                                uint64_t file_bytes, fsdp_st_file *f)
{
    memset(f, 0, sizeof *f);
    fsdp_status st;
    f->path = strdup(path);
    if (!f->path)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", path);
    f->file_bytes = file_bytes;
    f->data_offset = 8 + n;
    struct header_walk w = {.path = path, .data_bytes = file_bytes - f->data_offset, .f = f};
    uint64_t data_bytes = w.data_bytes;
    if (n == 0 || hdr[0] != '{') {
        st = fsdp_st_error(path,
                           "the header does not start with '{'; this is not a safetensors file");
        goto fail;
    }
    snprintf(w.label, sizeof w.label, "safetensors file '%s': the header", path);
    FSDP_CHECK(fsdp_st_json_members(w.label, hdr, (size_t)n, NULL, NULL));
    FSDP_CHECK(fsdp_st_json_members(w.label, hdr, (size_t)n, on_header_member, &w));
    /* names unique (qsort wants a real array, even of nothing) */
    if (f->n_tensors > 1)
        qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_name);
    for (int i = 1; i < f->n_tensors; i++)
        if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name)) {
            st = fsdp_st_error(path, "tensor '%.80s' appears twice in the header",
                               f->tensors[i].name);
            goto fail;
        }
    /* the tensors tile the data section */
    if (f->n_tensors > 1)
        qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_offset);
    uint64_t at = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const fsdp_st_tensor *t = &f->tensors[i];
        if (t->begin != at) {
            st =
                fsdp_st_error(path,
                              "tensor '%.80s' starts at byte %" PRIu64 " of the data section, but "
                              "the data before it ends at %" PRIu64 " (tensors must not overlap or "
                              "leave gaps); the header is corrupt",
                              t->name, t->begin, at);
            goto fail;
        }
        at = t->end;
    }
    if (at != data_bytes) {
        st = fsdp_st_error(path,
                           "the tensors end at byte %" PRIu64 " of the data section but the file "
                           "holds %" PRIu64 " data bytes; it was modified or is not a safetensors "
                           "file",
                           at, data_bytes);
        goto fail;
    }
    return FSDP_STATUS_OK;
fail:
    fsdp_st_free(f);
    return st;
}

static fsdp_status check_length(const char *path, uint64_t file_bytes, uint64_t n)
{
    if (file_bytes < 8)
        return fsdp_st_error(path,
                             "it is %" PRIu64
                             " bytes, shorter than the 8-byte header length; it is "
                             "truncated or not a safetensors file",
                             file_bytes);
    if (n > FSDP_ST_MAX_HEADER_BYTES || n > file_bytes - 8 || n < 2)
        return fsdp_st_error(
            path,
            "its header length field says %" PRIu64 " bytes, but the file has %" PRIu64
            " bytes after it (and headers are 2 bytes to 100 MiB); it is truncated "
            "or not a safetensors file",
            n, file_bytes - 8);
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
    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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
