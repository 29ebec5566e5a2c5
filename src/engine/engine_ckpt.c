/*
 * engine_ckpt.c - the engine side of checkpoints: each rank streams its
 * shards (the master and the optimizer's named state arrays of every unit)
 * to its own file, and on load reads its new shard range back from the old
 * world's files.
 *
 * Memory: wherever the placement keeps the arrays (device, or pinned host
 * memory), they are copied through the device one checksum block
 * (FSDP_CKPT_BLOCK_NUMEL floats) at a time via a small host staging buffer.
 * No device memory is allocated, so the device peak is the training peak.
 *
 * Resharding: every parameter is split by rows in every world
 * (engine/shardmap.h; the manifest records each one's rows per file and
 * where they start in it), or, in checkpoints before version 4, the unit's
 * flat buffer in equal ranges: fsdp_ckpt_param_run says which elements of
 * a parameter an old file holds, and a rank reads the overlap of each with
 * its own rows of it through fsdp_ckpt_reader_read, which verifies the
 * checksum of every block it touches. Padding is zero in every state.
 *
 * Processes: in a job of several processes each rank writes its own file
 * into the directory every process shares (the trainer checks that it is
 * shared before the first step); the job's communicator's barriers order
 * the steps (process 0's rank 0 creates the .tmp directory, every file is
 * written, rank 0 writes the manifest and DONE). Hybrid sharding writes
 * the first node's files only: the other nodes hold the same shards.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "ckpt/ckpt_tok.h"
#include "core/log.h"
#include "core/world.h"
#include "engine/engine_ckpt.h"
#include "engine/engine_internal.h"

/* Every optimizer's state fits a shard file: its arrays after the master,
 * under their own names. */
_Static_assert(FSDP_OPTIM_MAX_STATE + 1 <= FSDP_CKPT_MAX_ARRAYS,
               "shard files hold the master and every state array of an optimizer");
_Static_assert(FSDP_OPTIM_NAME_MAX <= FSDP_CKPT_ARRAY_NAME_MAX,
               "state array names fit a shard file's name table");

/* Array a of a unit's checkpoint: 0 the master, then the optimizer's state
 * arrays in its order. */
static float *state_array(fsdp_shard_row *row, int a)
{
    return a == 0 ? row->master : row->optim[a - 1];
}

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

/* The arrays of every unit in this engine's files: "master", then the
 * optimizer's state arrays. Returns the count. */
static int array_names(const fsdp_engine_shared *sh, const char **names)
{
    names[0] = "master";
    for (int k = 0; k < sh->optim->n_state; k++)
        names[1 + k] = sh->optim->state_names[k];
    return 1 + sh->optim->n_state;
}

/* ---- describing and checking --------------------------------------------- */

fsdp_status fsdp_engine_ckpt_describe(const fsdp_engine_shared *sh, const char *data_spec,
                                      int steps_total, fsdp_ckpt_manifest *out)
{
    const fsdp_engine_config *cfg = &sh->cfg;
    const fsdp_model *model = sh->model;
    memset(out, 0, sizeof *out);
    if (cfg->backend == FSDP_BACKEND_META)
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                              "checkpoints need the cpu or cuda backend: the meta backend holds no "
                              "parameter values to save or load");
    out->version = FSDP_CKPT_VERSION;
    out->run_id = fsdp_ckpt_new_run_id();
    out->seed = cfg->seed;
    out->world_size = cfg->n_ranks;
    snprintf(out->shard, sizeof out->shard, "%s", fsdp_shard_strategy_name(cfg->shard));
    out->replicated = cfg->shard == FSDP_SHARD_NONE;
    out->shard_ranks = sh->sm.shard_ranks;
    out->batch = cfg->batch;
    out->seq = cfg->seq;
    out->grad_accum = cfg->grad_accum;
    out->steps_total = steps_total;
    snprintf(out->compute_dtype, sizeof out->compute_dtype, "%s",
             fsdp_dtype_name(cfg->compute_dtype));
    const fsdp_optim *o = sh->optim;
    snprintf(out->optimizer, sizeof out->optimizer, "%s", o->name);
    out->n_optim_state = o->n_state;
    for (int k = 0; k < o->n_state; k++)
        snprintf(out->optim_state[k], sizeof out->optim_state[k], "%s", o->state_names[k]);
    fsdp_ckpt_manifest_set_model(out, model);
    snprintf(out->data, sizeof out->data, "%s", data_spec ? data_spec : "");

    int U = sh->sm.n_units;
    size_t *padded = malloc((size_t)U * sizeof(size_t) + 1);
    size_t *shard = malloc((size_t)U * sizeof(size_t) + 1);
    if (!padded || !shard) {
        free(padded);
        free(shard);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a checkpoint manifest");
    }
    for (int u = 0; u < U; u++) {
        padded[u] = sh->sm.units[u].padded_numel;
        shard[u] = sh->sm.units[u].shard_numel;
    }
    fsdp_status st = fsdp_ckpt_manifest_set_units(out, model, padded, shard);
    free(padded);
    free(shard);
    for (int u = 0; u < U && st == FSDP_STATUS_OK; u++) { /* each parameter's rows */
        const fsdp_shard_unit *su = &sh->sm.units[u];
        for (int i = 0, k = 0; i < su->seg_first[FSDP_SEG_TRAIN + 1]; i++, k++) {
            out->units[u].params[k].shard_rows = su->params[i].shard_rows;
            out->units[u].params[k].shard_at = su->params[i].shard_off;
        }
    }
    return st;
}

/* The checkpoint's optimizer state must be this run's: same optimizer,
 * same state arrays. */
static fsdp_status check_optimizer(const fsdp_engine_shared *sh, const fsdp_ckpt_manifest *man,
                                   const char *path)
{
    const fsdp_optim *o = sh->optim;
    char have[160], want[160];
    for (int k = 0, at = 0; k < man->n_optim_state && at < (int)sizeof have; k++)
        at += snprintf(have + at, sizeof have - (size_t)at, "%s%s", k ? ", " : "",
                       man->optim_state[k]);
    if (!man->n_optim_state)
        snprintf(have, sizeof have, "none");
    fsdp_optim_state_list(o, want, sizeof want, ", ");
    if (strcmp(man->optimizer, o->name))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "checkpoint '%s' was trained with --optimizer %s (state: %s); this "
                              "run uses %s (state: %s): resume with --optimizer %s, or start a "
                              "fresh run in another --ckpt-dir",
                              path, man->optimizer, have, o->name, want, man->optimizer);
    bool same = man->n_optim_state == o->n_state;
    for (int k = 0; same && k < o->n_state; k++)
        same = !strcmp(man->optim_state[k], o->state_names[k]);
    if (!same)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint manifest '%s': optimizer %s keeps the state arrays (%s), "
                              "the manifest lists (%s)", path, o->name, want, have);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_engine_ckpt_check(const fsdp_engine_shared *sh, const fsdp_ckpt_manifest *man,
                                   const char *path, bool allow_batch_change)
{
    const fsdp_engine_config *cfg = &sh->cfg;
    FSDP_TRY(fsdp_ckpt_manifest_check_model(man, path, sh->model));
    FSDP_TRY(check_optimizer(sh, man, path));
    if (man->seq != cfg->seq)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "checkpoint '%s' was trained with --seq %d; resume with --seq %d "
                              "(the data position depends on it)", path, man->seq, man->seq);
    if (man->seed != cfg->seed)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "checkpoint '%s' was trained with --seed %" PRIu64 "; resume with "
                              "--seed %" PRIu64 " (the data order depends on it)",
                              path, man->seed, man->seed);
    uint64_t was = (uint64_t)man->batch * (uint64_t)man->world_size * (uint64_t)man->grad_accum;
    uint64_t now = (uint64_t)cfg->batch * (uint64_t)cfg->n_ranks * (uint64_t)cfg->grad_accum;
    if (was != now && !allow_batch_change)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "checkpoint '%s' was trained with a global batch of %" PRIu64
                              " sequences (--batch %d x %d rank(s) x --grad-accum %d), this run "
                              "has %" PRIu64 " (%d x %d x %d); choose --batch, the ranks (--devices"
                              " times a job's processes) and --grad-accum with the same product "
                              "to resume, or pass "
                              "--allow-batch-change to continue with the new global batch",
                              path, was, man->batch, man->world_size, man->grad_accum, now,
                              cfg->batch, cfg->n_ranks, cfg->grad_accum);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_engine_ckpt_find(const fsdp_engine_shared *sh, const char *dir,
                                  bool allow_batch_change, fsdp_ckpt_manifest *man, char *path,
                                  size_t path_size, bool *found)
{
    uint64_t step = 0;
    memset(man, 0, sizeof *man);
    FSDP_TRY(fsdp_ckpt_latest(dir, &step, found));
    if (!*found)
        return FSDP_STATUS_OK;
    FSDP_TRY(fsdp_ckpt_step_path(path, path_size, dir, step, ""));
    char mpath[FSDP_CKPT_PATH_MAX + 16];
    snprintf(mpath, sizeof mpath, "%s/manifest", path);
    fsdp_status st = fsdp_ckpt_manifest_read(mpath, man);
    if (st == FSDP_STATUS_OK && man->step != step)
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint manifest '%s' says step %" PRIu64 " but its directory is "
                            "step %" PRIu64, mpath, man->step, step);
    if (st != FSDP_STATUS_OK) {
        /* a damaged newest checkpoint is never skipped silently */
        fsdp_ckpt_manifest_free(man);
        fsdp_error_prefix("cannot resume from '%s' (move that directory away to resume from an "
                          "older checkpoint)", path);
        return st;
    }
    st = fsdp_engine_ckpt_check(sh, man, mpath, allow_batch_change);
    if (st != FSDP_STATUS_OK)
        fsdp_ckpt_manifest_free(man);
    return st;
}

/* ---- saving --------------------------------------------------------------- */

static void sleep_ms(fsdp_engine *e, int ms)
{
    for (int left = ms; left > 0 && !fsdp_world_aborted(e->sh->world); left -= 10) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The test hook for file writes (core/world.h): a failure of this rank's
 * next write of checkpoint `step`, described by `what`. */
static fsdp_status write_fault(fsdp_engine *e, uint64_t step, const char *what)
{
    if (!fsdp_world_fault_hit(e->sh->world, FSDP_FAULT_WRITE, e->rank))
        return FSDP_STATUS_OK;
    return fsdp_error_set(FSDP_STATUS_IO, "injected write failure (checkpoint step %" PRIu64
                          ", %s)", step, what);
}

/* A checkpoint never holds NaN or infinity: it could only restart a
 * diverged run. The first such element of a block, as an error. */
static fsdp_status check_finite(const fsdp_engine *e, const float *v, size_t n, int u,
                                const char *array, size_t first)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return fsdp_error_set(FSDP_STATUS_NONFINITE,
                                  "unit '%s' %s element %zu is %s: refusing to write a "
                                  "checkpoint of a diverged state",
                                  e->sh->sm.units[u].spec->name, array, first + i,
                                  isnan(v[i]) ? "NaN" : v[i] > 0 ? "inf" : "-inf");
    return FSDP_STATUS_OK;
}

/* Copy n floats of a state array (device, or pinned host) to host memory. */
static fsdp_status get_state(fsdp_engine *e, float *dst, const float *src, size_t n)
{
    FSDP_TRY(fsdp_device_memcpy(&e->dev, dst, src, n * sizeof(float), e->dev.compute));
    return fsdp_device_stream_sync(&e->dev, e->dev.compute);
}

/* This rank's file: every unit's master and optimizer state, block by block
 * through one host staging block. */
static fsdp_status write_rank_file(fsdp_engine *e, const char *ckpt, const fsdp_ckpt_manifest *base,
                                   uint64_t step)
{
    fsdp_engine_shared *sh = e->sh;
    int U = sh->sm.n_units;
    fsdp_status st = FSDP_STATUS_OK;
    fsdp_ckpt_writer *w = NULL;
    float *staging = malloc(FSDP_CKPT_BLOCK_NUMEL * sizeof(float));
    size_t *shard = malloc((size_t)U * sizeof(size_t) + 1);
    size_t *first = malloc((size_t)U * sizeof(size_t) + 1);
    if (!shard || !first || !staging) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory staging a checkpoint",
                            e->rank);
        goto fail;
    }
    for (int u = 0; u < U; u++) {
        shard[u] = sh->sm.units[u].shard_numel;
        first[u] = (size_t)fsdp_shardmap_slot(&sh->sm, e->rank) * shard[u];
    }
    char path[FSDP_CKPT_PATH_MAX];
    FSDP_CHECK(fsdp_ckpt_rank_path(path, sizeof path, ckpt, e->rank));
    const char *names[FSDP_CKPT_MAX_ARRAYS];
    int n_arrays = array_names(sh, names);
    fsdp_ckpt_shard_info info = {.run_id = base->run_id, .step = step, .adam_t = e->t,
                                 .rank = e->rank, .world_size = sh->cfg.n_ranks, .n_units = U,
                                 .shard_numel = shard, .first = first, .n_arrays = n_arrays,
                                 .array_names = names};
    FSDP_CHECK(fsdp_ckpt_writer_open(&w, path, &info));
    /* the last step's device update ran on the compute stream */
    FSDP_CHECK(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    int stall = fsdp_ckpt_test_stall_ms(step);
    for (int u = 0; u < U; u++) {
        /* the unit's last update is complete (a host update is waited for;
         * it also uploads the compute copy the next gather would upload) */
        FSDP_CHECK(e->place->params_ready(e, u));
        fsdp_shard_row *row = fsdp_engine_row(e, u);
        size_t S = shard[u];
        for (int a = 0; a < n_arrays; a++) {
            const float *src = state_array(row, a);
            for (size_t b = 0, lo = 0; lo < S; b++, lo += FSDP_CKPT_BLOCK_NUMEL) {
                size_t n = min_sz(S - lo, FSDP_CKPT_BLOCK_NUMEL);
                char what[96];
                snprintf(what, sizeof what, "unit %d %s block %zu", u, names[a], b);
                FSDP_CHECK(get_state(e, staging, src + lo, n));
                FSDP_CHECK(check_finite(e, staging, n, u, names[a], first[u] + lo));
                FSDP_CHECK(write_fault(e, step, what));
                FSDP_CHECK(fsdp_ckpt_writer_put(w, u, a, b, staging));
            }
        }
        if (u == 0 && stall > 0)
            sleep_ms(e, stall); /* test hook: a crash lands mid-write */
    }
    st = fsdp_ckpt_writer_close(w);
    w = NULL;
fail:
    fsdp_ckpt_writer_abort(w);
    free(staging);
    free(shard);
    free(first);
    return st;
}

fsdp_status fsdp_engine_ckpt_save(fsdp_engine *e, const char *dir, const fsdp_ckpt_manifest *base,
                                  uint64_t step, int keep)
{
    fsdp_engine_shared *sh = e->sh;
    const fsdp_engine_config *cfg = &sh->cfg;
    if (!fsdp_device_computes(&e->dev))
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                              "checkpoints need the cpu or cuda backend (meta holds no values)");
    char tmp[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(fsdp_ckpt_step_path(tmp, sizeof tmp, dir, step, ".tmp"));
    if (e->rank == 0)
        FSDP_TRY(fsdp_ckpt_begin(dir, step));
    FSDP_TRY(fsdp_comm_barrier(&e->comm)); /* every rank of the job */
    /* one copy of each shard: hybrid's other nodes hold the first node's */
    bool writes = cfg->shard == FSDP_SHARD_NONE || e->rank < sh->sm.shard_ranks;
    fsdp_status st = writes ? write_rank_file(e, tmp, base, step) : FSDP_STATUS_OK;
    if (st != FSDP_STATUS_OK) {
        fsdp_error_prefix("saving checkpoint step %" PRIu64, step);
        return st;
    }
    if (e->rank == 0) {
        fsdp_ckpt_manifest m = *base; /* shares base's units: not freed here */
        m.step = step;
        m.adam_t = e->t;
        m.data_sequences =
            step * (uint64_t)cfg->batch * (uint64_t)cfg->n_ranks * (uint64_t)cfg->grad_accum;
        char path[FSDP_CKPT_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/manifest", tmp);
        FSDP_TRY(write_fault(e, step, "manifest"));
        FSDP_TRY(fsdp_ckpt_tok_write(tmp, &m)); /* the tokenizer it carries, if any */
        FSDP_TRY(fsdp_ckpt_manifest_write(path, &m));
    }
    /* every rank's file is written and fsynced before DONE */
    FSDP_TRY(fsdp_comm_barrier(&e->comm));
    if (e->rank == 0) {
        FSDP_TRY(write_fault(e, step, "commit"));
        FSDP_TRY(fsdp_ckpt_commit(dir, step, keep));
        FSDP_INFO(FSDP_SUB_CKPT, "checkpoint step %" PRIu64 " written to %s/step_%08" PRIu64,
                  step, dir, step);
    }
    return FSDP_STATUS_OK;
}

/* ---- loading --------------------------------------------------------------- */

/* Copy host floats into a state array (device, or pinned host). */
static fsdp_status put_state(fsdp_engine *e, float *dst, const float *src, size_t n)
{
    FSDP_TRY(fsdp_device_memcpy(&e->dev, dst, src, n * 4, e->dev.compute));
    return fsdp_device_stream_sync(&e->dev, e->dev.compute); /* src is reused */
}

/* Old file k's real rows of checkpoint parameter cp that this rank's shard
 * of unit u holds (new parameter sp): the overlap of the two runs, as
 * [*flat, *flat + return value) of the flat buffer, at *old_at in the file
 * and *new_at in the shard. */
static size_t overlap(const fsdp_engine *e, const fsdp_ckpt_manifest *man, int u,
                      const fsdp_ckpt_param *cp, const fsdp_shard_param *sp, int k, size_t *flat,
                      size_t *old_at, size_t *new_at)
{
    size_t a, oa, at;
    size_t n = fsdp_shard_param_run(sp, fsdp_shardmap_slot(&e->sh->sm, e->rank), &a);
    size_t on = fsdp_ckpt_param_run(man, u, cp, k, &oa, &at);
    size_t lo = a > oa ? a : oa, hi = a + n < oa + on ? a + n : oa + on;
    *flat = lo;
    *old_at = at + (lo - oa);
    *new_at = sp->shard_off + (lo - a);
    return n && on && lo < hi ? hi - lo : 0;
}

/* Read from old file k every overlap with this rank's new shards. */
static fsdp_status load_from_file(fsdp_engine *e, const char *ckpt, const fsdp_ckpt_manifest *man,
                                  int k, const size_t *old_shard, size_t *old_first,
                                  float *staging)
{
    fsdp_engine_shared *sh = e->sh;
    int U = sh->sm.n_units;
    for (int u = 0; u < U; u++)
        old_first[u] = fsdp_ckpt_shard_first(man, u, k);
    char path[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(fsdp_ckpt_rank_path(path, sizeof path, ckpt, k));
    const char *names[FSDP_CKPT_MAX_ARRAYS];
    int n_arrays = array_names(sh, names);
    fsdp_ckpt_shard_info info = {.run_id = man->run_id, .step = man->step, .adam_t = man->adam_t,
                                 .rank = k, .world_size = man->world_size, .n_units = U,
                                 .shard_numel = old_shard, .first = old_first,
                                 .n_arrays = n_arrays, .array_names = names};
    fsdp_ckpt_reader *r = NULL;
    FSDP_TRY(fsdp_ckpt_reader_open(&r, path, &info));
    fsdp_status st = FSDP_STATUS_OK;
    for (int u = 0; u < U && st == FSDP_STATUS_OK; u++) {
        const fsdp_shard_unit *su = &sh->sm.units[u];
        fsdp_shard_row *row = fsdp_engine_row(e, u);
        /* the checkpoint lists the trainable parameters in flat order, as the map does */
        for (int i = 0; i < su->seg_first[FSDP_SEG_TRAIN + 1] && st == FSDP_STATUS_OK; i++) {
            size_t x, old_at, new_at;
            size_t n = overlap(e, man, u, &man->units[u].params[i], &su->params[i], k, &x,
                               &old_at, &new_at);
            for (int a = 0; a < n_arrays && st == FSDP_STATUS_OK; a++)
                for (size_t done = 0; done < n && st == FSDP_STATUS_OK;) {
                    size_t m = min_sz(n - done, FSDP_CKPT_BLOCK_NUMEL);
                    st = fsdp_ckpt_reader_read(r, u, a, old_at + done, m, staging);
                    if (st == FSDP_STATUS_OK)
                        st = put_state(e, state_array(row, a) + new_at + done, staging, m);
                    done += m;
                }
        }
        if (st != FSDP_STATUS_OK && st != FSDP_STATUS_IO && st != FSDP_STATUS_OOM)
            fsdp_error_prefix("unit '%s'", su->spec->name);
    }
    fsdp_ckpt_reader_close(r);
    return st;
}

/* Whether old file k holds any of this rank's new shards' rows. */
static bool file_needed(const fsdp_engine *e, const fsdp_ckpt_manifest *man, int k)
{
    for (int u = 0; u < e->sh->sm.n_units; u++) {
        const fsdp_shard_unit *su = &e->sh->sm.units[u];
        for (int i = 0; i < su->seg_first[FSDP_SEG_TRAIN + 1]; i++) {
            size_t x, o, a;
            if (overlap(e, man, u, &man->units[u].params[i], &su->params[i], k, &x, &o, &a))
                return true;
        }
    }
    return false;
}

fsdp_status fsdp_engine_ckpt_load(fsdp_engine *e, const char *ckpt, const fsdp_ckpt_manifest *man)
{
    fsdp_engine_shared *sh = e->sh;
    int U = sh->sm.n_units, N_old = man->world_size;
    /* the files: every shard once, or (replicated) world_size whole copies */
    int n_files = man->replicated ? N_old : fsdp_ckpt_n_shards(man);
    if (!fsdp_device_computes(&e->dev))
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                              "checkpoints need the cpu or cuda backend (meta holds no values)");
    if (man->n_units != U)
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "checkpoint manifest not checked against "
                                                    "the model");
    fsdp_status st = FSDP_STATUS_OK;
    float *staging = NULL;
    size_t *old_shard = malloc((size_t)U * sizeof(size_t) + 1);
    size_t *old_first = malloc((size_t)U * sizeof(size_t) + 1);
    if (!old_shard || !old_first || !(staging = malloc(FSDP_CKPT_BLOCK_NUMEL * 4))) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "rank %d: out of host memory loading a checkpoint",
                            e->rank);
        goto fail;
    }
    for (int u = 0; u < U; u++) {
        old_shard[u] = man->units[u].shard_numel;
        FSDP_CHECK(e->place->params_ready(e, u)); /* no update may be in flight */
    }
    FSDP_CHECK(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    for (int u = 0; u < U; u++) { /* padding is zero in every state; the files fill the rest */
        fsdp_shard_row *row = fsdp_engine_row(e, u);
        for (int a = 0; a < 1 + sh->optim->n_state; a++)
            FSDP_CHECK(fsdp_device_memset(&e->dev, state_array(row, a), 0,
                                          sh->sm.units[u].shard_numel * 4, e->dev.compute));
    }
    for (int k = 0; k < n_files; k++) {
        /* with shard none every old file holds everything: spread the reads */
        if (man->replicated && k != e->rank % N_old)
            continue;
        if (file_needed(e, man, k))
            FSDP_CHECK(load_from_file(e, ckpt, man, k, old_shard, old_first, staging));
    }
    for (int u = 0; u < U; u++)
        FSDP_CHECK(e->place->param_refresh(e, u));
    e->t = man->adam_t;
    st = fsdp_device_stream_sync(&e->dev, e->dev.compute);
    if (st == FSDP_STATUS_OK)
        FSDP_INFO(FSDP_SUB_CKPT, "rank %d loaded checkpoint %s (written by %d ranks)", e->rank,
                  ckpt, N_old);
fail:
    free(staging);
    free(old_shard);
    free(old_first);
    return st;
}
