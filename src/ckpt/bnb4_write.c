/*
 * bnb4_write.c - writing a bnb-4bit Hugging Face directory (bnb4.h) from a
 * model held in floats: `fsdp convert IN OUT --to hf --quantize nf4`, laid
 * out byte for byte as transformers + bitsandbytes save_pretrained writes a
 * model loaded with BitsAndBytesConfig(load_in_4bit=True,
 * bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True) in the storage
 * dtype (bf16 or fp32).
 *
 * Every block linear weight (models/lora.h fsdp_lora_is_linear_weight: the
 * nn.Linear layers bitsandbytes replaces, not the LM head) is quantized as
 * bitsandbytes does (ops/nf4.h) from its values in the storage dtype (a
 * bf16 directory's weights rounded to bf16 first, as transformers loads
 * them) and becomes bnb4.h's six tensors; every other parameter is stored
 * in that dtype. config.json is the family's with transformers'
 * quantization_config inserted in key order.
 *
 * Layout, as transformers 5.24 writes it: tensors go to files in name order
 * (a new file when the next tensor would pass shard_bytes, so a weight's six
 * tensors may be split), the index giving the model's parameter count (the
 * weights' unquantized elements) and the data bytes; inside a file the
 * reference safetensors writer sorts them by dtype, widest first (F32, BF16,
 * U8), then by name. The quant_state JSON is Python's json.dumps of
 * bitsandbytes' packed dict: its keys in its order, ", " and ": ", and the
 * offset as Python's repr of the fp32 value widened to a double.
 *
 * The whole model is in host memory (convert's units); the quantized form
 * of all weights is built first (half a byte and a bit per element), then
 * each file is written; the directory is staged and renamed (hfdir.h).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/bnb4.h"
#include "ckpt/hfdir.h"
#include "core/bf16.h"
#include "core/fileio.h"
#include "core/json.h"
#include "models/lora.h"
#include "ops/nf4.h"

#define WRITE_CHUNK 65536 /* floats converted per write */

/* Safetensors dtypes the files hold, in the reference writer's order (a
 * file's tensors are sorted widest first). */
enum { DT_U8, DT_BF16, DT_F32 };
static const char *const dt_names[] = {"U8", "BF16", "F32"};

/* One quantized weight: what bitsandbytes' QuantState holds. */
typedef struct quant {
    uint8_t *codes;   /* [ceil(numel / 2)] two per byte */
    uint8_t *qabsmax; /* [blocks] */
    float *nested;    /* [nested blocks] */
    char state[FSDP_BNB4_STATE_MAX_BYTES];
    size_t state_bytes;
} quant;

/* One tensor of the files: parameter (unit, param) in floats when data is
 * NULL, else these bytes. */
typedef struct ftensor {
    char name[FSDP_WEIGHT_NAME_MAX + 64];
    int dtype;
    int ndim;
    uint64_t shape[4];
    uint64_t bytes;
    uint64_t params;  /* the parameter's elements on its first tensor, else 0 */
    int unit, param;
    const void *data;
    int shard;
} ftensor;

/* ---- the quant_state JSON ---------------------------------------------------------- */

/* x as Python's repr(float) prints it: the shortest digits that read back
 * as x, fixed notation for decimal exponents in [-4, 16), else d.ddde-XX. */
static void py_float_repr(double x, char *buf, size_t n)
{
    if (!isfinite(x)) {
        snprintf(buf, n, "%s", isnan(x) ? "NaN" : x > 0 ? "Infinity" : "-Infinity");
        return;
    }
    char e[40], digits[24];
    int p = 1;
    for (; p < 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, x);
        if (strtod(e, NULL) == x)
            break;
    }
    snprintf(e, sizeof e, "%.*e", p - 1, x);
    /* e: [-]d[.ddd]e[+-]XX */
    const char *s = e + (e[0] == '-');
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    digits[nd] = '\0';
    while (nd > 1 && digits[nd - 1] == '0')
        digits[--nd] = '\0';
    int exp10 = atoi(s + 1), decpt = exp10 + 1;
    size_t at = (size_t)snprintf(buf, n, "%s", x < 0 || (x == 0 && signbit(x)) ? "-" : "");
    static const char zeros[] = "0000000000000000";
    if (x == 0)
        snprintf(buf + at, n - at, "0.0");
    else if (decpt <= 0 && decpt > -4) /* 0.000ddd */
        snprintf(buf + at, n - at, "0.%.*s%s", -decpt, zeros, digits);
    else if (decpt > 0 && decpt < nd) /* dd.ddd */
        snprintf(buf + at, n - at, "%.*s.%s", decpt, digits, digits + decpt);
    else if (decpt > 0 && decpt <= 16) /* ddd00.0 */
        snprintf(buf + at, n - at, "%s%.*s.0", digits, decpt - nd, zeros);
    else /* d.ddde-XX */
        snprintf(buf + at, n - at, "%c%s%se%c%02d", digits[0], nd > 1 ? "." : "", digits + 1,
                 exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
}

size_t fsdp_bnb4_state_json(char *buf, size_t n, const uint64_t *shape, int ndim,
                            const char *dtype, float offset)
{
    fsdp_sbuf b = {0};
    fsdp_sbuf_printf(&b, "{\"quant_type\": \"nf4\", \"blocksize\": %d, \"dtype\": \"%s\", "
                     "\"shape\": [", FSDP_NF4_BLOCK, dtype);
    for (int d = 0; d < ndim; d++)
        fsdp_sbuf_printf(&b, "%s%" PRIu64, d ? ", " : "", shape[d]);
    char off[40];
    py_float_repr((double)offset, off, sizeof off);
    fsdp_sbuf_printf(&b, "], \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", "
                     "\"nested_offset\": %s}", FSDP_NF4_NESTED, off);
    size_t len = b.oom ? 0 : b.n;
    if (len && len < n)
        memcpy(buf, b.p, len + 1);
    free(b.p);
    return len;
}

/* ---- quantizing ---------------------------------------------------------------------- */

/* Parameter (u, i) of units in the file's layout (t: the mapping's view of
 * it) into dst (t->stored_numel floats), rounded to bf16 when the
 * directory stores bf16, as transformers loads the weight bitsandbytes
 * then quantizes. */
static void file_values(const fsdp_model *m, const float *const *units, int u, int i,
                        const fsdp_weight_tensor *t, fsdp_dtype dt, float *dst)
{
    const fsdp_param_spec *p = &m->units[u].params[i];
    const float *x = units[u] + p->offset;
    if (!t->transposed) {
        memcpy(dst, x, (size_t)t->stored_numel * sizeof *dst);
    } else { /* fsdp (R, K) -> file (K, R) */
        size_t R = (size_t)p->shape[0], K = (size_t)p->shape[1];
        for (size_t c = 0; c < K; c++)
            for (size_t r = 0; r < R; r++)
                dst[c * R + r] = x[r * K + c];
    }
    if (dt == FSDP_DTYPE_BF16)
        for (uint64_t k = 0; k < t->stored_numel; k++)
            dst[k] = fsdp_bf16_to_f32(fsdp_f32_to_bf16(dst[k]));
}

static void quant_free(quant *q)
{
    free(q->codes);
    free(q->qabsmax);
    free(q->nested);
}

/* Quantize parameter (u, i) (t: its file view) into q. */
static fsdp_status quantize_weight(const fsdp_model *m, const float *const *units, int u, int i,
                                   const fsdp_weight_tensor *t, fsdp_dtype dt, const char *name,
                                   quant *q)
{
    size_t n = (size_t)t->stored_numel, nb = fsdp_nf4_blocks(n);
    float *x = malloc(n * sizeof *x + 1), *absmax = malloc(nb * sizeof *absmax + 1), offset;
    q->codes = malloc((n + 1) / 2 + 1);
    q->qabsmax = malloc(nb + 1);
    q->nested = malloc(fsdp_nf4_nested_blocks(nb) * sizeof *q->nested + 1);
    fsdp_status st = FSDP_STATUS_OK;
    if (!x || !absmax || !q->codes || !q->qabsmax || !q->nested) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory quantizing '%s'", name);
        goto done;
    }
    file_values(m, units, u, i, t, dt, x);
    for (size_t k = 0; k < n; k++)
        if (!isfinite(x[k])) {
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "weight '%s' holds %g at element %zu: "
                                "NF4 quantizes finite weights only", name, (double)x[k], k);
            goto done;
        }
    fsdp_nf4_quantize(x, n, q->codes, absmax);
    fsdp_nf4_double_quant(absmax, nb, q->qabsmax, q->nested, &offset);
    q->state_bytes = fsdp_bnb4_state_json(q->state, sizeof q->state, t->shape, t->ndim,
                                          dt == FSDP_DTYPE_BF16 ? "bfloat16" : "float32", offset);
    if (!q->state_bytes)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory quantizing '%s'", name);
done:
    free(x);
    free(absmax);
    return st;
}

/* ---- the tensors of the files ------------------------------------------------------ */

/* The state_dict: every parameter of m, the block linear weights quantized
 * into q[] (one per weight, in model order) as six tensors. *out, *n_out:
 * malloc'd; q[] owns the bytes the tensors point at. */
static fsdp_status list_tensors(const fsdp_model *m, const float *const *units, fsdp_dtype dt,
                                quant *q, ftensor **out, int *n_out)
{
    const fsdp_safetensors_mapping *map = m->family->safetensors;
    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        n += 6 * m->units[u].n_params;
    ftensor *f = calloc((size_t)n + 1, sizeof *f);
    if (!f)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    int k = 0, nq = 0;
    const char *prefix = map->hf_prefix ? map->hf_prefix : "";
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            fsdp_weight_tensor t;
            map->tensor(m, u, i, &t);
            ftensor *w = &f[k++];
            *w = (ftensor){.dtype = dt == FSDP_DTYPE_BF16 ? DT_BF16 : DT_F32, .ndim = t.ndim,
                           .bytes = t.stored_numel * fsdp_dtype_size(dt),
                           .params = t.stored_numel, .unit = u, .param = i};
            snprintf(w->name, sizeof w->name, "%s%s", prefix, t.name);
            memcpy(w->shape, t.shape, sizeof w->shape);
            if (!fsdp_lora_is_linear_weight(m, u, i))
                continue;
            fsdp_status st = FSDP_STATUS_OK;
            if (t.transposed) /* bitsandbytes stores Conv1D transposed back: not read either */
                st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s models store '%s' transposed "
                                    "(Conv1D); fsdp writes and reads bnb-4bit directories of "
                                    "families whose linear weights are nn.Linear (Llama, Qwen2, "
                                    "Mistral)", m->family->title, w->name);
            quant *qq = &q[nq++];
            if (st == FSDP_STATUS_OK)
                st = quantize_weight(m, units, u, i, &t, dt, w->name, qq);
            if (st != FSDP_STATUS_OK) {
                free(f);
                return st;
            }
            uint64_t numel = t.stored_numel, nb = fsdp_nf4_blocks((size_t)numel);
            uint64_t nn = fsdp_nf4_nested_blocks((size_t)nb);
            const struct {
                const char *suffix;
                int dtype;
                uint64_t numel, cols; /* cols 1: the codes' [bytes, 1] */
                const void *data;
            } six[6] = {
                {"", DT_U8, (numel + 1) / 2, 1, qq->codes},
                {".absmax", DT_U8, nb, 0, qq->qabsmax},
                {".quant_map", DT_F32, 16, 0, fsdp_nf4_code},
                {".nested_absmax", DT_F32, nn, 0, qq->nested},
                {".nested_quant_map", DT_F32, 256, 0, fsdp_nf4_dynamic_map},
                {FSDP_BNB4_STATE_SUFFIX, DT_U8, qq->state_bytes, 0, qq->state},
            };
            char base[sizeof w->name];
            snprintf(base, sizeof base, "%s", w->name);
            for (int s = 0; s < 6; s++) {
                ftensor *x = s ? &f[k++] : w;
                *x = (ftensor){.dtype = six[s].dtype, .ndim = six[s].cols ? 2 : 1,
                               .shape = {six[s].numel, six[s].cols},
                               .bytes = six[s].numel * (six[s].dtype == DT_F32 ? 4 : 1),
                               .params = s ? 0 : numel, .unit = u, .param = i,
                               .data = six[s].data};
                snprintf(x->name, sizeof x->name, "%s%s", base, six[s].suffix);
            }
        }
    *out = f;
    *n_out = k;
    return FSDP_STATUS_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp((*(const ftensor *const *)a)->name, (*(const ftensor *const *)b)->name);
}

/* The reference writer's order: dtype widest first, then name. */
static int cmp_ftensor(const void *a, const void *b)
{
    const ftensor *x = *(const ftensor *const *)a, *y = *(const ftensor *const *)b;
    if (x->dtype != y->dtype)
        return y->dtype - x->dtype;
    return strcmp(x->name, y->name);
}

/* Parameter tensor t's floats into f as dt, in chunks through buf. */
static bool put_param(FILE *f, const fsdp_model *m, const float *const *units, const ftensor *t,
                      fsdp_dtype dt, float *vals, uint16_t *buf)
{
    fsdp_weight_tensor w;
    m->family->safetensors->tensor(m, t->unit, t->param, &w);
    file_values(m, units, t->unit, t->param, &w, FSDP_DTYPE_F32, vals);
    if (dt == FSDP_DTYPE_F32)
        return fwrite(vals, 4, (size_t)w.stored_numel, f) == (size_t)w.stored_numel;
    for (uint64_t at = 0; at < w.stored_numel;) {
        size_t k = w.stored_numel - at < WRITE_CHUNK ? (size_t)(w.stored_numel - at)
                                                     : WRITE_CHUNK;
        for (size_t j = 0; j < k; j++)
            buf[j] = fsdp_f32_to_bf16(vals[at + j]);
        if (fwrite(buf, 2, k, f) != k)
            return false;
        at += k;
    }
    return true;
}

/* The safetensors file `path` of the tensors t[0..n) (sorted here). */
static fsdp_status write_file(const char *path, const fsdp_model *m, const float *const *units,
                              fsdp_dtype dt, ftensor **t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_ftensor);
    fsdp_sbuf h = {0};
    fsdp_sbuf_printf(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t at = 0, max_numel = 1;
    for (int k = 0; k < n; k++) {
        fsdp_sbuf_printf(&h, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", t[k]->name,
                         dt_names[t[k]->dtype]);
        for (int d = 0; d < t[k]->ndim; d++)
            fsdp_sbuf_printf(&h, "%s%" PRIu64, d ? "," : "", t[k]->shape[d]);
        fsdp_sbuf_printf(&h, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", at,
                         at + t[k]->bytes);
        at += t[k]->bytes;
        if (!t[k]->data && m->units[t[k]->unit].params[t[k]->param].numel > max_numel)
            max_numel = m->units[t[k]->unit].params[t[k]->param].numel;
    }
    fsdp_sbuf_printf(&h, "}");
    while (!h.oom && h.n % 8) /* the data section 8-aligned, as the reference writer pads */
        fsdp_sbuf_printf(&h, " ");
    float *vals = malloc((size_t)max_numel * sizeof *vals);
    uint16_t *buf = malloc(WRITE_CHUNK * sizeof *buf);
    fsdp_atomic_file af = {0};
    fsdp_status st = FSDP_STATUS_OK;
    if (h.oom || !vals || !buf) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", path);
        goto fail;
    }
    FSDP_CHECK(fsdp_atomic_open(&af, path, "safetensors file"));
    uint64_t hn = h.n;
    bool ok = fwrite(&hn, 8, 1, af.f) == 1 && fwrite(h.p, 1, h.n, af.f) == h.n;
    for (int k = 0; ok && k < n; k++)
        ok = t[k]->data ? fwrite(t[k]->data, 1, (size_t)t[k]->bytes, af.f) == t[k]->bytes
                        : put_param(af.f, m, units, t[k], dt, vals, buf);
    FSDP_CHECK(fsdp_atomic_commit(&af, ok));
fail:
    fsdp_atomic_abort(&af);
    free(vals);
    free(buf);
    free(h.p);
    return st;
}

/* ---- config.json ----------------------------------------------------------------- */

/* Where quantization_config goes among the sorted top-level members of
 * config.json: before the first that sorts after it, else after the last. */
struct qc_place {
    size_t before;   /* offset of that member's value, or 0 */
    size_t last_end; /* end of the last member's value */
};

static fsdp_status qc_member(void *arg, const char *key, size_t key_len, const char *value,
                             size_t value_n, size_t offset)
{
    struct qc_place *p = arg;
    (void)key_len;
    if (!strcmp(key, "quantization_config"))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "the model's config.json already holds "
                              "a quantization_config");
    if (!p->before && strcmp(key, "quantization_config") > 0)
        p->before = offset;
    p->last_end = offset + value_n;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_bnb4_config_write(const fsdp_model *m, fsdp_dtype dt, fsdp_sbuf *out)
{
    const char *dtype = dt == FSDP_DTYPE_BF16 ? "bfloat16" : "float32";
    fsdp_sbuf cfg = {0};
    fsdp_status st = m->family->safetensors->hf_config_write(m, dtype, &cfg);
    struct qc_place p = {0};
    if (st == FSDP_STATUS_OK && cfg.oom)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    if (st == FSDP_STATUS_OK)
        st = fsdp_st_json_members("the model's config.json", cfg.p, cfg.n, qc_member, &p);
    if (st != FSDP_STATUS_OK) {
        free(cfg.p);
        return st;
    }
    /* transformers' BitsAndBytesConfig.to_dict, keys sorted, two-space indent */
    char qc[1024];
    snprintf(qc, sizeof qc,
             "\"quantization_config\": {\n"
             "    \"_load_in_4bit\": true,\n"
             "    \"_load_in_8bit\": false,\n"
             "    \"bnb_4bit_compute_dtype\": \"%s\",\n"
             "    \"bnb_4bit_quant_storage\": \"uint8\",\n"
             "    \"bnb_4bit_quant_type\": \"nf4\",\n"
             "    \"bnb_4bit_use_double_quant\": true,\n"
             "    \"llm_int8_enable_fp32_cpu_offload\": false,\n"
             "    \"llm_int8_has_fp16_weight\": false,\n"
             "    \"llm_int8_skip_modules\": null,\n"
             "    \"llm_int8_threshold\": 6.0,\n"
             "    \"load_in_4bit\": true,\n"
             "    \"load_in_8bit\": false,\n"
             "    \"quant_method\": \"bitsandbytes\"\n"
             "  }", dtype);
    if (p.before) { /* at the start of that member's line: `  "key": value` */
        size_t at = p.before;
        while (at > 0 && cfg.p[at - 1] != '\n')
            at--;
        fsdp_sbuf_put(out, cfg.p, at);
        fsdp_sbuf_printf(out, "  %s,\n", qc);
        fsdp_sbuf_put(out, cfg.p + at, cfg.n - at);
    } else {
        fsdp_sbuf_put(out, cfg.p, p.last_end);
        fsdp_sbuf_printf(out, ",\n  %s", qc);
        fsdp_sbuf_put(out, cfg.p + p.last_end, cfg.n - p.last_end);
    }
    free(cfg.p);
    return out->oom ? fsdp_error_set(FSDP_STATUS_OOM, "out of host memory") : FSDP_STATUS_OK;
}

/* ---- the directory --------------------------------------------------------------- */

/* fsdp_hfdir_model_writer: config.json, the files and their index. */
static fsdp_status write_model(const char *tmp, const fsdp_model *m, const float *const *units,
                               const fsdp_modelfile_write_opts *o, int *n_files)
{
    char p[FSDP_CKPT_PATH_MAX + 64];
    fsdp_sbuf cfg = {0};
    fsdp_status st = fsdp_bnb4_config_write(m, o->dtype, &cfg);
    snprintf(p, sizeof p, "%s/" FSDP_HF_CONFIG, tmp);
    if (st == FSDP_STATUS_OK)
        st = fsdp_write_file_sync(p, cfg.p, cfg.n, "model config");
    free(cfg.p);
    FSDP_TRY(st);

    int n_weights = 0, n = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++)
            n_weights += fsdp_lora_is_linear_weight(m, u, i);
    if (!n_weights)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s models name no block linear layers "
                              "(models/lora.h), so there is nothing to store in NF4; "
                              "--quantize nf4 writes Llama-family models (Llama, Qwen2, "
                              "Mistral)", m->family->title);
    quant *q = calloc((size_t)n_weights + 1, sizeof *q);
    ftensor *t = NULL, **part = NULL;
    fsdp_hfdir_entry *e = NULL;
    if (!q) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        goto done;
    }
    if ((st = list_tensors(m, units, o->dtype, q, &t, &n)) != FSDP_STATUS_OK)
        goto done;
    part = calloc((size_t)n + 1, sizeof *part);
    e = calloc((size_t)n + 1, sizeof *e);
    if (!part || !e) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        goto done;
    }
    /* files in name order, as transformers 5 assigns them, each at most `limit` bytes
     * unless one tensor is larger */
    for (int k = 0; k < n; k++)
        part[k] = &t[k];
    qsort(part, (size_t)n, sizeof *part, cmp_name);
    uint64_t limit = o->shard_bytes ? o->shard_bytes : FSDP_MODELFILE_SHARD_BYTES_DEFAULT;
    uint64_t used = 0, total = 0, params = 0;
    int shard = 0;
    for (int k = 0; k < n; k++) {
        if (used > 0 && used + part[k]->bytes > limit) {
            shard++;
            used = 0;
        }
        part[k]->shard = shard;
        used += part[k]->bytes;
        total += part[k]->bytes;
        params += part[k]->params;
        e[k] = (fsdp_hfdir_entry){part[k]->name, shard};
    }
    int n_shards = shard + 1;
    for (int s = 0; s < n_shards && st == FSDP_STATUS_OK; s++) {
        int c = 0;
        for (int k = 0; k < n; k++)
            if (t[k].shard == s)
                part[c++] = &t[k];
        char name[64];
        fsdp_hfdir_shard_name(name, sizeof name, s, n_shards);
        snprintf(p, sizeof p, "%s/%s", tmp, name);
        st = write_file(p, m, units, o->dtype, part, c);
    }
    if (st == FSDP_STATUS_OK && n_shards > 1)
        st = fsdp_hfdir_write_index(tmp, e, n, n_shards, params, total);
    *n_files = n_shards;
done:
    for (int k = 0; q && k < n_weights; k++)
        quant_free(&q[k]);
    free(q);
    free(t);
    free(part);
    free(e);
    return st;
}

fsdp_status fsdp_bnb4_write(const char *path, const fsdp_model *m, const float *const *units,
                            const fsdp_modelfile_write_opts *o)
{
    return fsdp_hfdir_write_as(path, m, units, o, write_model);
}
