/*
 * manifest_header.c - the checkpoint manifest's header read back: each
 * `key value` line parsed and bounded (the keys of each version, the
 * optional ones), version 1's model lines, the tokenizer files, and the
 * checks across the fields once `units N` ends the header. The file, its
 * unit and parameter lines and the checksum are manifest.c's.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hfdir.h"
#include "ckpt/manifest_internal.h"
#include "core/error.h"

static const char *const mkey_names[K_COUNT] = {
    "format", "version", "run_id", "step", "adam_t", "data_sequences", "seed", "world_size",
    "shard", "batch", "seq", "grad_accum", "steps_total", "compute_dtype", "master_dtype",
    "optim_dtype", "model_name", "model_spec", "gpt2", "vocab_size", "padded_vocab_size",
    "max_seq_len", "model_family", "model_config", "data", "block_numel", "optimizer",
    "optim_state", "shard_ranks", "tokenizer", "lora", "freeze", "base", "schedule",
    "eval_standing", "quantize", "chat_format",
};

/* Keys a manifest may leave out (their meaning when absent is in manifest.h). */
static const bool mkey_optional[K_COUNT] = {[K_SHARD_RANKS] = true, [K_LORA] = true,
                                            [K_FREEZE] = true, [K_BASE] = true,
                                            [K_SCHEDULE] = true, [K_EVAL_STANDING] = true,
                                            [K_QUANTIZE] = true, [K_CHAT_FORMAT] = true};

/* The versions each key belongs to (bit v set: version v has it, once). */
#define V1 (1u << 1)
#define V2 (1u << 2)
#define V3 (1u << 3)
#define V4 (1u << 4) /* version 3's keys; its parameter lines differ (manifest.h) */
static const unsigned mkey_versions[K_COUNT] = {
    [K_MODEL_SPEC] = V1, [K_GPT2] = V1, [K_VOCAB_SIZE] = V1, [K_PADDED_VOCAB_SIZE] = V1,
    [K_MAX_SEQ_LEN] = V1, [K_MODEL_FAMILY] = V2 | V3 | V4, [K_MODEL_CONFIG] = V2 | V3 | V4,
    [K_OPTIMIZER] = V2 | V3 | V4, [K_OPTIM_STATE] = V2 | V3 | V4, /* version 1 is AdamW */
    [K_TOKENIZER] = V3 | V4, [K_LORA] = V3 | V4, [K_FREEZE] = V3 | V4, [K_BASE] = V3 | V4,
    [K_SCHEDULE] = V3 | V4, [K_EVAL_STANDING] = V3 | V4, [K_QUANTIZE] = V3 | V4,
    [K_CHAT_FORMAT] = V3 | V4,
};
#define KEY_IN(k, version) \
    ((mkey_versions[k] ? mkey_versions[k] : V1 | V2 | V3 | V4) >> (version) & 1)


static void copy_text(char *dst, size_t n, const char *v)
{
    snprintf(dst, n, "%s", strcmp(v, "-") ? v : "");
}

/* `schedule NAME LR MIN_LR WARMUP DECAY_FRAC` (manifest.h): a [a-z0-9_] name, finite
 * numbers and warmup >= 0 (the trainer checked the settings; this is the reading). */
static fsdp_status parse_schedule(const fsdp_mf_parser *ps, const char *v, fsdp_ckpt_manifest *m)
{
    int used = 0;
    if (sscanf(v, "%15s %lf %lf %d %lf%n", m->schedule, &m->lr, &m->min_lr, &m->warmup,
               &m->decay_frac, &used) != 5 || v[used] ||
        !fsdp_ckpt_array_name_valid(m->schedule) || !isfinite(m->lr) || !isfinite(m->min_lr) ||
        m->warmup < 0 || !isfinite(m->decay_frac)) {
        m->schedule[0] = '\0';
        return fsdp_mf_bad(ps, "schedule '%.80s' is not 'NAME LR MIN_LR WARMUP DECAY_FRAC'", v);
    }
    return FSDP_STATUS_OK;
}

/* `eval_standing BEST BEST_STEP N_WORSE` (manifest.h): a finite loss and two counts. */
static fsdp_status parse_eval_standing(const fsdp_mf_parser *ps, const char *v,
                                       fsdp_ckpt_manifest *m)
{
    char step[24], worse[16];
    int used = 0;
    if (sscanf(v, "%lf %23s %15s%n", &m->eval_best, step, worse, &used) != 3 || v[used] ||
        !isfinite(m->eval_best) || !fsdp_mf_u64(step, 1u << 30, &m->eval_best_step) ||
        !fsdp_mf_int(worse, 0, 1 << 30, &m->eval_n_worse))
        return fsdp_mf_bad(ps, "eval_standing '%.80s' is not 'BEST_LOSS BEST_STEP N_WORSE'", v);
    m->eval_recorded = true;
    return FSDP_STATUS_OK;
}

/* Version 1's 'gpt2 layers=L heads=H channels=C vocab=V context=T' (or
 * '-'): kept as the config key list "layers=L,heads=H,...". */
static fsdp_status parse_v1_gpt2(fsdp_mf_parser *ps, char *v)
{
    ps->v1.gpt2_line = ps->line;
    if (!strcmp(v, "-"))
        return FSDP_STATUS_OK;
    char *tok[8];
    int n = fsdp_mf_tokenize(v, tok, 8);
    static const char *const keys[5] = {"layers", "heads", "channels", "vocab", "context"};
    if (n != 5)
        return fsdp_mf_bad(ps, "'gpt2' needs layers=L heads=H channels=C vocab=V context=T");
    size_t k = 0;
    for (int i = 0; i < 5; i++) {
        size_t kl = strlen(keys[i]);
        int val;
        if (strncmp(tok[i], keys[i], kl) || tok[i][kl] != '=' ||
            !fsdp_mf_int(tok[i] + kl + 1, 1, MAX_SMALL, &val))
            return fsdp_mf_bad(ps, "'gpt2': expected %s=<1..%d>, got '%s'", keys[i], MAX_SMALL,
                               tok[i]);
        k += (size_t)snprintf(ps->v1.gpt2 + k, sizeof ps->v1.gpt2 - k, "%s%s=%d", i ? "," : "",
                              keys[i], val);
    }
    return FSDP_STATUS_OK;
}

/* Version 1: the 'gpt2' line gives the family and config; model_spec and
 * the vocabulary and context sizes must say the same. */
static fsdp_status finish_v1_model(fsdp_mf_parser *ps, fsdp_ckpt_manifest *m)
{
    fsdp_mf_v1_model *v = &ps->v1;
    ps->line = v->gpt2_line;
    if (!v->gpt2[0])
        return fsdp_mf_bad(ps, "'gpt2 -': the checkpoint records no model this build can rebuild");
    snprintf(m->model_family, sizeof m->model_family, "%s", V1_FAMILY);
    m->model_line = v->gpt2_line;
    fsdp_model built, named;
    if (fsdp_model_build(fsdp_model_family_find(V1_FAMILY), v->gpt2, &built) != FSDP_STATUS_OK)
        return fsdp_mf_bad(ps, "'gpt2': %s", fsdp_error_msg());
    snprintf(m->model_config, sizeof m->model_config, "%s", built.config);
    fsdp_status st = FSDP_STATUS_OK;
    if (v->spec[0]) {
        ps->line = v->spec_line;
        if (fsdp_model_from_spec(v->spec, &named) != FSDP_STATUS_OK) {
            st = fsdp_mf_bad(ps, "model_spec '%.160s' does not name a model: %s", v->spec,
                             fsdp_error_msg());
        } else {
            if (named.family != built.family || strcmp(named.config, built.config))
                st = fsdp_mf_bad(ps,
                                 "model_spec '%.160s' (%s) and the 'gpt2' line %d (%s) describe "
                                 "different models; the manifest was edited or is corrupt",
                                 v->spec, named.config, v->gpt2_line, built.config);
            fsdp_model_free(&named);
        }
    }
    if (st == FSDP_STATUS_OK &&
        (v->vocab_size != built.vocab_size || v->padded_vocab_size != built.padded_vocab_size ||
         v->max_seq_len != built.max_seq_len)) {
        ps->line = v->sizes_line;
        st = fsdp_mf_bad(ps,
                         "vocab_size %d, padded_vocab_size %d, max_seq_len %d disagree with the "
                         "'gpt2' line %d (%d, %d, %d); the manifest was edited or is corrupt",
                         v->vocab_size, v->padded_vocab_size, v->max_seq_len, v->gpt2_line,
                         built.vocab_size, built.padded_vocab_size, built.max_seq_len);
    }
    fsdp_model_free(&built);
    return st;
}

/* `optim_state A,B,...` or `-`: names valid for shard files, unique, not
 * "master". */
static fsdp_status parse_optim_state(const fsdp_mf_parser *ps, char *v, fsdp_ckpt_manifest *m)
{
    m->n_optim_state = 0;
    if (!strcmp(v, "-"))
        return FSDP_STATUS_OK;
    for (char *name = v;;) {
        char *comma = strchr(name, ',');
        if (comma)
            *comma = '\0';
        if (m->n_optim_state == FSDP_CKPT_MAX_ARRAYS - 1)
            return fsdp_mf_bad(ps, "optim_state lists more than %d arrays",
                               FSDP_CKPT_MAX_ARRAYS - 1);
        if (!fsdp_ckpt_array_name_valid(name) || !strcmp(name, "master"))
            return fsdp_mf_bad(ps,
                               "optim_state name '%.32s' is not a [a-z0-9_] name of at most %d "
                               "characters other than 'master'",
                               name, FSDP_CKPT_ARRAY_NAME_MAX - 1);
        for (int k = 0; k < m->n_optim_state; k++)
            if (!strcmp(m->optim_state[k], name))
                return fsdp_mf_bad(ps, "optim_state names '%s' twice", name);
        snprintf(m->optim_state[m->n_optim_state++], FSDP_CKPT_ARRAY_NAME_MAX, "%s", name);
        if (!comma)
            return FSDP_STATUS_OK;
        name = comma + 1;
    }
}

/* A header key whose value is text: the file's identity, the strategy,
 * dtypes, the model, the data and the optimizer. */
static fsdp_status parse_text_key(fsdp_mf_parser *ps, enum fsdp_mf_key k, char *v,
                                  fsdp_ckpt_manifest *m)
{
    switch (k) {
    case K_FORMAT:
        if (strcmp(v, "fsdp-checkpoint"))
            return fsdp_mf_bad(ps, "format '%s' is not 'fsdp-checkpoint'", v);
        return FSDP_STATUS_OK;
    case K_SHARD:
        if (strcmp(v, "full") && strcmp(v, "grad-op") && strcmp(v, "none") && strcmp(v, "hybrid"))
            return fsdp_mf_bad(ps, "shard '%s' is not full, grad-op, none or hybrid", v);
        snprintf(m->shard, sizeof m->shard, "%s", v);
        m->replicated = !strcmp(v, "none");
        return FSDP_STATUS_OK;
    case K_COMPUTE_DTYPE:
        if (strcmp(v, "fp32") && strcmp(v, "bf16"))
            return fsdp_mf_bad(ps, "compute_dtype '%s' is not fp32 or bf16", v);
        snprintf(m->compute_dtype, sizeof m->compute_dtype, "%s", v);
        return FSDP_STATUS_OK;
    case K_MASTER_DTYPE:
    case K_OPTIM_DTYPE:
        if (strcmp(v, "fp32"))
            return fsdp_mf_bad(ps, "%s '%s' is not supported (only fp32 state is written)",
                               mkey_names[k], v);
        return FSDP_STATUS_OK;
    case K_MODEL_NAME: copy_text(m->model_name, sizeof m->model_name, v); return FSDP_STATUS_OK;
    case K_MODEL_SPEC:
        copy_text(ps->v1.spec, sizeof ps->v1.spec, v);
        ps->v1.spec_line = ps->line;
        return FSDP_STATUS_OK;
    case K_GPT2: return parse_v1_gpt2(ps, v);
    case K_MODEL_FAMILY:
        if (!fsdp_mf_name_valid(v, sizeof m->model_family))
            return fsdp_mf_bad(ps, "model_family '%.64s' is not a family name", v);
        snprintf(m->model_family, sizeof m->model_family, "%s", v);
        return FSDP_STATUS_OK;
    case K_MODEL_CONFIG:
        if (strlen(v) >= sizeof m->model_config)
            return fsdp_mf_bad(ps, "model_config is longer than %zu characters",
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
            return fsdp_mf_bad(ps, "optimizer '%.32s' is not a [a-z0-9_] name", v);
        snprintf(m->optimizer, sizeof m->optimizer, "%s", v);
        return FSDP_STATUS_OK;
    case K_OPTIM_STATE: return parse_optim_state(ps, v, m);
    case K_LORA: {
        fsdp_lora_config *l = &m->lora;
        int rs = -1, used = 0;
        if (sscanf(v, "%d %lf %d %255s%n", &l->r, &l->alpha, &rs, l->targets, &used) != 4 ||
            v[used] || l->r < 1 || l->r > 4096 || !(l->alpha > 0) || !isfinite(l->alpha) ||
            (rs != 0 && rs != 1))
            return fsdp_mf_bad(ps, "lora '%.64s' is not 'R ALPHA RSLORA(0|1) TARGETS'", v);
        l->rslora = rs == 1;
        return FSDP_STATUS_OK;
    }
    case K_FREEZE:
        if (strlen(v) >= sizeof m->freeze)
            return fsdp_mf_bad(ps, "freeze is longer than %zu characters", sizeof m->freeze - 1);
        copy_text(m->freeze, sizeof m->freeze, v);
        return FSDP_STATUS_OK;
    case K_BASE: {
        int used = 0;
        if (sscanf(v, "%16" SCNx64 " %n", &m->base_hash, &used) != 1 || !used || !v[used] ||
            strlen(v + used) >= sizeof m->base)
            return fsdp_mf_bad(ps, "base '%.64s' is not 'HASH PATH'", v);
        snprintf(m->base, sizeof m->base, "%s", v + used);
        return FSDP_STATUS_OK;
    }
    case K_SCHEDULE: return parse_schedule(ps, v, m);
    case K_QUANTIZE:
        if (strcmp(v, "nf4"))
            return fsdp_mf_bad(ps, "quantize '%.64s' is not nf4", v);
        m->nf4 = true;
        return FSDP_STATUS_OK;
    case K_EVAL_STANDING: return parse_eval_standing(ps, v, m);
    case K_CHAT_FORMAT:
        if (!fsdp_mf_name_valid(v, sizeof m->chat_format))
            return fsdp_mf_bad(ps, "chat_format '%.64s' is not a chat format name", v);
        snprintf(m->chat_format, sizeof m->chat_format, "%s", v);
        return FSDP_STATUS_OK;
    default:
        return fsdp_mf_bad(ps, "internal: unhandled key");
    }
}

/* One `key value` line of the header part: the numbers here, the text
 * values in parse_text_key. */
static fsdp_status parse_header_line(fsdp_mf_parser *ps, enum fsdp_mf_key k, char *v,
                                     fsdp_ckpt_manifest *m)
{
    uint64_t x;
    switch (k) {
    case K_VERSION:
        if (!fsdp_mf_int(v, 0, 1 << 30, &m->version))
            return fsdp_mf_bad(ps, "version '%s' is not a number", v);
        if (m->version < FSDP_CKPT_VERSION_MIN || m->version > FSDP_CKPT_VERSION)
            return fsdp_mf_bad(ps,
                               "checkpoint format version %d is not supported (this build reads "
                               "versions %d to %d)",
                               m->version, FSDP_CKPT_VERSION_MIN, FSDP_CKPT_VERSION);
        return FSDP_STATUS_OK;
    case K_RUN_ID:
        if (!fsdp_mf_hex64(v, &m->run_id) || m->run_id == 0)
            return fsdp_mf_bad(ps, "run_id '%s' is not 16 lower-case hex digits (non-zero)", v);
        return FSDP_STATUS_OK;
    case K_STEP:
    case K_ADAM_T:
    case K_DATA_SEQUENCES:
    case K_SEED:
        if (!fsdp_mf_u64(v, UINT64_MAX, &x))
            return fsdp_mf_bad(ps, "%s '%s' is not an unsigned 64-bit number", mkey_names[k], v);
        *(k == K_STEP     ? &m->step
          : k == K_ADAM_T ? &m->adam_t
          : k == K_SEED   ? &m->seed
                          : &m->data_sequences) = x;
        return FSDP_STATUS_OK;
    case K_WORLD_SIZE:
        if (!fsdp_mf_int(v, 1, MAX_WORLD, &m->world_size))
            return fsdp_mf_bad(ps, "world_size '%s' is not in 1..%d", v, MAX_WORLD);
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
        if (!fsdp_mf_int(v, 1, MAX_SMALL, dst))
            return fsdp_mf_bad(ps, "%s '%s' is not in 1..%d", mkey_names[k], v, MAX_SMALL);
        if (k == K_VOCAB_SIZE)
            ps->v1.sizes_line = ps->line;
        return FSDP_STATUS_OK;
    }
    case K_STEPS_TOTAL:
        if (!fsdp_mf_int(v, 0, 1 << 30, &m->steps_total))
            return fsdp_mf_bad(ps, "steps_total '%s' is not a count", v);
        return FSDP_STATUS_OK;
    case K_SHARD_RANKS:
        if (!fsdp_mf_int(v, 1, MAX_WORLD, &m->shard_ranks))
            return fsdp_mf_bad(ps, "shard_ranks '%s' is not in 1..%d", v, MAX_WORLD);
        return FSDP_STATUS_OK;
    case K_BLOCK_NUMEL:
        if (!fsdp_mf_u64(v, UINT64_MAX, &x) || x != FSDP_CKPT_BLOCK_NUMEL)
            return fsdp_mf_bad(ps, "block_numel '%s' is not supported (this build uses %zu)", v,
                               FSDP_CKPT_BLOCK_NUMEL);
        return FSDP_STATUS_OK;
    default: return parse_text_key(ps, k, v, m);
    }
}

/* Cross-field checks once the header is complete. */
static fsdp_status check_header(const fsdp_mf_parser *ps, fsdp_ckpt_manifest *m)
{
    if (!m->shard_ranks)
        m->shard_ranks = m->replicated ? 1 : m->world_size;
    if (m->replicated ? m->shard_ranks != 1
                      : m->world_size % m->shard_ranks ||
                            (m->shard_ranks != m->world_size && strcmp(m->shard, "hybrid")))
        return fsdp_mf_bad(ps, "shard_ranks %d does not fit world_size %d with shard %s",
                           m->shard_ranks, m->world_size, m->shard);
    uint64_t per_step = (uint64_t)m->batch * (uint64_t)m->world_size * (uint64_t)m->grad_accum;
    uint64_t seqs;
    if (__builtin_mul_overflow(per_step, m->step, &seqs) || seqs != m->data_sequences)
        return fsdp_mf_bad(ps,
                           "data_sequences %" PRIu64 " is not step %" PRIu64 " x batch %d x "
                           "world_size %d x grad_accum %d",
                           m->data_sequences, m->step, m->batch, m->world_size, m->grad_accum);
    return FSDP_STATUS_OK;
}

/* `units N`: the header is complete. Every key of its version is there
 * (version 1's optimizer is AdamW's), the fields agree with each other,
 * and N units fit in the lines left. */
static fsdp_status begin_units(fsdp_mf_reader *r, const char *val, int lines_left,
                               fsdp_ckpt_manifest *m)
{
    for (int k = 0; k < K_COUNT; k++) /* no version: every key is missing */
        if (!r->seen[k] && !mkey_optional[k] && (!r->seen[K_VERSION] || KEY_IN(k, m->version)))
            return fsdp_mf_bad(&r->ps, "key '%s' is missing before 'units'", mkey_names[k]);
    if (m->version == 1) { /* version 1 predates optimizers other than AdamW */
        snprintf(m->optimizer, sizeof m->optimizer, "adamw");
        m->n_optim_state = 2;
        snprintf(m->optim_state[0], sizeof m->optim_state[0], "adam_m");
        snprintf(m->optim_state[1], sizeof m->optim_state[1], "adam_v");
    }
    FSDP_TRY(check_header(&r->ps, m));
    if (m->n_tok_files && strcmp(m->tok_files[0].name, FSDP_CKPT_TOK_JSON))
        return fsdp_mf_bad(&r->ps,
                           "the tokenizer files listed do not start with %s (line %d lists "
                           "'%s')",
                           FSDP_CKPT_TOK_JSON, m->tok_files[0].line, m->tok_files[0].name);
    if (m->version == 1) {
        int at = r->ps.line;
        FSDP_TRY(finish_v1_model(&r->ps, m));
        r->ps.line = at;
    }
    if (!fsdp_mf_int(val, 1, lines_left > 0 ? lines_left : 1, &m->n_units) ||
        m->n_units > lines_left)
        return fsdp_mf_bad(&r->ps, "units '%s' is not in 1..%d (the lines left in the file)", val,
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
static fsdp_status tok_file_line(fsdp_mf_reader *r, char *val, fsdp_ckpt_manifest *m)
{
    const fsdp_mf_parser *ps = &r->ps;
    if (!r->seen[K_VERSION] || m->version < 3)
        return fsdp_mf_bad(ps, "key 'tokenizer_file' is not part of a version-%d manifest",
                           m->version);
    char *t[4];
    if (fsdp_mf_tokenize(val, t, 4) != 3)
        return fsdp_mf_bad(ps, "expected 'tokenizer_file <name> <bytes> <16 hex digits>'");
    if (!tok_name_valid(t[0])) {
        char names[320];
        size_t at = 0;
        for (int i = 0; fsdp_hfdir_companions[i] && at < sizeof names; i++)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                                   fsdp_hfdir_companions[i]);
        return fsdp_mf_bad(ps, "tokenizer_file '%.64s' is not a tokenizer file fsdp carries (%s)",
                           t[0], names);
    }
    for (int i = 0; i < m->n_tok_files; i++)
        if (!strcmp(m->tok_files[i].name, t[0]))
            return fsdp_mf_bad(ps, "tokenizer_file '%s' appears twice", t[0]);
    if (m->n_tok_files == FSDP_CKPT_TOK_FILES_MAX)
        return fsdp_mf_bad(ps, "more than %d tokenizer_file lines", FSDP_CKPT_TOK_FILES_MAX);
    fsdp_ckpt_tok_file *f = &m->tok_files[m->n_tok_files];
    if (!fsdp_mf_u64(t[1], FSDP_CKPT_TOK_BYTES_MAX, &f->size_bytes))
        return fsdp_mf_bad(ps,
                           "tokenizer_file '%s': size '%s' is not a number of bytes up to %zu MiB",
                           t[0], t[1], FSDP_CKPT_TOK_BYTES_MAX >> 20);
    if (!fsdp_mf_hex64(t[2], &f->xxh64))
        return fsdp_mf_bad(ps,
                           "tokenizer_file '%s': '%s' is not 16 lower-case hex digits (its XXH64)",
                           t[0], t[2]);
    snprintf(f->name, sizeof f->name, "%s", t[0]);
    f->line = ps->line;
    m->n_tok_files++;
    return FSDP_STATUS_OK;
}

/* A header line: `key value`, each key once, 'format' and 'version'
 * first, only the keys of that version; or `units N`, which ends it. */
fsdp_status fsdp_mf_header_line(fsdp_mf_reader *r, char *line, size_t len, int lines_left,
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
        return fsdp_mf_bad(&r->ps, "unknown key '%.64s'", key);
    if (r->seen[k])
        return fsdp_mf_bad(&r->ps, "key '%s' appears twice", key);
    if (!*val)
        return fsdp_mf_bad(&r->ps, "key '%s' has no value", key);
    if (k != K_VERSION && k != K_FORMAT && !r->seen[K_VERSION])
        return fsdp_mf_bad(&r->ps, "'format' and 'version' must come first");
    if (k != K_VERSION && k != K_FORMAT && !KEY_IN(k, m->version))
        return fsdp_mf_bad(&r->ps, "key '%s' is not part of a version-%d manifest", key,
                           m->version);
    r->seen[k] = true;
    return parse_header_line(&r->ps, (enum fsdp_mf_key)k, val, m);
}
