/*
 * bnb4.c - reading Hugging Face bnb-4bit directories (bnb4.h): the
 * quantization_config check, every quantized weight's six tensors found
 * and validated at open, and range reads of codes, absmax and dequantized
 * values.
 *
 * Assumes the shard files' headers are valid (safetensors.c) and open
 * (mf->part_fd); a weight's tensors may lie in different shard files.
 * Values are bitsandbytes' flat dequantization (the format, and its GPU
 * path, are flat; its CPU path given a 2-D shape maps blocks row by row).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/bnb4.h"
#include "core/fileio.h"
#include "core/json.h"
#include "ops/nf4.h"

#define BNB4_CHUNK_BLOCKS 1024 /* blocks dequantized per step of a range read */

/* ---- config.json ------------------------------------------------------------------ */

static bool json_true(const fsdp_json *v) { return v && v->type == FSDP_JSON_BOOL && v->boolean; }

/* A string value for messages: "\"fp4\"", or "missing" (not a string). */
static const char *quoted(const fsdp_json *v, char *buf, size_t n)
{
    if (fsdp_json_name(v))
        snprintf(buf, n, "\"%.32s\"", v->str);
    else
        snprintf(buf, n, "missing");
    return buf;
}

fsdp_status fsdp_bnb4_check_config(const char *label, const fsdp_json *qc)
{
    const char *want = "fsdp reads bitsandbytes 4-bit NF4 checkpoints with double quantization "
                       "(BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", "
                       "bnb_4bit_use_double_quant=True)); quantize the model's bf16 release "
                       "with `fsdp convert IN OUT --to hf --quantize nf4`";
    if (qc->type != FSDP_JSON_OBJECT)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: \"quantization_config\" is a JSON %s, "
                              "not an object; %s", label, fsdp_json_type_name(qc->type), want);
    const fsdp_json *method = fsdp_json_get(qc, "quant_method");
    char q[48];
    if (!fsdp_json_name(method) || strcmp(method->str, "bitsandbytes"))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: quantized checkpoint with "
                              "quantization_config.quant_method %s; %s", label,
                              quoted(method, q, sizeof q), want);
    if (json_true(fsdp_json_get(qc, "load_in_8bit")))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: quantization_config is 8-bit "
                              "(load_in_8bit: LLM.int8()); %s", label, want);
    if (!json_true(fsdp_json_get(qc, "load_in_4bit")))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: quantization_config.load_in_4bit is not "
                              "true; %s", label, want);
    const fsdp_json *type = fsdp_json_get(qc, "bnb_4bit_quant_type");
    if (!fsdp_json_name(type) || strcmp(type->str, "nf4"))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: quantization_config.bnb_4bit_quant_type "
                              "is %s, not \"nf4\"; %s", label, quoted(type, q, sizeof q), want);
    if (!json_true(fsdp_json_get(qc, "bnb_4bit_use_double_quant")))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: quantization_config."
                              "bnb_4bit_use_double_quant is not true (no double quantization: "
                              "fp32 absmax); %s", label, want);
    const fsdp_json *storage = fsdp_json_get(qc, "bnb_4bit_quant_storage");
    if (storage && (!fsdp_json_name(storage) || strcmp(storage->str, "uint8")))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "%s: quantization_config."
                              "bnb_4bit_quant_storage is not \"uint8\"; %s", label, want);
    return FSDP_STATUS_OK;
}

/* ---- finding the tensors ------------------------------------------------------------ */

/* Every tensor of the files, sorted by name, for lookups. */
typedef struct tref {
    const char *name;
    int file;
    const fsdp_st_tensor *t;
} tref;

static int cmp_tref(const void *a, const void *b)
{
    return strcmp(((const tref *)a)->name, ((const tref *)b)->name);
}

static const tref *find(const tref *all, int n, const char *name)
{
    tref key = {.name = name};
    return bsearch(&key, all, (size_t)n, sizeof *all, cmp_tref);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The parts of one weight besides its quant_state. */
enum { P_CODES, P_ABSMAX, P_QMAP, P_NESTED, P_NMAP, P_COUNT };
static const char *const part_suffix[P_COUNT] = {"", ".absmax", ".quant_map", ".nested_absmax",
                                                 ".nested_quant_map"};

/* Bytes of tensor r into buf (exactly its data). */
static fsdp_status read_tensor(const fsdp_st_file *files, const int *fds, const tref *r, void *buf)
{
    const fsdp_st_file *f = &files[r->file];
    return fsdp_pread_all(fds[r->file], buf, (size_t)(r->t->end - r->t->begin),
                          f->data_offset + r->t->begin, "safetensors file", f->path);
}

/* Check the quant_state JSON of weight w (text[0..n)) and fill w's shape. */
static fsdp_status check_state(const char *path, const char *sname, const char *text, size_t n,
                               fsdp_bnb4_tensor *w)
{
    fsdp_json *js = NULL;
    if (fsdp_json_parse(text, n, &js) != FSDP_STATUS_OK) {
        fsdp_error_prefix("safetensors file '%s': tensor '%.80s' is not valid JSON", path, sname);
        return FSDP_STATUS_FORMAT;
    }
    fsdp_status st = FSDP_STATUS_OK;
    char q[48];
    const fsdp_json *qt = fsdp_json_get(js, "quant_type"), *bs = fsdp_json_get(js, "blocksize");
    const fsdp_json *dt = fsdp_json_get(js, "dtype"), *shape = fsdp_json_get(js, "shape");
    const fsdp_json *nbs = fsdp_json_get(js, "nested_blocksize");
    const fsdp_json *ndt = fsdp_json_get(js, "nested_dtype");
    const fsdp_json *off = fsdp_json_get(js, "nested_offset");
#define BAD(...) (st = fsdp_st_error(path, __VA_ARGS__))
    if (js->type != FSDP_JSON_OBJECT)
        BAD("tensor '%.80s' is a JSON %s, not an object", sname, fsdp_json_type_name(js->type));
    else if (!fsdp_json_name(qt) || strcmp(qt->str, "nf4"))
        BAD("tensor '%.80s': quant_type is %s, not \"nf4\"; fsdp reads NF4 weights only", sname,
            quoted(qt, q, sizeof q));
    else if (!bs || bs->type != FSDP_JSON_NUMBER || bs->number != FSDP_NF4_BLOCK)
        BAD("tensor '%.80s': blocksize is not %d", sname, FSDP_NF4_BLOCK);
    else if (!off || !nbs)
        BAD("tensor '%.80s' has no nested_offset / nested_blocksize: a weight without double "
            "quantization (fsdp reads bnb_4bit_use_double_quant=True checkpoints)", sname);
    else if (nbs->type != FSDP_JSON_NUMBER || nbs->number != FSDP_NF4_NESTED)
        BAD("tensor '%.80s': nested_blocksize is not %d", sname, FSDP_NF4_NESTED);
    else if (!fsdp_json_name(ndt) || strcmp(ndt->str, "float32"))
        BAD("tensor '%.80s': nested_dtype is not \"float32\"", sname);
    else if (off->type != FSDP_JSON_NUMBER || !isfinite((float)off->number))
        BAD("tensor '%.80s': nested_offset is not a finite number", sname);
    else if (!fsdp_json_name(dt) || (strcmp(dt->str, "bfloat16") && strcmp(dt->str, "float16") &&
                                     strcmp(dt->str, "float32")))
        BAD("tensor '%.80s': dtype is not \"bfloat16\", \"float16\" or \"float32\"", sname);
    else if (!shape || shape->type != FSDP_JSON_ARRAY || shape->n < 1 ||
             shape->n > FSDP_ST_MAX_DIMS)
        BAD("tensor '%.80s': shape is not an array of 1 to %d sizes", sname, FSDP_ST_MAX_DIMS);
    if (st == FSDP_STATUS_OK) {
        w->numel = 1;
        w->ndim = (int)shape->n;
        for (int d = 0; d < w->ndim && st == FSDP_STATUS_OK; d++) {
            const fsdp_json *s = fsdp_json_at(shape, (size_t)d);
            if (!s || s->type != FSDP_JSON_NUMBER || !(s->number >= 1) || s->number > 4e9 ||
                s->number != floor(s->number) || w->numel > ((uint64_t)1 << 40))
                BAD("tensor '%.80s': shape entry %d is not a size", sname, d);
            else
                w->numel *= (w->shape[d] = (uint64_t)s->number);
        }
        w->offset = (float)off->number;
        snprintf(w->dtype, sizeof w->dtype, "%s", dt->str);
        w->n_blocks = fsdp_nf4_blocks(w->numel);
    }
#undef BAD
    fsdp_json_free(js);
    return st;
}

static fsdp_status check_part(const char *path, const fsdp_bnb4_tensor *w, int k, const tref *r,
                              const char *name)
{
    static const char *const dtypes[P_COUNT] = {"U8", "U8", "F32", "F32", "F32"};
    uint64_t want[P_COUNT] = {(w->numel + 1) / 2, w->n_blocks, 16,
                              fsdp_nf4_nested_blocks(w->n_blocks), 256};
    if (!r)
        return fsdp_st_error(path, "tensor '%.80s' is missing (its weight has '%s%s')", name,
                             w->name, FSDP_BNB4_STATE_SUFFIX);
    if (strcmp(r->t->dtype_name, dtypes[k]))
        return fsdp_st_error(path, "tensor '%.80s' is %s, not %s%s", name, r->t->dtype_name,
                             dtypes[k], k == P_ABSMAX && !strcmp(r->t->dtype_name, "F32")
                                            ? " (a weight without double quantization)" : "");
    if (r->t->numel != want[k])
        return fsdp_st_error(path, "tensor '%.80s' holds %llu %s; its quant_state (shape of "
                             "%llu elements, blocks of %d) needs %llu", name,
                             (unsigned long long)r->t->numel,
                             k == P_CODES ? "code bytes" : k == P_ABSMAX ? "absmax codes"
                                                                         : "values",
                             (unsigned long long)w->numel, FSDP_NF4_BLOCK,
                             (unsigned long long)want[k]);
    return FSDP_STATUS_OK;
}

/* The small tensors' values: the maps are ops/nf4.c's tables, nested absmax finite. */
static fsdp_status check_values(const fsdp_st_file *files, const int *fds, const tref *r[],
                                fsdp_bnb4_tensor *w)
{
    float map[256];
    const char *path = files[r[P_QMAP]->file].path;
    FSDP_TRY(read_tensor(files, fds, r[P_QMAP], map));
    if (memcmp(map, fsdp_nf4_code, sizeof fsdp_nf4_code))
        return fsdp_st_error(path, "tensor '%s.quant_map' is not bitsandbytes' NF4 code table",
                             w->name);
    path = files[r[P_NMAP]->file].path;
    FSDP_TRY(read_tensor(files, fds, r[P_NMAP], map));
    if (memcmp(map, fsdp_nf4_dynamic_map, sizeof fsdp_nf4_dynamic_map))
        return fsdp_st_error(path, "tensor '%s.nested_quant_map' is not bitsandbytes' dynamic "
                             "8-bit map", w->name);
    size_t nn = fsdp_nf4_nested_blocks(w->n_blocks);
    if (!(w->nested = malloc(nn * sizeof *w->nested)))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", w->name);
    FSDP_TRY(read_tensor(files, fds, r[P_NESTED], w->nested));
    for (size_t i = 0; i < nn; i++)
        if (!isfinite(w->nested[i]))
            return fsdp_st_error(files[r[P_NESTED]->file].path, "tensor '%s.nested_absmax' "
                                 "holds %g at %zu", w->name, w->nested[i], i);
    w->codes_part = r[P_CODES]->file;
    w->absmax_part = r[P_ABSMAX]->file;
    w->codes_offset = files[w->codes_part].data_offset + r[P_CODES]->t->begin;
    w->absmax_offset = files[w->absmax_part].data_offset + r[P_ABSMAX]->t->begin;
    return FSDP_STATUS_OK;
}

/* Weight w, whose quant_state is tensor s. */
static fsdp_status open_weight(const fsdp_st_file *files, const int *fds, const tref *all,
                               int n_all, const tref *s, fsdp_bnb4_tensor *w)
{
    const char *path = files[s->file].path;
    size_t len = strlen(s->name) - strlen(FSDP_BNB4_STATE_SUFFIX);
    if (!(w->name = strndup(s->name, len)))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    if (strcmp(s->t->dtype_name, "U8") || s->t->numel > FSDP_BNB4_STATE_MAX_BYTES)
        return fsdp_st_error(path, "tensor '%.80s' is not a U8 JSON text of at most %d bytes",
                             s->name, FSDP_BNB4_STATE_MAX_BYTES);
    char text[FSDP_BNB4_STATE_MAX_BYTES];
    FSDP_TRY(read_tensor(files, fds, s, text));
    FSDP_TRY(check_state(path, s->name, text, (size_t)s->t->numel, w));
    const tref *r[P_COUNT];
    for (int k = 0; k < P_COUNT; k++) {
        char name[FSDP_WEIGHT_NAME_MAX + 64];
        snprintf(name, sizeof name, "%s%s", w->name, part_suffix[k]);
        r[k] = find(all, n_all, name);
        FSDP_TRY(check_part(r[k] ? files[r[k]->file].path : path, w, k, r[k], name));
    }
    return check_values(files, fds, r, w);
}

static int cmp_weight(const void *a, const void *b)
{
    return strcmp(((const fsdp_bnb4_tensor *)a)->name, ((const fsdp_bnb4_tensor *)b)->name);
}

fsdp_status fsdp_bnb4_open(fsdp_bnb4 **out, const fsdp_st_file *files, const int *fds,
                           int n_files)
{
    *out = NULL;
    int n_all = 0, n_w = 0;
    for (int i = 0; i < n_files; i++)
        n_all += files[i].n_tensors;
    tref *all = calloc((size_t)n_all + 1, sizeof *all);
    fsdp_bnb4 *q = calloc(1, sizeof *q);
    fsdp_status st = FSDP_STATUS_OK;
    if (!all || !q) {
        free(all);
        free(q);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    }
    n_all = 0;
    for (int i = 0; i < n_files; i++)
        for (int k = 0; k < files[i].n_tensors; k++) {
            const fsdp_st_tensor *t = &files[i].tensors[k];
            all[n_all++] = (tref){t->name, i, t};
            n_w += ends_with(t->name, FSDP_BNB4_STATE_SUFFIX);
            if (ends_with(t->name, ".quant_state.bitsandbytes__fp4") && st == FSDP_STATUS_OK)
                st = fsdp_st_error(files[i].path, "tensor '%.80s' is an fp4 weight's; fsdp "
                                   "reads NF4 weights only", t->name);
        }
    qsort(all, (size_t)n_all, sizeof *all, cmp_tref);
    if (st == FSDP_STATUS_OK && !(q->t = calloc((size_t)n_w + 1, sizeof *q->t)))
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    for (int i = 0; i < n_all && st == FSDP_STATUS_OK; i++)
        if (ends_with(all[i].name, FSDP_BNB4_STATE_SUFFIX))
            st = open_weight(files, fds, all, n_all, &all[i], &q->t[q->n++]);
    free(all);
    if (st == FSDP_STATUS_OK)
        qsort(q->t, (size_t)q->n, sizeof *q->t, cmp_weight);
    return FSDP_OUT_OR_FREE(st, out, q, fsdp_bnb4_free);
}

void fsdp_bnb4_free(fsdp_bnb4 *q)
{
    if (!q)
        return;
    for (int i = 0; i < q->n; i++) {
        free(q->t[i].name);
        free(q->t[i].nested);
    }
    free(q->t);
    free(q);
}

static int weight_index(const fsdp_bnb4 *q, const char *name)
{
    fsdp_bnb4_tensor key = {.name = (char *)name};
    const fsdp_bnb4_tensor *w = bsearch(&key, q->t, (size_t)q->n, sizeof *q->t, cmp_weight);
    return w ? (int)(w - q->t) : -1;
}

int fsdp_bnb4_role(const fsdp_bnb4 *q, const char *name)
{
    int i = weight_index(q, name);
    if (i >= 0)
        return i;
    for (int k = 1; k <= P_COUNT; k++) {
        const char *suffix = k < P_COUNT ? part_suffix[k] : FSDP_BNB4_STATE_SUFFIX;
        if (!ends_with(name, suffix))
            continue;
        char base[FSDP_WEIGHT_NAME_MAX + 64];
        size_t len = strlen(name) - strlen(suffix);
        if (len < sizeof base) {
            memcpy(base, name, len);
            base[len] = '\0';
            if (weight_index(q, base) >= 0)
                return -2;
        }
    }
    return -1;
}

/* ---- reads -------------------------------------------------------------------------- */

fsdp_status fsdp_bnb4_read_blocks(const fsdp_modelfile *mf, const fsdp_bnb4_tensor *t,
                                  uint64_t first, uint64_t count, uint8_t *codes, float *absmax)
{
    FSDP_ASSERT(first + count <= t->n_blocks);
    uint64_t c0 = first * (FSDP_NF4_BLOCK / 2), c1 = (first + count) * (FSDP_NF4_BLOCK / 2);
    uint64_t stored = (t->numel + 1) / 2, c_end = c1 < stored ? c1 : stored;
    memset(codes + (c_end - c0), 0x77, (size_t)(c1 - c_end)); /* a short last block */
    FSDP_TRY(fsdp_modelfile_pread(mf, t->codes_part, codes, (size_t)(c_end - c0),
                                  t->codes_offset + c0));
    uint64_t a0 = first / FSDP_NF4_NESTED * FSDP_NF4_NESTED;
    uint8_t *q = malloc((size_t)(first + count - a0));
    if (!q)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", t->name);
    fsdp_status st = fsdp_modelfile_pread(mf, t->absmax_part, q, (size_t)(first + count - a0),
                                          t->absmax_offset + a0);
    if (st == FSDP_STATUS_OK)
        fsdp_nf4_absmax(q, t->nested + a0 / FSDP_NF4_NESTED, t->offset, (size_t)(first - a0),
                        (size_t)count, absmax);
    free(q);
    return st;
}

fsdp_status fsdp_bnb4_read(const fsdp_modelfile *mf, const fsdp_bnb4_tensor *t, uint64_t a,
                           uint64_t b, float *dst)
{
    uint8_t *codes = malloc(BNB4_CHUNK_BLOCKS * FSDP_NF4_BLOCK / 2);
    float *absmax = malloc(BNB4_CHUNK_BLOCKS * sizeof *absmax);
    float *x = malloc(BNB4_CHUNK_BLOCKS * FSDP_NF4_BLOCK * sizeof *x);
    fsdp_status st = FSDP_STATUS_OK;
    if (!codes || !absmax || !x)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", t->name);
    for (uint64_t blk = a / FSDP_NF4_BLOCK; st == FSDP_STATUS_OK && blk * FSDP_NF4_BLOCK < b;
         blk += BNB4_CHUNK_BLOCKS) {
        uint64_t nb = t->n_blocks - blk < BNB4_CHUNK_BLOCKS ? t->n_blocks - blk
                                                            : BNB4_CHUNK_BLOCKS;
        st = fsdp_bnb4_read_blocks(mf, t, blk, nb, codes, absmax);
        if (st != FSDP_STATUS_OK)
            break;
        uint64_t e0 = blk * FSDP_NF4_BLOCK, e1 = (blk + nb) * FSDP_NF4_BLOCK;
        fsdp_nf4_dequant_ref(codes, absmax, (size_t)(e1 - e0), x);
        uint64_t lo = a > e0 ? a : e0, hi = b < e1 ? b : e1;
        memcpy(dst + (lo - a), x + (lo - e0), (size_t)(hi - lo) * sizeof *x);
    }
    free(codes);
    free(absmax);
    free(x);
    return st;
}
