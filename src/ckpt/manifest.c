/*
 * manifest.c - the checkpoint manifest read back (versions 1 to 3) with
 * every field validated, and its checksum (the format is described in
 * manifest.h; writing is in manifest_write.c; the model part, building the
 * recorded model and checking against it, is in manifest_model.c).
 *
 * Everything read from disk is treated as hostile: the parser bounds every
 * number before it sizes an allocation or a computation (all size
 * arithmetic is overflow-checked in 64 bits), and every key must appear
 * exactly once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/hfdir.h"
#include "ckpt/manifest.h"
#include "core/error.h"
#include "core/fileio.h"

#define MANIFEST_MAX_BYTES ((size_t)16 << 20)
#define MANIFEST_MIN_LINE 32 /* bytes of the shortest unit or param line */
#define MAX_NUMEL ((uint64_t)1 << 48)     /* per unit or parameter */
#define MAX_DIM ((uint64_t)1 << 40)
#define MAX_WORLD 65536
#define MAX_SMALL (1 << 24)               /* batch, seq, vocab, ... */

static const char *errstr(void) { return strerror(errno); }

/* ---- manifest: freeing --------------------------------------------------------- */

void fsdp_ckpt_manifest_free(fsdp_ckpt_manifest *m)
{
    if (m->units)
        for (int u = 0; u < m->n_units; u++)
            free(m->units[u].params);
    free(m->units);
    for (int i = 0; i < m->n_tok_files; i++)
        free(m->tok_files[i].data);
    memset(m, 0, sizeof *m);
}

/* ---- manifest: parsing ---------------------------------------------------------- */

/* What a version-1 manifest says about its model, held until the header
 * is complete and its lines can be checked against each other. */
typedef struct v1_model {
    char spec[FSDP_MODEL_NAME_MAX];   /* model_spec; "" for '-' */
    char gpt2[FSDP_MODEL_CONFIG_MAX]; /* the 'gpt2' line as a config key list; "" for '-' */
    int vocab_size, padded_vocab_size, max_seq_len;
    int spec_line, gpt2_line, sizes_line;
} v1_model;

/* Version 1 knew one model family; its 'gpt2' line named it. */
#define V1_FAMILY "gpt2"

typedef struct parser {
    const char *path;
    int line;
    v1_model v1;
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
    K_MAX_SEQ_LEN, K_MODEL_FAMILY, K_MODEL_CONFIG, K_DATA, K_BLOCK_NUMEL, K_OPTIMIZER,
    K_OPTIM_STATE, K_SHARD_RANKS, K_TOKENIZER, K_LORA, K_FREEZE, K_BASE, K_SCHEDULE,
    K_EVAL_STANDING, K_QUANTIZE, K_COUNT
};

static const char *const mkey_names[K_COUNT] = {
    "format", "version", "run_id", "step", "adam_t", "data_sequences", "seed", "world_size",
    "shard", "batch", "seq", "grad_accum", "steps_total", "compute_dtype", "master_dtype",
    "optim_dtype", "model_name", "model_spec", "gpt2", "vocab_size", "padded_vocab_size",
    "max_seq_len", "model_family", "model_config", "data", "block_numel", "optimizer",
    "optim_state", "shard_ranks", "tokenizer", "lora", "freeze", "base", "schedule",
    "eval_standing", "quantize",
};

/* Keys a manifest may leave out (their meaning when absent is in manifest.h). */
static const bool mkey_optional[K_COUNT] = {[K_SHARD_RANKS] = true, [K_LORA] = true,
                                            [K_FREEZE] = true, [K_BASE] = true,
                                            [K_SCHEDULE] = true, [K_EVAL_STANDING] = true,
                                            [K_QUANTIZE] = true};

/* The versions each key belongs to (bit v set: version v has it, once). */
#define V1 (1u << 1)
#define V2 (1u << 2)
#define V3 (1u << 3)
static const unsigned mkey_versions[K_COUNT] = {
    [K_MODEL_SPEC] = V1, [K_GPT2] = V1, [K_VOCAB_SIZE] = V1, [K_PADDED_VOCAB_SIZE] = V1,
    [K_MAX_SEQ_LEN] = V1, [K_MODEL_FAMILY] = V2 | V3, [K_MODEL_CONFIG] = V2 | V3,
    [K_OPTIMIZER] = V2 | V3, [K_OPTIM_STATE] = V2 | V3, /* version 1 is AdamW */
    [K_TOKENIZER] = V3, [K_LORA] = V3, [K_FREEZE] = V3, [K_BASE] = V3, [K_SCHEDULE] = V3,
    [K_EVAL_STANDING] = V3, [K_QUANTIZE] = V3,
};
#define KEY_IN(k, version) \
    ((mkey_versions[k] ? mkey_versions[k] : V1 | V2 | V3) >> (version) & 1)

static void copy_text(char *dst, size_t n, const char *v)
{
    snprintf(dst, n, "%s", strcmp(v, "-") ? v : "");
}

/* `schedule NAME LR MIN_LR WARMUP DECAY_FRAC` (manifest.h): a [a-z0-9_] name, finite
 * numbers and warmup >= 0 (the trainer checked the settings; this is the reading). */
static fsdp_status parse_schedule(const parser *ps, const char *v, fsdp_ckpt_manifest *m)
{
    int used = 0;
    if (sscanf(v, "%15s %lf %lf %d %lf%n", m->schedule, &m->lr, &m->min_lr, &m->warmup,
               &m->decay_frac, &used) != 5 || v[used] ||
        !fsdp_ckpt_array_name_valid(m->schedule) || !isfinite(m->lr) || !isfinite(m->min_lr) ||
        m->warmup < 0 || !isfinite(m->decay_frac)) {
        m->schedule[0] = '\0';
        return bad(ps, "schedule '%.80s' is not 'NAME LR MIN_LR WARMUP DECAY_FRAC'", v);
    }
    return FSDP_STATUS_OK;
}

/* `eval_standing BEST BEST_STEP N_WORSE` (manifest.h): a finite loss and two counts. */
static fsdp_status parse_eval_standing(const parser *ps, const char *v, fsdp_ckpt_manifest *m)
{
    char step[24], worse[16];
    int used = 0;
    if (sscanf(v, "%lf %23s %15s%n", &m->eval_best, step, worse, &used) != 3 || v[used] ||
        !isfinite(m->eval_best) || !parse_u64(step, 1u << 30, &m->eval_best_step) ||
        !parse_int(worse, 0, 1 << 30, &m->eval_n_worse))
        return bad(ps, "eval_standing '%.80s' is not 'BEST_LOSS BEST_STEP N_WORSE'", v);
    m->eval_recorded = true;
    return FSDP_STATUS_OK;
}

/* Version 1's 'gpt2 layers=L heads=H channels=C vocab=V context=T' (or
 * '-'): kept as the config key list "layers=L,heads=H,...". */
static fsdp_status parse_v1_gpt2(parser *ps, char *v)
{
    ps->v1.gpt2_line = ps->line;
    if (!strcmp(v, "-"))
        return FSDP_STATUS_OK;
    char *tok[8];
    int n = tokenize(v, tok, 8);
    static const char *const keys[5] = {"layers", "heads", "channels", "vocab", "context"};
    if (n != 5)
        return bad(ps, "'gpt2' needs layers=L heads=H channels=C vocab=V context=T");
    size_t k = 0;
    for (int i = 0; i < 5; i++) {
        size_t kl = strlen(keys[i]);
        int val;
        if (strncmp(tok[i], keys[i], kl) || tok[i][kl] != '=' ||
            !parse_int(tok[i] + kl + 1, 1, MAX_SMALL, &val))
            return bad(ps, "'gpt2': expected %s=<1..%d>, got '%s'", keys[i], MAX_SMALL, tok[i]);
        k += (size_t)snprintf(ps->v1.gpt2 + k, sizeof ps->v1.gpt2 - k, "%s%s=%d", i ? "," : "",
                              keys[i], val);
    }
    return FSDP_STATUS_OK;
}

/* Version 1: the 'gpt2' line gives the family and config; model_spec and
 * the vocabulary and context sizes must say the same. */
static fsdp_status finish_v1_model(parser *ps, fsdp_ckpt_manifest *m)
{
    v1_model *v = &ps->v1;
    ps->line = v->gpt2_line;
    if (!v->gpt2[0])
        return bad(ps, "'gpt2 -': the checkpoint records no model this build can rebuild");
    snprintf(m->model_family, sizeof m->model_family, "%s", V1_FAMILY);
    m->model_line = v->gpt2_line;
    fsdp_model built, named;
    if (fsdp_model_build(fsdp_model_family_find(V1_FAMILY), v->gpt2, &built) != FSDP_STATUS_OK)
        return bad(ps, "'gpt2': %s", fsdp_error_msg());
    snprintf(m->model_config, sizeof m->model_config, "%s", built.config);
    fsdp_status st = FSDP_STATUS_OK;
    if (v->spec[0]) {
        ps->line = v->spec_line;
        if (fsdp_model_from_spec(v->spec, &named) != FSDP_STATUS_OK) {
            st = bad(ps, "model_spec '%.160s' does not name a model: %s", v->spec,
                     fsdp_error_msg());
        } else {
            if (named.family != built.family || strcmp(named.config, built.config))
                st = bad(ps, "model_spec '%.160s' (%s) and the 'gpt2' line %d (%s) describe "
                             "different models; the manifest was edited or is corrupt",
                         v->spec, named.config, v->gpt2_line, built.config);
            fsdp_model_free(&named);
        }
    }
    if (st == FSDP_STATUS_OK &&
        (v->vocab_size != built.vocab_size || v->padded_vocab_size != built.padded_vocab_size ||
         v->max_seq_len != built.max_seq_len)) {
        ps->line = v->sizes_line;
        st = bad(ps, "vocab_size %d, padded_vocab_size %d, max_seq_len %d disagree with the "
                     "'gpt2' line %d (%d, %d, %d); the manifest was edited or is corrupt",
                 v->vocab_size, v->padded_vocab_size, v->max_seq_len, v->gpt2_line,
                 built.vocab_size, built.padded_vocab_size, built.max_seq_len);
    }
    fsdp_model_free(&built);
    return st;
}

/* `optim_state A,B,...` or `-`: names valid for shard files, unique, not
 * "master". */
static fsdp_status parse_optim_state(const parser *ps, char *v, fsdp_ckpt_manifest *m)
{
    m->n_optim_state = 0;
    if (!strcmp(v, "-"))
        return FSDP_STATUS_OK;
    for (char *name = v;;) {
        char *comma = strchr(name, ',');
        if (comma)
            *comma = '\0';
        if (m->n_optim_state == FSDP_CKPT_MAX_ARRAYS - 1)
            return bad(ps, "optim_state lists more than %d arrays", FSDP_CKPT_MAX_ARRAYS - 1);
        if (!fsdp_ckpt_array_name_valid(name) || !strcmp(name, "master"))
            return bad(ps, "optim_state name '%.32s' is not a [a-z0-9_] name of at most %d "
                           "characters other than 'master'", name, FSDP_CKPT_ARRAY_NAME_MAX - 1);
        for (int k = 0; k < m->n_optim_state; k++)
            if (!strcmp(m->optim_state[k], name))
                return bad(ps, "optim_state names '%s' twice", name);
        snprintf(m->optim_state[m->n_optim_state++], FSDP_CKPT_ARRAY_NAME_MAX, "%s", name);
        if (!comma)
            return FSDP_STATUS_OK;
        name = comma + 1;
    }
}

/* A header key whose value is text: the file's identity, the strategy,
 * dtypes, the model, the data and the optimizer. */
static fsdp_status parse_text_key(parser *ps, enum mkey k, char *v, fsdp_ckpt_manifest *m)
{
    switch (k) {
    case K_FORMAT:
        if (strcmp(v, "fsdp-checkpoint"))
            return bad(ps, "format '%s' is not 'fsdp-checkpoint'", v);
        return FSDP_STATUS_OK;
    case K_SHARD:
        if (strcmp(v, "full") && strcmp(v, "grad-op") && strcmp(v, "none") && strcmp(v, "hybrid"))
            return bad(ps, "shard '%s' is not full, grad-op, none or hybrid", v);
        snprintf(m->shard, sizeof m->shard, "%s", v);
        m->replicated = !strcmp(v, "none");
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
    case K_MODEL_SPEC:
        copy_text(ps->v1.spec, sizeof ps->v1.spec, v);
        ps->v1.spec_line = ps->line;
        return FSDP_STATUS_OK;
    case K_GPT2: return parse_v1_gpt2(ps, v);
    case K_MODEL_FAMILY:
        if (!valid_name(v, sizeof m->model_family))
            return bad(ps, "model_family '%.64s' is not a family name", v);
        snprintf(m->model_family, sizeof m->model_family, "%s", v);
        return FSDP_STATUS_OK;
    case K_MODEL_CONFIG:
        if (strlen(v) >= sizeof m->model_config)
            return bad(ps, "model_config is longer than %zu characters",
                       sizeof m->model_config - 1);
        snprintf(m->model_config, sizeof m->model_config, "%s", v);
        m->model_line = ps->line;
        return FSDP_STATUS_OK;
    case K_DATA: copy_text(m->data, sizeof m->data, v); return FSDP_STATUS_OK;
    case K_TOKENIZER:
        copy_text(m->tokenizer, sizeof m->tokenizer, v);
        m->tokenizer_recorded = true;
        return FSDP_STATUS_OK;
    case K_OPTIMIZER:
        if (!fsdp_ckpt_array_name_valid(v))
            return bad(ps, "optimizer '%.32s' is not a [a-z0-9_] name", v);
        snprintf(m->optimizer, sizeof m->optimizer, "%s", v);
        return FSDP_STATUS_OK;
    case K_OPTIM_STATE: return parse_optim_state(ps, v, m);
    case K_LORA: {
        fsdp_lora_config *l = &m->lora;
        int rs = -1, used = 0;
        if (sscanf(v, "%d %lf %d %255s%n", &l->r, &l->alpha, &rs, l->targets, &used) != 4 ||
            v[used] || l->r < 1 || l->r > 4096 || !(l->alpha > 0) || !isfinite(l->alpha) ||
            (rs != 0 && rs != 1))
            return bad(ps, "lora '%.64s' is not 'R ALPHA RSLORA(0|1) TARGETS'", v);
        l->rslora = rs == 1;
        return FSDP_STATUS_OK;
    }
    case K_FREEZE:
        if (strlen(v) >= sizeof m->freeze)
            return bad(ps, "freeze is longer than %zu characters", sizeof m->freeze - 1);
        copy_text(m->freeze, sizeof m->freeze, v);
        return FSDP_STATUS_OK;
    case K_BASE: {
        int used = 0;
        if (sscanf(v, "%16" SCNx64 " %n", &m->base_hash, &used) != 1 || !used || !v[used] ||
            strlen(v + used) >= sizeof m->base)
            return bad(ps, "base '%.64s' is not 'HASH PATH'", v);
        snprintf(m->base, sizeof m->base, "%s", v + used);
        return FSDP_STATUS_OK;
    }
    case K_SCHEDULE: return parse_schedule(ps, v, m);
    case K_QUANTIZE:
        if (strcmp(v, "nf4"))
            return bad(ps, "quantize '%.64s' is not nf4", v);
        m->nf4 = true;
        return FSDP_STATUS_OK;
    case K_EVAL_STANDING: return parse_eval_standing(ps, v, m);
    default: return bad(ps, "internal: unhandled key");
    }
}

/* One `key value` line of the header part: the numbers here, the text
 * values in parse_text_key. */
static fsdp_status parse_header_line(parser *ps, enum mkey k, char *v, fsdp_ckpt_manifest *m)
{
    uint64_t x;
    switch (k) {
    case K_VERSION:
        if (!parse_int(v, 0, 1 << 30, &m->version))
            return bad(ps, "version '%s' is not a number", v);
        if (m->version < FSDP_CKPT_VERSION_MIN || m->version > FSDP_CKPT_VERSION)
            return bad(ps, "checkpoint format version %d is not supported (this build reads "
                           "versions %d to %d)", m->version, FSDP_CKPT_VERSION_MIN,
                       FSDP_CKPT_VERSION);
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
    case K_BATCH:
    case K_SEQ:
    case K_GRAD_ACCUM:
    case K_VOCAB_SIZE:
    case K_PADDED_VOCAB_SIZE:
    case K_MAX_SEQ_LEN: {
        int *dst = k == K_BATCH            ? &m->batch
                   : k == K_SEQ            ? &m->seq
                   : k == K_GRAD_ACCUM     ? &m->grad_accum
                   : k == K_VOCAB_SIZE     ? &ps->v1.vocab_size
                   : k == K_PADDED_VOCAB_SIZE ? &ps->v1.padded_vocab_size
                                           : &ps->v1.max_seq_len;
        if (!parse_int(v, 1, MAX_SMALL, dst))
            return bad(ps, "%s '%s' is not in 1..%d", mkey_names[k], v, MAX_SMALL);
        if (k == K_VOCAB_SIZE)
            ps->v1.sizes_line = ps->line;
        return FSDP_STATUS_OK;
    }
    case K_STEPS_TOTAL:
        if (!parse_int(v, 0, 1 << 30, &m->steps_total))
            return bad(ps, "steps_total '%s' is not a count", v);
        return FSDP_STATUS_OK;
    case K_SHARD_RANKS:
        if (!parse_int(v, 1, MAX_WORLD, &m->shard_ranks))
            return bad(ps, "shard_ranks '%s' is not in 1..%d", v, MAX_WORLD);
        return FSDP_STATUS_OK;
    case K_BLOCK_NUMEL:
        if (!parse_u64(v, UINT64_MAX, &x) || x != FSDP_CKPT_BLOCK_NUMEL)
            return bad(ps, "block_numel '%s' is not supported (this build uses %zu)", v,
                       FSDP_CKPT_BLOCK_NUMEL);
        return FSDP_STATUS_OK;
    default: return parse_text_key(ps, k, v, m);
    }
}

/* Cross-field checks once the header is complete. */
static fsdp_status check_header(const parser *ps, fsdp_ckpt_manifest *m)
{
    if (!m->shard_ranks)
        m->shard_ranks = m->replicated ? 1 : m->world_size;
    if (m->replicated ? m->shard_ranks != 1
                      : m->world_size % m->shard_ranks ||
                            (m->shard_ranks != m->world_size && strcmp(m->shard, "hybrid")))
        return bad(ps, "shard_ranks %d does not fit world_size %d with shard %s", m->shard_ranks,
                   m->world_size, m->shard);
    uint64_t per_step = (uint64_t)m->batch * (uint64_t)m->world_size * (uint64_t)m->grad_accum;
    uint64_t seqs;
    if (__builtin_mul_overflow(per_step, m->step, &seqs) || seqs != m->data_sequences)
        return bad(ps, "data_sequences %" PRIu64 " is not step %" PRIu64 " x batch %d x "
                       "world_size %d x grad_accum %d",
                   m->data_sequences, m->step, m->batch, m->world_size, m->grad_accum);
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
    /* With frozen parameters (a `base` line, which comes before the units) a unit may
     * train nothing: numel, padded, shard and params all 0. */
    uint64_t low = m->base[0] ? 0 : 1, numel, padded, shard;
    if (!parse_u64(t[4], MAX_NUMEL, &numel) || numel < low)
        return bad(ps, "unit '%s' numel '%s' is not in %d..2^48", cu->name, t[4], (int)low);
    if (!parse_u64(t[6], MAX_NUMEL, &padded) || padded < numel || (!numel && padded))
        return bad(ps, "unit '%s' padded numel '%s' is not in numel..2^48 (0 with numel 0)",
                   cu->name, t[6]);
    if (!parse_u64(t[8], MAX_NUMEL, &shard) || (numel && !shard))
        return bad(ps, "unit '%s' shard numel '%s' is not in 1..2^48", cu->name, t[8]);
    uint64_t parts = (uint64_t)fsdp_ckpt_n_shards(m);
    if (padded % parts || padded / parts != shard)
        return bad(ps, "unit '%s': shard numel %" PRIu64 " does not split padded numel %" PRIu64
                       " over %d rank(s) (world_size %d, shard %s)",
                   cu->name, shard, padded, (int)parts, m->world_size, m->shard);
    if (!parse_int(t[10], numel ? 1 : 0, numel ? (lines_left > 0 ? lines_left : 1) : 0,
                   &cu->n_params) ||
        cu->n_params > lines_left)
        return bad(ps, "unit '%s' params '%s' is not in %d..%d (the lines left in the file; 0 "
                       "exactly for a unit that trains nothing)",
                   cu->name, t[10], numel ? 1 : 0, numel ? lines_left : 0);
    cu->numel = numel;
    cu->padded_numel = padded;
    cu->shard_numel = shard;
    cu->line = ps->line;
    cu->params = calloc((size_t)cu->n_params + 1, sizeof *cu->params);
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

/* The manifest's bytes into *text (NUL-terminated, *size bytes before the
 * NUL; the caller frees it): a regular file of at most MANIFEST_MAX_BYTES.
 * FORMAT when it is missing, not a regular file or too large; IO when it
 * cannot be read. */
static fsdp_status read_text(const char *path, char **text, size_t *size)
{
    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp_error_set(errno == ENOENT ? FSDP_STATUS_FORMAT : FSDP_STATUS_IO,
                              "cannot open checkpoint manifest '%s': %s", path, errstr());
    struct stat sb;
    fsdp_status st = FSDP_STATUS_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s' is not a regular file",
                            path);
    else if ((uint64_t)sb.st_size > MANIFEST_MAX_BYTES)
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint manifest '%s' is %lld bytes, more than the %zu MiB a "
                            "manifest can be", path, (long long)sb.st_size,
                            MANIFEST_MAX_BYTES >> 20);
    else if (!(*text = malloc((size_t)sb.st_size + 1)))
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading manifest '%s'", path);
    if (st == FSDP_STATUS_OK) {
        *size = (size_t)sb.st_size;
        st = fsdp_pread_all(fd, *text, *size, 0, "checkpoint manifest", path);
        if (st == FSDP_STATUS_OK)
            (*text)[*size] = '\0';
        else
            free(*text);
    }
    close(fd);
    return st;
}

/* A line is at most FSDP_CKPT_MANIFEST_LINE_MAX characters of plain text, ended by
 * LF alone. */
static fsdp_status check_line(const parser *ps, const char *line, size_t len)
{
    if (len > FSDP_CKPT_MANIFEST_LINE_MAX)
        return bad(ps, "line is longer than %d characters", FSDP_CKPT_MANIFEST_LINE_MAX);
    if (len > 0 && line[len - 1] == '\r')
        return bad(ps, "the line ends in a carriage return (CRLF line endings); a manifest "
                       "uses LF line endings only");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
            return bad(ps, "control character 0x%02x at column %zu (a manifest is plain text)",
                       (unsigned char)line[i], i + 1);
    return FSDP_STATUS_OK;
}

/* Where the reader is: the header's `key value` lines, then (after
 * `units N`) each unit's line and its parameter lines, then `end`. */
typedef struct reader {
    parser ps;
    bool seen[K_COUNT];       /* header keys read so far */
    enum { HEADER, UNITS, END } phase;
    int unit, param;          /* UNITS: the unit being read, and its next parameter */
    size_t offset;            /* where that parameter must start in the unit */
} reader;

/* `units N`: the header is complete. Every key of its version is there
 * (version 1's optimizer is AdamW's), the fields agree with each other,
 * and N units fit in the lines left. */
static fsdp_status begin_units(reader *r, const char *val, int lines_left,
                               fsdp_ckpt_manifest *m)
{
    for (int k = 0; k < K_COUNT; k++) /* no version: every key is missing */
        if (!r->seen[k] && !mkey_optional[k] && (!r->seen[K_VERSION] || KEY_IN(k, m->version)))
            return bad(&r->ps, "key '%s' is missing before 'units'", mkey_names[k]);
    if (m->version == 1) { /* version 1 predates optimizers other than AdamW */
        snprintf(m->optimizer, sizeof m->optimizer, "adamw");
        m->n_optim_state = 2;
        snprintf(m->optim_state[0], sizeof m->optim_state[0], "adam_m");
        snprintf(m->optim_state[1], sizeof m->optim_state[1], "adam_v");
    }
    FSDP_TRY(check_header(&r->ps, m));
    if (m->n_tok_files && strcmp(m->tok_files[0].name, FSDP_CKPT_TOK_JSON))
        return bad(&r->ps, "the tokenizer files listed do not start with %s (line %d lists "
                   "'%s')", FSDP_CKPT_TOK_JSON, m->tok_files[0].line, m->tok_files[0].name);
    if (m->version == 1) {
        int at = r->ps.line;
        FSDP_TRY(finish_v1_model(&r->ps, m));
        r->ps.line = at;
    }
    if (!parse_int(val, 1, lines_left > 0 ? lines_left : 1, &m->n_units) ||
        m->n_units > lines_left)
        return bad(&r->ps, "units '%s' is not in 1..%d (the lines left in the file)", val,
                   lines_left);
    m->units = calloc((size_t)m->n_units, sizeof *m->units);
    if (!m->units) {
        m->n_units = 0;
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", r->ps.path);
    }
    r->phase = UNITS;
    return FSDP_STATUS_OK;
}

/* The files a checkpoint may carry: the companions of a Hugging Face
 * directory (hfdir.h), tokenizer.json included. */
static bool tok_name_valid(const char *name)
{
    for (int i = 0; fsdp_hfdir_companions[i]; i++)
        if (!strcmp(name, fsdp_hfdir_companions[i]))
            return true;
    return false;
}

/* `tokenizer_file <name> <bytes> <XXH64>` (version 3, optional, one line
 * per file): a companion name (hfdir.h), each once, a size within the
 * limit and 16 hex digits. */
static fsdp_status tok_file_line(reader *r, char *val, fsdp_ckpt_manifest *m)
{
    const parser *ps = &r->ps;
    if (!r->seen[K_VERSION] || m->version < 3)
        return bad(ps, "key 'tokenizer_file' is not part of a version-%d manifest", m->version);
    char *t[4];
    if (tokenize(val, t, 4) != 3)
        return bad(ps, "expected 'tokenizer_file <name> <bytes> <16 hex digits>'");
    if (!tok_name_valid(t[0])) {
        char names[320];
        size_t at = 0;
        for (int i = 0; fsdp_hfdir_companions[i] && at < sizeof names; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                                   fsdp_hfdir_companions[i]);
        return bad(ps, "tokenizer_file '%.64s' is not a tokenizer file fsdp carries (%s)", t[0],
                   names);
    }
    for (int i = 0; i < m->n_tok_files; i++)
        if (!strcmp(m->tok_files[i].name, t[0]))
            return bad(ps, "tokenizer_file '%s' appears twice", t[0]);
    if (m->n_tok_files == FSDP_CKPT_TOK_FILES_MAX)
        return bad(ps, "more than %d tokenizer_file lines", FSDP_CKPT_TOK_FILES_MAX);
    fsdp_ckpt_tok_file *f = &m->tok_files[m->n_tok_files];
    if (!parse_u64(t[1], FSDP_CKPT_TOK_BYTES_MAX, &f->size_bytes))
        return bad(ps, "tokenizer_file '%s': size '%s' is not a number of bytes up to %zu MiB",
                   t[0], t[1], FSDP_CKPT_TOK_BYTES_MAX >> 20);
    if (!parse_hex64(t[2], &f->xxh64))
        return bad(ps, "tokenizer_file '%s': '%s' is not 16 lower-case hex digits (its XXH64)",
                   t[0], t[2]);
    snprintf(f->name, sizeof f->name, "%s", t[0]);
    f->line = ps->line;
    m->n_tok_files++;
    return FSDP_STATUS_OK;
}

/* A header line: `key value`, each key once, 'format' and 'version'
 * first, only the keys of that version; or `units N`, which ends it. */
static fsdp_status header_line(reader *r, char *line, size_t len, int lines_left,
                               fsdp_ckpt_manifest *m)
{
    char *sp = strchr(line, ' ');
    char *key = line, *val = sp ? sp + 1 : line + len;
    if (sp)
        *sp = '\0';
    if (!strcmp(key, "units"))
        return begin_units(r, val, lines_left, m);
    if (!strcmp(key, FSDP_CKPT_TOK_KEY))
        return tok_file_line(r, val, m);
    int k = 0;
    while (k < K_COUNT && strcmp(key, mkey_names[k]))
        k++;
    if (k == K_COUNT)
        return bad(&r->ps, "unknown key '%.64s'", key);
    if (r->seen[k])
        return bad(&r->ps, "key '%s' appears twice", key);
    if (!*val)
        return bad(&r->ps, "key '%s' has no value", key);
    if (k != K_VERSION && k != K_FORMAT && !r->seen[K_VERSION])
        return bad(&r->ps, "'format' and 'version' must come first");
    if (k != K_VERSION && k != K_FORMAT && !KEY_IN(k, m->version))
        return bad(&r->ps, "key '%s' is not part of a version-%d manifest", key, m->version);
    r->seen[k] = true;
    return parse_header_line(&r->ps, (enum mkey)k, val, m);
}

/* A line after `units N`: the next unit's line, one of its parameters'
 * (which tile the unit in order), or `end` after the last unit. */
static fsdp_status units_line(reader *r, char *line, int lines_left, fsdp_ckpt_manifest *m)
{
    if (r->unit < m->n_units && r->param == 0 && !m->units[r->unit].params) {
        r->offset = 0;
        FSDP_TRY(parse_unit_line(&r->ps, line, r->unit, lines_left, m, &m->units[r->unit]));
        if (!m->units[r->unit].n_params) /* a unit that trains nothing: no param lines */
            r->unit++;
        return FSDP_STATUS_OK;
    }
    if (r->unit == m->n_units) {
        if (strcmp(line, "end"))
            return bad(&r->ps, "expected 'end' after the %d units", m->n_units);
        r->phase = END;
        return FSDP_STATUS_OK;
    }
    fsdp_ckpt_unit *cu = &m->units[r->unit];
    FSDP_TRY(parse_param_line(&r->ps, line, cu, r->offset, &cu->params[r->param]));
    r->offset += cu->params[r->param].numel;
    if (++r->param == cu->n_params) {
        if (r->offset != cu->numel)
            return bad(&r->ps, "unit '%s''s parameters hold %zu elements, its numel is %zu",
                       cu->name, r->offset, cu->numel);
        r->param = 0;
        r->unit++;
    }
    return FSDP_STATUS_OK;
}

/* Every line of text (size bytes, modified in place), in order. */
static fsdp_status parse_lines(reader *r, char *text, size_t size, fsdp_ckpt_manifest *m)
{
    char *cur = text, *end = text + size;
    while (cur < end) {
        char *nl = memchr(cur, '\n', (size_t)(end - cur));
        char *line = cur;
        size_t len = nl ? (size_t)(nl - cur) : (size_t)(end - cur);
        cur += len + (nl ? 1 : 0);
        line[len] = '\0';
        r->ps.line++;
        FSDP_TRY(check_line(&r->ps, line, len));
        if (len == 0 || line[0] == '#')
            continue;
        /* declared counts are bounded by the lines the rest of the file can
         * hold, so a hostile count cannot size a large allocation */
        int lines_left = (int)((size_t)(end - cur) / MANIFEST_MIN_LINE);
        if (r->phase == END)
            return bad(&r->ps, "text after 'end'");
        FSDP_TRY(r->phase == HEADER ? header_line(r, line, len, lines_left, m)
                                    : units_line(r, line, lines_left, m));
    }
    if (r->phase == END)
        return FSDP_STATUS_OK;
    r->ps.line++;
    return r->phase == HEADER ? bad(&r->ps, "the file ends before 'units' (truncated?)")
                              : bad(&r->ps, "the file ends before 'end' (truncated?)");
}

/* Version 3's last line, `checksum <16 hex digits>`: XXH64 (seed 0) of
 * every byte before it (manifest.h). Taken from the text before it is
 * parsed (parsing edits the text in place); the lines before it parse as
 * in version 2. */
typedef struct checksum_line {
    size_t body;     /* bytes before the checksum line (all of them when there is none) */
    int line;        /* its line number, or the line after the last when there is none */
    bool found;      /* the last line is a `checksum` line */
    bool valid;      /* ... with 16 lower-case hex digits, in sum */
    uint64_t sum;    /* as written */
    uint64_t digest; /* XXH64 of the body */
} checksum_line;

static void checksum_split(const char *text, size_t size, checksum_line *c)
{
    static const char key[] = "checksum ";
    const size_t kn = sizeof key - 1;
    memset(c, 0, sizeof *c);
    size_t end = size > 0 && text[size - 1] == '\n' ? size - 1 : size, start = end;
    while (start > 0 && text[start - 1] != '\n')
        start--;
    c->found = end - start >= kn && !memcmp(text + start, key, kn);
    c->body = c->found ? start : size;
    if (c->found && end - start - kn == 16) {
        char hex[17];
        memcpy(hex, text + start + kn, 16);
        hex[16] = '\0';
        c->valid = parse_hex64(hex, &c->sum);
    }
    c->line = 1;
    for (size_t i = 0; i < c->body; i++)
        c->line += text[i] == '\n';
    c->digest = (uint64_t)XXH64(text, c->body, 0);
}

/* Version 3 must end with a checksum that matches; versions 1 and 2 have
 * none (the shard files are their only check). */
static fsdp_status checksum_check(const char *path, const checksum_line *c, int version)
{
    parser ps = {.path = path, .line = c->line};
    if (version < 3)
        return c->found ? bad(&ps, "key 'checksum' is not part of a version-%d manifest", version)
                        : FSDP_STATUS_OK;
    if (!c->found)
        return bad(&ps, "the file ends without its 'checksum' line (truncated?)");
    if (!c->valid)
        return bad(&ps, "checksum is not 16 lower-case hex digits");
    if (c->sum != c->digest)
        return bad(&ps, "checksum %016" PRIx64 " does not match the text before it (XXH64 %016"
                        PRIx64 "): the manifest was edited or is corrupt, and may describe "
                        "another model than its shard files hold; restore the original",
                   c->sum, c->digest);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_manifest_read(const char *path, fsdp_ckpt_manifest *m)
{
    memset(m, 0, sizeof *m);
    char *text = NULL;
    size_t size = 0;
    FSDP_TRY(read_text(path, &text, &size));
    checksum_line sum;
    checksum_split(text, size, &sum);
    reader r = {.ps = {.path = path, .line = 0}, .phase = HEADER};
    fsdp_status st = parse_lines(&r, text, sum.body, m);
    free(text);
    if (st == FSDP_STATUS_OK) { /* the recorded model builds, and the unit lines are its units */
        fsdp_model model;
        st = fsdp_ckpt_manifest_model(m, path, &model);
        if (st == FSDP_STATUS_OK)
            fsdp_model_free(&model);
    }
    if (st == FSDP_STATUS_OK) /* last: a field's own error says more than a checksum does */
        st = checksum_check(path, &sum, m->version);
    if (st != FSDP_STATUS_OK)
        fsdp_ckpt_manifest_free(m);
    return st;
}
