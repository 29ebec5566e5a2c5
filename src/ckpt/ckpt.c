/*
 * ckpt.c - checkpoint directories, the manifest and the shard files (the
 * formats are described in ckpt.h).
 *
 * Everything read from disk is treated as hostile: the manifest parser
 * bounds every number before it sizes an allocation or a computation (all
 * size arithmetic is overflow-checked in 64 bits), every key must appear
 * exactly once, and a shard file is checked against the layout the
 * manifest implies before a single payload byte is trusted. Assumes a
 * little-endian host (checked at compile time), as llm.c's files do.
 *
 * Checksums are FNV-1a over 64-bit words (a trailing partial word is
 * zero-extended): any single corrupted word changes the sum, and it runs
 * at memory speed, unlike byte-wise FNV.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/fileio.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint files are little-endian; add byte swapping for this host");

#define SHARD_MAGIC "FSDPCKPT"
#define SHARD_HEADER_BYTES 64
#define MANIFEST_MAX_BYTES ((size_t)16 << 20)
#define MANIFEST_MIN_LINE 32 /* bytes of the shortest unit or param line */
#define MANIFEST_LINE_MAX 1024
#define MAX_NUMEL ((uint64_t)1 << 48)     /* per unit or parameter */
#define MAX_DIM ((uint64_t)1 << 40)
#define MAX_WORLD 65536
#define MAX_SMALL (1 << 24)               /* batch, seq, vocab, ... */

const char *fsdp_ckpt_array_name(fsdp_ckpt_array a)
{
    static const char *const names[FSDP_CKPT_N_ARRAYS] = {"master", "adam_m", "adam_v"};
    return (unsigned)a < FSDP_CKPT_N_ARRAYS ? names[a] : "?";
}

/* ---- checksums ------------------------------------------------------------ */

#define FNV_OFFSET 1469598103934665603ull
#define FNV_PRIME 1099511628211ull

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, c + 8 * i, 8);
        h = (h ^ w) * FNV_PRIME;
    }
    size_t rest = n % 8;
    if (rest) {
        uint64_t w = 0;
        memcpy(&w, c + 8 * words, rest);
        h = (h ^ w) * FNV_PRIME;
    }
    return h;
}

/* ---- small helpers ---------------------------------------------------------- */

static const char *errstr(void) { return strerror(errno); }

static fsdp_status write_all(int fd, const void *buf, size_t n, off_t off, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = pwrite(fd, p, n, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "cannot write checkpoint file '%s': %s (disk full? free space "
                                  "or choose another --ckpt-dir)",
                                  path, k < 0 ? errstr() : "short write");
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return FSDP_STATUS_OK;
}

static fsdp_status read_all(int fd, void *buf, size_t n, off_t off, const char *path)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot read checkpoint file '%s': %s", path,
                                  errstr());
        if (k == 0)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "checkpoint file '%s' ends early (truncated while in use?)",
                                  path);
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return FSDP_STATUS_OK;
}

/* Create the whole file `path` with `text`, fsynced. */
static fsdp_status write_text_file(const char *path, const char *text, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot create checkpoint file '%s': %s", path,
                              errstr());
    fsdp_status st = write_all(fd, text, n, 0, path);
    if (st == FSDP_STATUS_OK && fsync(fd) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot fsync checkpoint file '%s': %s", path,
                            errstr());
    if (close(fd) != 0 && st == FSDP_STATUS_OK)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot close checkpoint file '%s': %s", path,
                            errstr());
    return st;
}

/* ---- manifest: building and writing ------------------------------------------ */

void fsdp_ckpt_manifest_free(fsdp_ckpt_manifest *m)
{
    if (m->units)
        for (int u = 0; u < m->n_units; u++)
            free(m->units[u].params);
    free(m->units);
    memset(m, 0, sizeof *m);
}

fsdp_status fsdp_ckpt_manifest_set_units(fsdp_ckpt_manifest *m, const fsdp_model *model,
                                         const size_t *padded_numel, const size_t *shard_numel)
{
    fsdp_ckpt_unit *units = calloc((size_t)model->n_units, sizeof *units);
    if (!units)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a checkpoint manifest");
    for (int u = 0; u < model->n_units; u++) {
        const fsdp_unit_spec *us = &model->units[u];
        fsdp_ckpt_unit *cu = &units[u];
        snprintf(cu->name, sizeof cu->name, "%s", us->name);
        cu->numel = us->numel;
        cu->padded_numel = padded_numel[u];
        cu->shard_numel = shard_numel[u];
        cu->n_params = us->n_params;
        cu->params = calloc((size_t)us->n_params, sizeof *cu->params);
        if (!cu->params) {
            for (int k = 0; k < u; k++)
                free(units[k].params);
            free(units);
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a checkpoint manifest");
        }
        for (int i = 0; i < us->n_params; i++) {
            const fsdp_param_spec *ps = &us->params[i];
            fsdp_ckpt_param *cp = &cu->params[i];
            snprintf(cp->name, sizeof cp->name, "%s", ps->name);
            cp->ndim = ps->ndim;
            memcpy(cp->shape, ps->shape, sizeof cp->shape);
            cp->numel = ps->numel;
            cp->offset = ps->offset;
        }
    }
    if (m->units)
        for (int u = 0; u < m->n_units; u++)
            free(m->units[u].params);
    free(m->units);
    m->units = units;
    m->n_units = model->n_units;
    return FSDP_STATUS_OK;
}

/* Free text as one line: control characters become '?', empty becomes "-". */
static void sb_text(fsdp_sbuf *b, const char *key, const char *s)
{
    char tmp[MANIFEST_LINE_MAX];
    size_t n = 0;
    for (; s && *s && n + 1 < sizeof tmp - 64; s++)
        tmp[n++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    tmp[n] = '\0';
    fsdp_sbuf_printf(b, "%s %s\n", key, n ? tmp : "-");
}

fsdp_status fsdp_ckpt_manifest_write(const char *path, const fsdp_ckpt_manifest *m)
{
    fsdp_sbuf b = {0};
    fsdp_sbuf_printf(&b, "# fsdp checkpoint manifest: `key value` lines; see src/ckpt/ckpt.h\n");
    fsdp_sbuf_printf(&b, "format fsdp-checkpoint\nversion %d\n", FSDP_CKPT_VERSION);
    fsdp_sbuf_printf(&b, "run_id %016" PRIx64 "\n", m->run_id);
    fsdp_sbuf_printf(&b, "step %" PRIu64 "\nadam_t %" PRIu64 "\ndata_sequences %" PRIu64 "\n", m->step,
              m->adam_t, m->data_sequences);
    fsdp_sbuf_printf(&b, "seed %" PRIu64 "\nworld_size %d\nshard %s\n", m->seed, m->world_size, m->shard);
    fsdp_sbuf_printf(&b, "batch %d\nseq %d\ngrad_accum %d\nsteps_total %d\n", m->batch, m->seq,
              m->grad_accum, m->steps_total);
    fsdp_sbuf_printf(&b, "compute_dtype %s\nmaster_dtype fp32\noptim_dtype fp32\n", m->compute_dtype);
    sb_text(&b, "model_name", m->model_name);
    sb_text(&b, "model_spec", m->model_spec);
    if (m->has_gpt2)
        fsdp_sbuf_printf(&b, "gpt2 layers=%d heads=%d channels=%d vocab=%d context=%d\n",
                  m->gpt2.n_layer, m->gpt2.n_head, m->gpt2.n_embd, m->gpt2.vocab_size,
                  m->gpt2.max_seq_len);
    else
        fsdp_sbuf_printf(&b, "gpt2 -\n");
    fsdp_sbuf_printf(&b, "vocab_size %d\npadded_vocab_size %d\nmax_seq_len %d\n", m->vocab_size,
              m->padded_vocab_size, m->max_seq_len);
    sb_text(&b, "data", m->data);
    fsdp_sbuf_printf(&b, "block_numel %zu\nunits %d\n", FSDP_CKPT_BLOCK_NUMEL, m->n_units);
    for (int u = 0; u < m->n_units; u++) {
        const fsdp_ckpt_unit *cu = &m->units[u];
        fsdp_sbuf_printf(&b, "unit %d %s numel %zu padded %zu shard %zu params %d\n", u, cu->name,
                  cu->numel, cu->padded_numel, cu->shard_numel, cu->n_params);
        for (int i = 0; i < cu->n_params; i++) {
            const fsdp_ckpt_param *p = &cu->params[i];
            fsdp_sbuf_printf(&b, "param %s shape ", p->name);
            for (int d = 0; d < p->ndim; d++)
                fsdp_sbuf_printf(&b, "%s%" PRId64, d ? "," : "", p->shape[d]);
            fsdp_sbuf_printf(&b, " offset %zu numel %zu\n", p->offset, p->numel);
        }
    }
    fsdp_sbuf_printf(&b, "end\n");
    if (b.oom) {
        free(b.p);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing manifest '%s'", path);
    }
    fsdp_status st = write_text_file(path, b.p, b.n);
    free(b.p);
    return st;
}

/* ---- manifest: parsing ---------------------------------------------------------- */

typedef struct parser {
    const char *path;
    int line;
} parser;

static fsdp_status bad(const parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fsdp_status bad(const parser *ps, const char *fmt, ...)
{
    char msg[FSDP_ERROR_MSG_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s' line %d: %s", ps->path,
                          ps->line, msg);
}

/* Strict unsigned decimal: digits only, no sign, no overflow, <= max. */
static bool parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!*s)
        return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        if (v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (v > max)
        return false;
    *out = v;
    return true;
}

static bool parse_int(const char *s, int lo, int hi, int *out)
{
    uint64_t v;
    if (!parse_u64(s, (uint64_t)hi, &v) || v < (uint64_t)lo)
        return false;
    *out = (int)v;
    return true;
}

static bool parse_hex64(const char *s, uint64_t *out)
{
    if (strlen(s) != 16)
        return false;
    uint64_t v = 0;
    for (; *s; s++) {
        int d = *s >= '0' && *s <= '9'   ? *s - '0'
                : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10
                                         : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* Names of units and parameters: [A-Za-z0-9._-], 1..max-1 characters. */
static bool valid_name(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n >= max)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-'))
            return false;
    return true;
}

/* Split a line into space-separated tokens (in place). Returns the count,
 * or -1 if there are more than max. */
static int tokenize(char *s, char **tok, int max)
{
    int n = 0;
    while (*s) {
        while (*s == ' ')
            s++;
        if (!*s)
            break;
        if (n == max)
            return -1;
        tok[n++] = s;
        while (*s && *s != ' ')
            s++;
        if (*s)
            *s++ = '\0';
    }
    return n;
}

enum mkey {
    K_FORMAT, K_VERSION, K_RUN_ID, K_STEP, K_ADAM_T, K_DATA_SEQUENCES, K_SEED, K_WORLD_SIZE,
    K_SHARD, K_BATCH, K_SEQ, K_GRAD_ACCUM, K_STEPS_TOTAL, K_COMPUTE_DTYPE, K_MASTER_DTYPE,
    K_OPTIM_DTYPE, K_MODEL_NAME, K_MODEL_SPEC, K_GPT2, K_VOCAB_SIZE, K_PADDED_VOCAB_SIZE,
    K_MAX_SEQ_LEN, K_DATA, K_BLOCK_NUMEL, K_COUNT
};

static const char *const mkey_names[K_COUNT] = {
    "format", "version", "run_id", "step", "adam_t", "data_sequences", "seed", "world_size",
    "shard", "batch", "seq", "grad_accum", "steps_total", "compute_dtype", "master_dtype",
    "optim_dtype", "model_name", "model_spec", "gpt2", "vocab_size", "padded_vocab_size",
    "max_seq_len", "data", "block_numel",
};

static void copy_text(char *dst, size_t n, const char *v)
{
    snprintf(dst, n, "%s", strcmp(v, "-") ? v : "");
}

static fsdp_status parse_gpt2(const parser *ps, char *v, fsdp_ckpt_manifest *m)
{
    if (!strcmp(v, "-")) {
        m->has_gpt2 = false;
        return FSDP_STATUS_OK;
    }
    char *tok[8];
    int n = tokenize(v, tok, 8);
    static const char *const keys[5] = {"layers", "heads", "channels", "vocab", "context"};
    int vals[5];
    if (n != 5)
        return bad(ps, "'gpt2' needs layers=L heads=H channels=C vocab=V context=T");
    for (int i = 0; i < 5; i++) {
        size_t kl = strlen(keys[i]);
        if (strncmp(tok[i], keys[i], kl) || tok[i][kl] != '=' ||
            !parse_int(tok[i] + kl + 1, 1, MAX_SMALL, &vals[i]))
            return bad(ps, "'gpt2': expected %s=<1..%d>, got '%s'", keys[i], MAX_SMALL, tok[i]);
    }
    fsdp_gpt2_config c = {.n_layer = vals[0], .n_head = vals[1], .n_embd = vals[2],
                          .vocab_size = vals[3], .max_seq_len = vals[4],
                          .padded_vocab_size = (vals[3] + 127) / 128 * 128};
    if (fsdp_gpt2_config_validate(&c) != FSDP_STATUS_OK)
        return bad(ps, "'gpt2': %s", fsdp_error_msg());
    m->gpt2 = c;
    m->has_gpt2 = true;
    return FSDP_STATUS_OK;
}

/* One `key value` line of the header part. */
static fsdp_status parse_header_line(const parser *ps, enum mkey k, char *v, fsdp_ckpt_manifest *m)
{
    uint64_t x;
    switch (k) {
    case K_FORMAT:
        if (strcmp(v, "fsdp-checkpoint"))
            return bad(ps, "format '%s' is not 'fsdp-checkpoint'", v);
        return FSDP_STATUS_OK;
    case K_VERSION:
        if (!parse_int(v, 0, 1 << 30, &m->version))
            return bad(ps, "version '%s' is not a number", v);
        if (m->version != FSDP_CKPT_VERSION)
            return bad(ps, "checkpoint format version %d is not supported (this build reads "
                           "version %d)", m->version, FSDP_CKPT_VERSION);
        return FSDP_STATUS_OK;
    case K_RUN_ID:
        if (!parse_hex64(v, &m->run_id) || m->run_id == 0)
            return bad(ps, "run_id '%s' is not 16 lower-case hex digits (non-zero)", v);
        return FSDP_STATUS_OK;
    case K_STEP:
    case K_ADAM_T:
    case K_DATA_SEQUENCES:
    case K_SEED:
        if (!parse_u64(v, UINT64_MAX, &x))
            return bad(ps, "%s '%s' is not an unsigned 64-bit number", mkey_names[k], v);
        *(k == K_STEP     ? &m->step
          : k == K_ADAM_T ? &m->adam_t
          : k == K_SEED   ? &m->seed
                          : &m->data_sequences) = x;
        return FSDP_STATUS_OK;
    case K_WORLD_SIZE:
        if (!parse_int(v, 1, MAX_WORLD, &m->world_size))
            return bad(ps, "world_size '%s' is not in 1..%d", v, MAX_WORLD);
        return FSDP_STATUS_OK;
    case K_SHARD:
        if (strcmp(v, "full") && strcmp(v, "grad-op") && strcmp(v, "none"))
            return bad(ps, "shard '%s' is not full, grad-op or none", v);
        snprintf(m->shard, sizeof m->shard, "%s", v);
        m->replicated = !strcmp(v, "none");
        return FSDP_STATUS_OK;
    case K_BATCH:
    case K_SEQ:
    case K_GRAD_ACCUM:
    case K_VOCAB_SIZE:
    case K_PADDED_VOCAB_SIZE:
    case K_MAX_SEQ_LEN: {
        int *dst = k == K_BATCH            ? &m->batch
                   : k == K_SEQ            ? &m->seq
                   : k == K_GRAD_ACCUM     ? &m->grad_accum
                   : k == K_VOCAB_SIZE     ? &m->vocab_size
                   : k == K_PADDED_VOCAB_SIZE ? &m->padded_vocab_size
                                           : &m->max_seq_len;
        if (!parse_int(v, 1, MAX_SMALL, dst))
            return bad(ps, "%s '%s' is not in 1..%d", mkey_names[k], v, MAX_SMALL);
        return FSDP_STATUS_OK;
    }
    case K_STEPS_TOTAL:
        if (!parse_int(v, 0, 1 << 30, &m->steps_total))
            return bad(ps, "steps_total '%s' is not a count", v);
        return FSDP_STATUS_OK;
    case K_COMPUTE_DTYPE:
        if (strcmp(v, "fp32") && strcmp(v, "bf16"))
            return bad(ps, "compute_dtype '%s' is not fp32 or bf16", v);
        snprintf(m->compute_dtype, sizeof m->compute_dtype, "%s", v);
        return FSDP_STATUS_OK;
    case K_MASTER_DTYPE:
    case K_OPTIM_DTYPE:
        if (strcmp(v, "fp32"))
            return bad(ps, "%s '%s' is not supported (only fp32 state is written)",
                       mkey_names[k], v);
        return FSDP_STATUS_OK;
    case K_MODEL_NAME: copy_text(m->model_name, sizeof m->model_name, v); return FSDP_STATUS_OK;
    case K_MODEL_SPEC: copy_text(m->model_spec, sizeof m->model_spec, v); return FSDP_STATUS_OK;
    case K_DATA: copy_text(m->data, sizeof m->data, v); return FSDP_STATUS_OK;
    case K_GPT2: return parse_gpt2(ps, v, m);
    case K_BLOCK_NUMEL:
        if (!parse_u64(v, UINT64_MAX, &x) || x != FSDP_CKPT_BLOCK_NUMEL)
            return bad(ps, "block_numel '%s' is not supported (this build uses %zu)", v,
                       FSDP_CKPT_BLOCK_NUMEL);
        return FSDP_STATUS_OK;
    default: return bad(ps, "internal: unhandled key");
    }
}

/* Cross-field checks once the header is complete. */
static fsdp_status check_header(const parser *ps, const fsdp_ckpt_manifest *m)
{
    uint64_t per_step = (uint64_t)m->batch * (uint64_t)m->world_size * (uint64_t)m->grad_accum;
    uint64_t seqs;
    if (__builtin_mul_overflow(per_step, m->step, &seqs) || seqs != m->data_sequences)
        return bad(ps, "data_sequences %" PRIu64 " is not step %" PRIu64 " x batch %d x "
                       "world_size %d x grad_accum %d",
                   m->data_sequences, m->step, m->batch, m->world_size, m->grad_accum);
    if (m->padded_vocab_size < m->vocab_size)
        return bad(ps, "padded_vocab_size %d is smaller than vocab_size %d",
                   m->padded_vocab_size, m->vocab_size);
    return FSDP_STATUS_OK;
}

static fsdp_status parse_unit_line(const parser *ps, char *line, int index, int lines_left,
                                   const fsdp_ckpt_manifest *m, fsdp_ckpt_unit *cu)
{
    char *t[16];
    int n = tokenize(line, t, 16);
    if (n != 11 || strcmp(t[0], "unit") || strcmp(t[3], "numel") || strcmp(t[5], "padded") ||
        strcmp(t[7], "shard") || strcmp(t[9], "params"))
        return bad(ps, "expected 'unit <index> <name> numel <n> padded <n> shard <n> params <n>'");
    int idx;
    if (!parse_int(t[1], 0, 1 << 30, &idx) || idx != index)
        return bad(ps, "unit index '%s' should be %d", t[1], index);
    if (!valid_name(t[2], sizeof cu->name))
        return bad(ps, "unit name '%s' is empty, too long or has characters other than "
                       "[A-Za-z0-9._-]", t[2]);
    snprintf(cu->name, sizeof cu->name, "%s", t[2]);
    uint64_t numel, padded, shard;
    if (!parse_u64(t[4], MAX_NUMEL, &numel) || numel == 0)
        return bad(ps, "unit '%s' numel '%s' is not in 1..2^48", cu->name, t[4]);
    if (!parse_u64(t[6], MAX_NUMEL, &padded) || padded < numel)
        return bad(ps, "unit '%s' padded numel '%s' is not in numel..2^48", cu->name, t[6]);
    if (!parse_u64(t[8], MAX_NUMEL, &shard) || shard == 0)
        return bad(ps, "unit '%s' shard numel '%s' is not in 1..2^48", cu->name, t[8]);
    if (m->replicated ? shard != padded
                      : padded % (uint64_t)m->world_size || padded / (uint64_t)m->world_size != shard)
        return bad(ps, "unit '%s': shard numel %" PRIu64 " does not split padded numel %" PRIu64
                       " over world_size %d with shard %s",
                   cu->name, shard, padded, m->world_size, m->shard);
    if (!parse_int(t[10], 1, lines_left > 0 ? lines_left : 1, &cu->n_params) ||
        cu->n_params > lines_left)
        return bad(ps, "unit '%s' params '%s' is not in 1..%d (the lines left in the file)",
                   cu->name, t[10], lines_left);
    cu->numel = numel;
    cu->padded_numel = padded;
    cu->shard_numel = shard;
    cu->line = ps->line;
    cu->params = calloc((size_t)cu->n_params, sizeof *cu->params);
    if (!cu->params)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading manifest '%s'",
                              ps->path);
    return FSDP_STATUS_OK;
}

static fsdp_status parse_param_line(const parser *ps, char *line, const fsdp_ckpt_unit *cu,
                                    size_t expect_offset, fsdp_ckpt_param *p)
{
    char *t[16];
    int n = tokenize(line, t, 16);
    if (n != 8 || strcmp(t[0], "param") || strcmp(t[2], "shape") || strcmp(t[4], "offset") ||
        strcmp(t[6], "numel"))
        return bad(ps, "expected 'param <name> shape <d0,d1,..> offset <n> numel <n>' (unit "
                       "'%s' declares %d parameters)", cu->name, cu->n_params);
    if (!valid_name(t[1], sizeof p->name))
        return bad(ps, "parameter name '%s' is empty, too long or has characters other than "
                       "[A-Za-z0-9._-]", t[1]);
    snprintf(p->name, sizeof p->name, "%s", t[1]);
    /* shape: 1..4 positive dims, comma separated */
    char *s = t[3];
    uint64_t prod = 1;
    p->ndim = 0;
    for (;;) {
        char *comma = strchr(s, ',');
        if (comma)
            *comma = '\0';
        uint64_t d;
        if (p->ndim == 4 || !parse_u64(s, MAX_DIM, &d) || d == 0)
            return bad(ps, "parameter '%s': shape needs 1 to 4 dimensions in 1..2^40", p->name);
        if (__builtin_mul_overflow(prod, d, &prod) || prod > MAX_NUMEL)
            return bad(ps, "parameter '%s': shape has more than 2^48 elements", p->name);
        p->shape[p->ndim++] = (int64_t)d;
        if (!comma)
            break;
        s = comma + 1;
    }
    uint64_t off, numel;
    if (!parse_u64(t[5], MAX_NUMEL, &off) || !parse_u64(t[7], MAX_NUMEL, &numel))
        return bad(ps, "parameter '%s': offset and numel must be numbers up to 2^48", p->name);
    if (numel != prod)
        return bad(ps, "parameter '%s': numel %" PRIu64 " is not the product of its shape (%" PRIu64
                       ")", p->name, numel, prod);
    if (off != expect_offset)
        return bad(ps, "parameter '%s': offset %" PRIu64 " should be %zu (parameters tile the "
                       "unit's flat buffer in order)", p->name, off, expect_offset);
    if (off + numel > cu->numel)
        return bad(ps, "parameter '%s' ends at %" PRIu64 ", past unit '%s''s numel %zu", p->name,
                   off + numel, cu->name, cu->numel);
    p->numel = numel;
    p->offset = off;
    p->line = ps->line;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_manifest_read(const char *path, fsdp_ckpt_manifest *m)
{
    memset(m, 0, sizeof *m);
    fsdp_status st = FSDP_STATUS_OK;
    char *text = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fsdp_error_set(errno == ENOENT ? FSDP_STATUS_FORMAT : FSDP_STATUS_IO,
                              "cannot open checkpoint manifest '%s': %s", path, errstr());
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s' is not a regular file",
                              path);
    }
    if ((uint64_t)sb.st_size > MANIFEST_MAX_BYTES) {
        fclose(f);
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint manifest '%s' is %lld bytes, more than the %zu MiB a "
                              "manifest can be", path, (long long)sb.st_size,
                              MANIFEST_MAX_BYTES >> 20);
    }
    size_t size = (size_t)sb.st_size;
    text = malloc(size + 1);
    if (!text) {
        fclose(f);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading manifest '%s'", path);
    }
    size_t got = fread(text, 1, size, f);
    fclose(f);
    if (got != size) {
        free(text);
        return fsdp_error_set(FSDP_STATUS_IO, "cannot read checkpoint manifest '%s'", path);
    }
    text[size] = '\0';

    parser ps = {.path = path, .line = 0};
    bool seen[K_COUNT] = {false};
    enum { HEADER, UNITS, END } phase = HEADER;
    int unit = 0, param = 0;
    size_t offset = 0;
    char *cur = text;
    while (cur < text + size) {
        char *nl = memchr(cur, '\n', (size_t)(text + size - cur));
        char *line = cur;
        size_t len = nl ? (size_t)(nl - cur) : (size_t)(text + size - cur);
        cur += len + (nl ? 1 : 0);
        line[len] = '\0';
        ps.line++;
        if (len > MANIFEST_LINE_MAX) {
            st = bad(&ps, "line is longer than %d characters", MANIFEST_LINE_MAX);
            goto fail;
        }
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f) {
                st = bad(&ps, "control character 0x%02x at column %zu (a manifest is plain text)",
                         (unsigned char)line[i], i + 1);
                goto fail;
            }
        if (len == 0 || line[0] == '#')
            continue;
        /* declared counts are bounded by the lines the rest of the file can
         * hold, so a hostile count cannot size a large allocation */
        int lines_left = (int)((size_t)(text + size - cur) / MANIFEST_MIN_LINE);
        if (phase == END) {
            st = bad(&ps, "text after 'end'");
            goto fail;
        }
        if (phase == HEADER) {
            char *sp = strchr(line, ' ');
            char *key = line, *val = sp ? sp + 1 : line + len;
            if (sp)
                *sp = '\0';
            if (!strcmp(key, "units")) {
                for (int k = 0; k < K_COUNT; k++)
                    if (!seen[k]) {
                        st = bad(&ps, "key '%s' is missing before 'units'", mkey_names[k]);
                        goto fail;
                    }
                FSDP_CHECK(check_header(&ps, m));
                if (!parse_int(val, 1, lines_left > 0 ? lines_left : 1, &m->n_units) ||
                    m->n_units > lines_left) {
                    st = bad(&ps, "units '%s' is not in 1..%d (the lines left in the file)", val,
                             lines_left);
                    goto fail;
                }
                m->units = calloc((size_t)m->n_units, sizeof *m->units);
                if (!m->units) {
                    m->n_units = 0;
                    st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", path);
                    goto fail;
                }
                phase = UNITS;
                continue;
            }
            int k = 0;
            while (k < K_COUNT && strcmp(key, mkey_names[k]))
                k++;
            if (k == K_COUNT) {
                st = bad(&ps, "unknown key '%.64s'", key);
                goto fail;
            }
            if (seen[k]) {
                st = bad(&ps, "key '%s' appears twice", key);
                goto fail;
            }
            if (!*val) {
                st = bad(&ps, "key '%s' has no value", key);
                goto fail;
            }
            if (k != K_VERSION && k != K_FORMAT && !seen[K_VERSION]) {
                st = bad(&ps, "'format' and 'version' must come first");
                goto fail;
            }
            seen[k] = true;
            FSDP_CHECK(parse_header_line(&ps, (enum mkey)k, val, m));
            continue;
        }
        /* UNITS */
        if (unit < m->n_units && param == 0 && !m->units[unit].params) {
            FSDP_CHECK(parse_unit_line(&ps, line, unit, lines_left, m, &m->units[unit]));
            offset = 0;
            continue;
        }
        if (unit == m->n_units) {
            if (strcmp(line, "end")) {
                st = bad(&ps, "expected 'end' after the %d units", m->n_units);
                goto fail;
            }
            phase = END;
            continue;
        }
        fsdp_ckpt_unit *cu = &m->units[unit];
        FSDP_CHECK(parse_param_line(&ps, line, cu, offset, &cu->params[param]));
        offset += cu->params[param].numel;
        if (++param == cu->n_params) {
            if (offset != cu->numel) {
                st = bad(&ps, "unit '%s''s parameters hold %zu elements, its numel is %zu",
                         cu->name, offset, cu->numel);
                goto fail;
            }
            param = 0;
            unit++;
        }
    }
    if (phase != END) {
        ps.line++;
        st = phase == HEADER ? bad(&ps, "the file ends before 'units' (truncated?)")
                             : bad(&ps, "the file ends before 'end' (truncated?)");
        goto fail;
    }
    free(text);
    return FSDP_STATUS_OK;
fail:
    free(text);
    fsdp_ckpt_manifest_free(m);
    return st;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, ")");
}

fsdp_status fsdp_ckpt_manifest_check_model(const fsdp_ckpt_manifest *m, const char *path,
                                           const fsdp_model *model)
{
    char hint[320];
    if (m->model_spec[0])
        snprintf(hint, sizeof hint, "; the checkpoint was written for model '%s': resume with "
                                    "--model '%s'", m->model_name, m->model_spec);
    else
        snprintf(hint, sizeof hint, "; the checkpoint was written for model '%s'", m->model_name);
    if (m->n_units != model->n_units)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint manifest '%s': %d units, but model '%s' has %d%s", path,
                              m->n_units, model->name, model->n_units, hint);
    for (int u = 0; u < m->n_units; u++) {
        const fsdp_ckpt_unit *cu = &m->units[u];
        const fsdp_unit_spec *us = &model->units[u];
        if (strcmp(cu->name, us->name) || cu->numel != us->numel || cu->n_params != us->n_params)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "checkpoint manifest '%s' line %d: unit %d is '%s' (%zu "
                                  "elements, %d parameters), but model '%s' has '%s' (%zu, %d)%s",
                                  path, cu->line, u, cu->name, cu->numel, cu->n_params,
                                  model->name, us->name, us->numel, us->n_params, hint);
        for (int i = 0; i < cu->n_params; i++) {
            const fsdp_ckpt_param *p = &cu->params[i];
            const fsdp_param_spec *q = &us->params[i];
            bool same = !strcmp(p->name, q->name) && p->ndim == q->ndim &&
                        p->offset == q->offset && p->numel == q->numel;
            for (int d = 0; same && d < p->ndim; d++)
                same = p->shape[d] == q->shape[d];
            if (!same) {
                char a[96], b[96];
                fmt_shape(a, sizeof a, p->ndim, p->shape);
                fmt_shape(b, sizeof b, q->ndim, q->shape);
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "checkpoint manifest '%s' line %d: parameter '%s' %s at "
                                      "offset %zu does not match model '%s''s '%s' %s at offset "
                                      "%zu%s",
                                      path, p->line, p->name, a, p->offset, model->name, q->name,
                                      b, q->offset, hint);
            }
        }
    }
    return FSDP_STATUS_OK;
}

/* ---- directories ------------------------------------------------------------- */

fsdp_status fsdp_ckpt_step_path(char *out, size_t n, const char *dir, uint64_t step,
                                const char *suffix)
{
    int k = snprintf(out, n, "%s/step_%08" PRIu64 "%s", dir, step, suffix ? suffix : "");
    if (k < 0 || (size_t)k >= n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoint path under '%s' is too long",
                              dir);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_rank_path(char *out, size_t n, const char *ckpt, int rank)
{
    int k = snprintf(out, n, "%s/rank_%05d.bin", ckpt, rank);
    if (k < 0 || (size_t)k >= n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoint path under '%s' is too long",
                              ckpt);
    return FSDP_STATUS_OK;
}

bool fsdp_ckpt_is_complete(const char *ckpt)
{
    char p[FSDP_CKPT_PATH_MAX];
    struct stat sb;
    if (snprintf(p, sizeof p, "%s/DONE", ckpt) >= (int)sizeof p)
        return false;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* "step_<digits><suffix>" -> step; false for any other name. */
static bool parse_entry(const char *name, const char *suffix, uint64_t *step)
{
    if (strncmp(name, "step_", 5))
        return false;
    const char *d = name + 5, *e = d;
    while (*e >= '0' && *e <= '9')
        e++;
    if (e == d || e - d > 19 || strcmp(e, suffix))
        return false;
    char digits[24];
    memcpy(digits, d, (size_t)(e - d));
    digits[e - d] = '\0';
    return parse_u64(digits, UINT64_MAX, step);
}

/* Every complete checkpoint's step in dir, ascending (caller frees). */
static fsdp_status list_complete(const char *dir, uint64_t **steps, int *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return FSDP_STATUS_OK;
        return fsdp_error_set(FSDP_STATUS_IO, "cannot list checkpoint directory '%s': %s", dir,
                              errstr());
    }
    int cap = 0;
    struct dirent *de;
    fsdp_status st = FSDP_STATUS_OK;
    while ((de = readdir(d))) {
        uint64_t s;
        char p[FSDP_CKPT_PATH_MAX];
        if (!parse_entry(de->d_name, "", &s))
            continue;
        if (fsdp_ckpt_step_path(p, sizeof p, dir, s, "") != FSDP_STATUS_OK ||
            !fsdp_ckpt_is_complete(p))
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *q = realloc(*steps, (size_t)cap * sizeof *q);
            if (!q) {
                st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory listing '%s'", dir);
                break;
            }
            *steps = q;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (st != FSDP_STATUS_OK) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return st;
    }
    /* insertion sort: a handful of entries */
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            uint64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_latest(const char *dir, uint64_t *step, bool *found)
{
    uint64_t *steps;
    int n;
    *found = false;
    FSDP_TRY(list_complete(dir, &steps, &n));
    if (n > 0) {
        *step = steps[n - 1];
        *found = true;
    }
    free(steps);
    return FSDP_STATUS_OK;
}

/* Remove a checkpoint directory we wrote: its files, then itself. Our
 * checkpoints hold only regular files; anything else makes this fail. */
static fsdp_status remove_ckpt_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? FSDP_STATUS_OK
                               : fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s' to remove it: %s",
                                                path, errstr());
    struct dirent *de;
    fsdp_status st = FSDP_STATUS_OK;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char p[FSDP_CKPT_PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", path, de->d_name) >= (int)sizeof p ||
            unlink(p) != 0) {
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot remove '%s/%s': %s", path, de->d_name,
                                errstr());
            break;
        }
    }
    closedir(d);
    if (st == FSDP_STATUS_OK && rmdir(path) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot remove directory '%s': %s", path, errstr());
    return st;
}

static fsdp_status mkdir_p(const char *dir)
{
    char p[FSDP_CKPT_PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--ckpt-dir '%s' is too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return fsdp_error_set(FSDP_STATUS_IO, "cannot create checkpoint directory '%s': %s",
                                      p, errstr());
            *s = c;
            if (!c)
                break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return fsdp_error_set(FSDP_STATUS_IO, "--ckpt-dir '%s' is not a directory", dir);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_begin(const char *dir, uint64_t step)
{
    FSDP_TRY(mkdir_p(dir));
    /* leftovers of interrupted saves and deletions */
    DIR *d = opendir(dir);
    if (!d)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot list checkpoint directory '%s': %s", dir,
                              errstr());
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t s;
        if (!parse_entry(de->d_name, ".tmp", &s) && !parse_entry(de->d_name, ".old", &s))
            continue;
        char p[FSDP_CKPT_PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p)
            continue;
        if (remove_ckpt_dir(p) != FSDP_STATUS_OK)
            FSDP_WARN(FSDP_SUB_CKPT, "leaving an incomplete checkpoint behind: %s",
                      fsdp_error_msg());
    }
    closedir(d);
    char tmp[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(fsdp_ckpt_step_path(tmp, sizeof tmp, dir, step, ".tmp"));
    if (mkdir(tmp, 0755) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot create checkpoint directory '%s': %s", tmp,
                              errstr());
    return fsdp_fsync_dir(dir);
}

fsdp_status fsdp_ckpt_commit(const char *dir, uint64_t step, int keep)
{
    char tmp[FSDP_CKPT_PATH_MAX], fin[FSDP_CKPT_PATH_MAX], old[FSDP_CKPT_PATH_MAX];
    char done[FSDP_CKPT_PATH_MAX + 8];
    FSDP_TRY(fsdp_ckpt_step_path(tmp, sizeof tmp, dir, step, ".tmp"));
    FSDP_TRY(fsdp_ckpt_step_path(fin, sizeof fin, dir, step, ""));
    FSDP_TRY(fsdp_ckpt_step_path(old, sizeof old, dir, step, ".old"));
    snprintf(done, sizeof done, "%s/DONE", tmp);
    char text[96];
    int n = snprintf(text, sizeof text, "fsdp checkpoint step %" PRIu64 " complete\n", step);
    FSDP_TRY(write_text_file(done, text, (size_t)n));
    FSDP_TRY(fsdp_fsync_dir(tmp));
    /* a complete checkpoint of the same step (a restarted run) is moved
     * aside first: rename() cannot replace a non-empty directory */
    struct stat sb;
    bool replaced = false;
    if (stat(fin, &sb) == 0) {
        if (rename(fin, old) != 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot move the earlier '%s' aside: %s", fin,
                                  errstr());
        replaced = true;
    }
    if (rename(tmp, fin) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot rename '%s' to '%s': %s", tmp, fin,
                              errstr());
    FSDP_TRY(fsdp_fsync_dir(dir));
    if (replaced && remove_ckpt_dir(old) != FSDP_STATUS_OK)
        FSDP_WARN(FSDP_SUB_CKPT, "%s", fsdp_error_msg());
    if (keep <= 0)
        return FSDP_STATUS_OK;

    /* retention: only now that `step` is complete */
    uint64_t *steps;
    int cnt;
    FSDP_TRY(list_complete(dir, &steps, &cnt));
    int kept = 0;
    bool removed = false;
    for (int i = cnt - 1; i >= 0; i--) {
        if (steps[i] == step || kept < keep - 1) {
            kept += steps[i] != step;
            continue;
        }
        char p[FSDP_CKPT_PATH_MAX], q[FSDP_CKPT_PATH_MAX];
        if (fsdp_ckpt_step_path(p, sizeof p, dir, steps[i], "") != FSDP_STATUS_OK ||
            fsdp_ckpt_step_path(q, sizeof q, dir, steps[i], ".old") != FSDP_STATUS_OK)
            continue;
        /* rename first, so a crash mid-removal leaves no half checkpoint
         * under a complete-looking name */
        if (rename(p, q) != 0)
            FSDP_WARN(FSDP_SUB_CKPT, "cannot remove old checkpoint '%s': %s", p, errstr());
        else if (remove_ckpt_dir(q) != FSDP_STATUS_OK)
            FSDP_WARN(FSDP_SUB_CKPT, "%s", fsdp_error_msg());
        removed = true;
    }
    free(steps);
    return removed ? fsdp_fsync_dir(dir) : FSDP_STATUS_OK;
}

/* ---- shard files --------------------------------------------------------------- */

/* Byte layout of a shard file, computed from its unit sizes. */
typedef struct shard_layout {
    size_t table_bytes;        /* header + unit table + checksum table */
    size_t n_sums;
    size_t *sum0;              /* [n_units] first checksum index of the unit */
    uint64_t *payload;         /* [n_units] byte offset of the unit's master array */
    uint64_t total;            /* file size */
} shard_layout;

static size_t n_blocks(size_t numel)
{
    return (numel + FSDP_CKPT_BLOCK_NUMEL - 1) / FSDP_CKPT_BLOCK_NUMEL;
}

static void layout_free(shard_layout *l)
{
    free(l->sum0);
    free(l->payload);
    memset(l, 0, sizeof *l);
}

static fsdp_status layout_init(shard_layout *l, int n_units, const size_t *shard_numel,
                               const char *path)
{
    memset(l, 0, sizeof *l);
    l->sum0 = calloc((size_t)n_units + 1, sizeof *l->sum0);
    l->payload = calloc((size_t)n_units + 1, sizeof *l->payload);
    if (!l->sum0 || !l->payload) {
        layout_free(l);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
    }
    uint64_t sums = 0;
    for (int u = 0; u < n_units; u++) {
        l->sum0[u] = (size_t)sums;
        sums += FSDP_CKPT_N_ARRAYS * (uint64_t)n_blocks(shard_numel[u]);
    }
    l->n_sums = (size_t)sums;
    uint64_t off = SHARD_HEADER_BYTES + 16 * (uint64_t)n_units + 8 * sums;
    l->table_bytes = (size_t)off;
    off = (off + 63) / 64 * 64;
    bool ovf = false;
    for (int u = 0; u < n_units; u++) {
        l->payload[u] = off;
        uint64_t bytes;
        ovf |= __builtin_mul_overflow((uint64_t)shard_numel[u], 4 * FSDP_CKPT_N_ARRAYS, &bytes);
        ovf |= __builtin_add_overflow(off, bytes, &off);
    }
    if (ovf) {
        layout_free(l);
        return fsdp_error_set(FSDP_STATUS_FORMAT, "shard file '%s' would exceed 2^64 bytes", path);
    }
    l->total = off;
    return FSDP_STATUS_OK;
}

static uint64_t block_offset(const shard_layout *l, int u, size_t S, fsdp_ckpt_array a, size_t b)
{
    return l->payload[u] + ((uint64_t)a * S + (uint64_t)b * FSDP_CKPT_BLOCK_NUMEL) * 4;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Header field offsets. */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_BYTES = 12, H_RANK = 16, H_WORLD = 20, H_UNITS = 24,
    H_BLOCK = 28, H_RUN_ID = 32, H_STEP = 40, H_ADAM_T = 48, H_SUM = 56
};

struct fsdp_ckpt_writer {
    int fd;
    char path[FSDP_CKPT_PATH_MAX];
    fsdp_ckpt_shard_info info;
    size_t *shard_numel, *first;
    shard_layout lay;
    uint64_t *sums;
    unsigned char *written;    /* [n_sums] */
};

static void writer_free(fsdp_ckpt_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    free(w->shard_numel);
    free(w->first);
    free(w->sums);
    free(w->written);
    layout_free(&w->lay);
    free(w);
}

fsdp_status fsdp_ckpt_writer_open(fsdp_ckpt_writer **out, const char *path,
                                  const fsdp_ckpt_shard_info *info)
{
    *out = NULL;
    fsdp_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
    w->fd = -1;
    snprintf(w->path, sizeof w->path, "%s", path);
    w->info = *info;
    size_t U = (size_t)info->n_units;
    w->shard_numel = malloc(U * sizeof(size_t) + 1);
    w->first = malloc(U * sizeof(size_t) + 1);
    fsdp_status st;
    if (!w->shard_numel || !w->first) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    memcpy(w->shard_numel, info->shard_numel, U * sizeof(size_t));
    memcpy(w->first, info->first, U * sizeof(size_t));
    w->info.shard_numel = w->shard_numel;
    w->info.first = w->first;
    FSDP_CHECK(layout_init(&w->lay, info->n_units, w->shard_numel, path));
    w->sums = calloc(w->lay.n_sums + 1, sizeof *w->sums);
    w->written = calloc(w->lay.n_sums + 1, 1);
    if (!w->sums || !w->written) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot create checkpoint file '%s': %s", path,
                            errstr());
        goto fail;
    }
    *out = w;
    return FSDP_STATUS_OK;
fail:
    writer_free(w);
    return st;
}

fsdp_status fsdp_ckpt_writer_put(fsdp_ckpt_writer *w, int u, fsdp_ckpt_array a, size_t block,
                                 const float *data)
{
    FSDP_ASSERT(u >= 0 && u < w->info.n_units && (unsigned)a < FSDP_CKPT_N_ARRAYS);
    size_t S = w->shard_numel[u], nb = n_blocks(S);
    FSDP_ASSERT(block < nb);
    size_t lo = block * FSDP_CKPT_BLOCK_NUMEL;
    size_t n = S - lo < FSDP_CKPT_BLOCK_NUMEL ? S - lo : FSDP_CKPT_BLOCK_NUMEL;
    FSDP_TRY(write_all(w->fd, data, n * 4, (off_t)block_offset(&w->lay, u, S, a, block), w->path));
    size_t k = w->lay.sum0[u] + (size_t)a * nb + block;
    w->sums[k] = hash_bytes(FNV_OFFSET, data, n * 4);
    w->written[k] = 1;
    return FSDP_STATUS_OK;
}

/* Header + unit table + checksum table, with the header checksum filled. */
static unsigned char *build_tables(const fsdp_ckpt_shard_info *info, const shard_layout *lay,
                                   const uint64_t *sums)
{
    unsigned char *h = calloc(lay->table_bytes, 1);
    if (!h)
        return NULL;
    memcpy(h + H_MAGIC, SHARD_MAGIC, 8);
    put_u32(h + H_VERSION, FSDP_CKPT_VERSION);
    put_u32(h + H_HEADER_BYTES, SHARD_HEADER_BYTES);
    put_u32(h + H_RANK, (uint32_t)info->rank);
    put_u32(h + H_WORLD, (uint32_t)info->world_size);
    put_u32(h + H_UNITS, (uint32_t)info->n_units);
    put_u32(h + H_BLOCK, (uint32_t)FSDP_CKPT_BLOCK_NUMEL);
    put_u64(h + H_RUN_ID, info->run_id);
    put_u64(h + H_STEP, info->step);
    put_u64(h + H_ADAM_T, info->adam_t);
    unsigned char *t = h + SHARD_HEADER_BYTES;
    for (int u = 0; u < info->n_units; u++) {
        put_u64(t + 16 * (size_t)u, info->shard_numel[u]);
        put_u64(t + 16 * (size_t)u + 8, info->first[u]);
    }
    unsigned char *s = t + 16 * (size_t)info->n_units;
    for (size_t i = 0; i < lay->n_sums; i++)
        put_u64(s + 8 * i, sums[i]);
    put_u64(h + H_SUM, hash_bytes(FNV_OFFSET, h, lay->table_bytes));
    return h;
}

fsdp_status fsdp_ckpt_writer_close(fsdp_ckpt_writer *w)
{
    fsdp_status st = FSDP_STATUS_OK;
    for (size_t i = 0; i < w->lay.n_sums; i++)
        if (!w->written[i]) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "shard file '%s': block %zu never written",
                                w->path, i);
            goto done;
        }
    unsigned char *h = build_tables(&w->info, &w->lay, w->sums);
    if (!h) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", w->path);
        goto done;
    }
    st = write_all(w->fd, h, w->lay.table_bytes, 0, w->path);
    free(h);
    /* the padding between the tables and the payload, and a file that is
     * exactly the layout's size even if some array is empty */
    if (st == FSDP_STATUS_OK && ftruncate(w->fd, (off_t)w->lay.total) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot size checkpoint file '%s': %s", w->path,
                            errstr());
    if (st == FSDP_STATUS_OK && fsync(w->fd) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot fsync checkpoint file '%s': %s", w->path,
                            errstr());
    if (close(w->fd) != 0 && st == FSDP_STATUS_OK)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot close checkpoint file '%s': %s", w->path,
                            errstr());
    w->fd = -1;
done:
    writer_free(w);
    return st;
}

void fsdp_ckpt_writer_abort(fsdp_ckpt_writer *w)
{
    if (w)
        writer_free(w);
}

struct fsdp_ckpt_reader {
    int fd;
    char path[FSDP_CKPT_PATH_MAX];
    int n_units;
    size_t *shard_numel;
    shard_layout lay;
    uint64_t *sums;
    float *block;              /* FSDP_CKPT_BLOCK_NUMEL: the last verified block */
    int cached_u;
    int cached_a;
    size_t cached_b;
};

void fsdp_ckpt_reader_close(fsdp_ckpt_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->shard_numel);
    free(r->sums);
    free(r->block);
    layout_free(&r->lay);
    free(r);
}

fsdp_status fsdp_ckpt_reader_open(fsdp_ckpt_reader **out, const char *path,
                                  const fsdp_ckpt_shard_info *ex)
{
    *out = NULL;
    fsdp_status st;
    unsigned char *h = NULL;
    fsdp_ckpt_reader *r = calloc(1, sizeof *r);
    if (!r)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
    r->fd = -1;
    r->cached_u = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->n_units = ex->n_units;
    r->shard_numel = malloc((size_t)ex->n_units * sizeof(size_t) + 1);
    r->block = malloc(FSDP_CKPT_BLOCK_NUMEL * sizeof(float));
    if (!r->shard_numel || !r->block) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    memcpy(r->shard_numel, ex->shard_numel, (size_t)ex->n_units * sizeof(size_t));
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        st = fsdp_error_set(errno == ENOENT ? FSDP_STATUS_FORMAT : FSDP_STATUS_IO,
                            "cannot open checkpoint shard file '%s': %s%s", path, errstr(),
                            errno == ENOENT ? " (the checkpoint is missing a rank's file)" : "");
        goto fail;
    }
    struct stat sb;
    if (fstat(r->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint shard '%s' is not a regular file",
                            path);
        goto fail;
    }
    unsigned char hd[SHARD_HEADER_BYTES];
    if ((uint64_t)sb.st_size < SHARD_HEADER_BYTES) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' is %lld bytes, shorter than its %d-byte "
                            "header (truncated)", path, (long long)sb.st_size,
                            SHARD_HEADER_BYTES);
        goto fail;
    }
    FSDP_CHECK(read_all(r->fd, hd, sizeof hd, 0, path));
    if (memcmp(hd + H_MAGIC, SHARD_MAGIC, 8)) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "'%s' is not an fsdp checkpoint shard (bad magic)", path);
        goto fail;
    }
    if (get_u32(hd + H_VERSION) != FSDP_CKPT_VERSION) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' has format version %u; this build reads "
                            "version %d", path, get_u32(hd + H_VERSION), FSDP_CKPT_VERSION);
        goto fail;
    }
    FSDP_CHECK(layout_init(&r->lay, ex->n_units, r->shard_numel, path));
    if ((uint64_t)sb.st_size != r->lay.total) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' is %lld bytes, but the manifest's layout for "
                            "rank %d needs %" PRIu64 " (truncated, or not written for this "
                            "checkpoint)", path, (long long)sb.st_size, ex->rank, r->lay.total);
        goto fail;
    }
    h = malloc(r->lay.table_bytes);
    r->sums = malloc(r->lay.n_sums * sizeof *r->sums + 1);
    if (!h || !r->sums) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    FSDP_CHECK(read_all(r->fd, h, r->lay.table_bytes, 0, path));
    uint64_t want = get_u64(h + H_SUM);
    put_u64(h + H_SUM, 0);
    if (hash_bytes(FNV_OFFSET, h, r->lay.table_bytes) != want) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s': header checksum mismatch (the file is "
                            "corrupted)", path);
        goto fail;
    }
    if (get_u32(h + H_HEADER_BYTES) != SHARD_HEADER_BYTES ||
        get_u32(h + H_BLOCK) != FSDP_CKPT_BLOCK_NUMEL ||
        get_u32(h + H_UNITS) != (uint32_t)ex->n_units) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' has %u units (block %u), the manifest %d "
                            "(block %zu)", path, get_u32(h + H_UNITS), get_u32(h + H_BLOCK),
                            ex->n_units, FSDP_CKPT_BLOCK_NUMEL);
        goto fail;
    }
    if (get_u64(h + H_RUN_ID) != ex->run_id || get_u64(h + H_STEP) != ex->step) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' belongs to another checkpoint (run %016" PRIx64
                            " step %" PRIu64 ", the manifest's is run %016" PRIx64 " step %" PRIu64
                            "): files of different checkpoints were mixed",
                            path, get_u64(h + H_RUN_ID), get_u64(h + H_STEP), ex->run_id,
                            ex->step);
        goto fail;
    }
    if (get_u32(h + H_RANK) != (uint32_t)ex->rank ||
        get_u32(h + H_WORLD) != (uint32_t)ex->world_size) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' is rank %u of %u, expected rank %d of %d", path,
                            get_u32(h + H_RANK), get_u32(h + H_WORLD), ex->rank, ex->world_size);
        goto fail;
    }
    if (get_u64(h + H_ADAM_T) != ex->adam_t) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' has Adam step %" PRIu64 ", the manifest %" PRIu64,
                            path, get_u64(h + H_ADAM_T), ex->adam_t);
        goto fail;
    }
    const unsigned char *t = h + SHARD_HEADER_BYTES;
    for (int u = 0; u < ex->n_units; u++) {
        uint64_t S = get_u64(t + 16 * (size_t)u), first = get_u64(t + 16 * (size_t)u + 8);
        if (S != ex->shard_numel[u] || first != ex->first[u]) {
            st = fsdp_error_set(FSDP_STATUS_FORMAT,
                                "checkpoint shard '%s' unit %d holds elements [%" PRIu64
                                ", +%" PRIu64 "), the manifest says [%zu, +%zu)",
                                path, u, first, S, ex->first[u], ex->shard_numel[u]);
            goto fail;
        }
    }
    const unsigned char *s = t + 16 * (size_t)ex->n_units;
    for (size_t i = 0; i < r->lay.n_sums; i++)
        r->sums[i] = get_u64(s + 8 * i);
    free(h);
    *out = r;
    return FSDP_STATUS_OK;
fail:
    free(h);
    fsdp_ckpt_reader_close(r);
    return st;
}

fsdp_status fsdp_ckpt_reader_read(fsdp_ckpt_reader *r, int u, fsdp_ckpt_array a, size_t first,
                                  size_t n, float *dst)
{
    FSDP_ASSERT(u >= 0 && u < r->n_units && (unsigned)a < FSDP_CKPT_N_ARRAYS);
    size_t S = r->shard_numel[u];
    FSDP_ASSERT(first <= S && n <= S - first);
    size_t nb = n_blocks(S);
    while (n > 0) {
        size_t b = first / FSDP_CKPT_BLOCK_NUMEL, lo = b * FSDP_CKPT_BLOCK_NUMEL;
        size_t len = S - lo < FSDP_CKPT_BLOCK_NUMEL ? S - lo : FSDP_CKPT_BLOCK_NUMEL;
        if (r->cached_u != u || r->cached_a != (int)a || r->cached_b != b) {
            r->cached_u = -1;
            FSDP_TRY(read_all(r->fd, r->block, len * 4,
                              (off_t)block_offset(&r->lay, u, S, a, b), r->path));
            uint64_t want = r->sums[r->lay.sum0[u] + (size_t)a * nb + b];
            if (hash_bytes(FNV_OFFSET, r->block, len * 4) != want)
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "checkpoint shard '%s': unit %d %s elements [%zu, %zu) "
                                      "fail their checksum (the file is corrupted)",
                                      r->path, u, fsdp_ckpt_array_name(a), lo, lo + len);
            r->cached_u = u;
            r->cached_a = (int)a;
            r->cached_b = b;
        }
        size_t k = first - lo, take = len - k < n ? len - k : n;
        memcpy(dst, r->block + k, take * 4);
        dst += take;
        first += take;
        n -= take;
    }
    return FSDP_STATUS_OK;
}

/* ---- test hook and run ids ------------------------------------------------------ */

static atomic_ullong stall_from;
static atomic_int stall_ms;

void fsdp_ckpt_test_set_stall(uint64_t from_step, int ms)
{
    atomic_store(&stall_from, (unsigned long long)from_step);
    atomic_store(&stall_ms, ms > 0 ? ms : 0);
}

int fsdp_ckpt_test_stall_ms(uint64_t step)
{
    int ms = atomic_load(&stall_ms);
    return ms > 0 && step >= (uint64_t)atomic_load(&stall_from) ? ms : 0;
}

uint64_t fsdp_ckpt_new_run_id(void)
{
    static atomic_ullong counter;
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = fsdp_rng_mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                         ((uint64_t)getpid() << 16) ^ atomic_fetch_add(&counter, 1));
    }
    return v ? v : 1;
}
