/*
 * engine_gather.c - a rank's gathers: each unit's shards (trainable,
 * frozen, NF4) all-gathered into one device buffer on the comm stream and
 * released after use, with params offload's uploads from pinned host
 * memory (staging); and a unit gathered whole to the host (export,
 * fsdp_engine_gather_unit).
 *
 * The step (engine.c) and the forward-only calls use the gathers through
 * engine_internal.h; the streams and events follow engine.c's rules.
 */
#include <string.h>

#include "core/bf16.h"
#include "engine/engine.h"
#include "engine/engine_internal.h"
#include "ops/nf4.h"

/* ---- helpers ------------------------------------------------------------ */

static size_t dt_size(const fsdp_engine *e) { return fsdp_dtype_size(e->sh->cfg.compute_dtype); }

/* Wait for all work on every stream of the device (end of a phase). */
fsdp_status fsdp_engine_sync_all(fsdp_engine *e)
{
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.compute));
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.comm));
    FSDP_TRY(fsdp_device_stream_sync(&e->dev, e->dev.copy));
    return FSDP_STATUS_OK;
}

/* ---- gather / release ---------------------------------------------------- */

/* A shard of unit u the gather reads, of the trainable segment or a frozen
 * one: where params offload keeps it in pinned host memory, `src` uploaded
 * into a device buffer of its own on the comm stream (free it with
 * stage_done once the gather has read it); else src. The upload is issued
 * after the placement's params_ready, so it reads the last update. */
static fsdp_status stage(fsdp_engine *e, int u, bool trainable, void *src, size_t bytes,
                         void **out)
{
    *out = src;
    if (trainable ? !fsdp_offload_trainable_params(&e->sh->cfg) : !e->sh->cfg.offload_params)
        return FSDP_STATUS_OK;
    char what[96];
    snprintf(what, sizeof what, "unit '%s' %s shard upload", e->sh->sm.units[u].spec->name,
             trainable ? "parameter" : "frozen");
    FSDP_TRY(fsdp_device_alloc(&e->dev, bytes, FSDP_MEM_GATHER, what, out));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COPY, "param h2d", e->sh->sm.units[u].spec->name, bytes);
    FSDP_TRY(fsdp_device_memcpy(&e->dev, *out, src, bytes, e->dev.comm));
    fsdp_trace_end(&e->tr, FSDP_TRACE_COPY);
    return FSDP_STATUS_OK;
}

static void stage_done(fsdp_engine *e, void *src, void *staged)
{
    if (staged != src)
        fsdp_device_free(&e->dev, staged); /* stream-ordered: after what read it */
}

/* The NF4 segment of unit u's gather, after the other segments' on the
 * comm stream: the ranks' packed shards (codes + absmax) all-gathered into
 * a buffer of their own, each dequantized into the gathered buffer at its
 * place in the NF4 group, then the packed buffer freed (stream-ordered).
 * The shard bytes travel as fp32 words: nothing is computed on them. */
static fsdp_status gather_nf4(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    if (!su->nf4_numel)
        return FSDP_STATUS_OK;
    int k_ranks = fsdp_engine_sharded(e) ? e->sh->sm.shard_ranks : 1;
    size_t bytes = fsdp_shardmap_nf4_bytes(su);
    void *mine;
    FSDP_TRY(stage(e, u, false, row->nf4, bytes, &mine));
    char *packed = mine;
    if (fsdp_engine_sharded(e)) {
        char what[96];
        snprintf(what, sizeof what, "unit '%s' NF4 gather", su->spec->name);
        FSDP_TRY(fsdp_device_alloc(&e->dev, bytes * (size_t)k_ranks, FSDP_MEM_GATHER, what,
                                   (void **)&packed));
        fsdp_trace_begin(&e->tr, FSDP_TRACE_COMM, "all_gather_nf4", su->spec->name,
                         bytes * (size_t)k_ranks);
        fsdp_comm_label(e->shard_comm, "unit '%s' NF4 all-gather", su->spec->name);
        FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, packed, bytes / sizeof(float),
                                      FSDP_DTYPE_F32, e->dev.comm));
        fsdp_trace_end(&e->tr, FSDP_TRACE_COMM);
        stage_done(e, row->nf4, mine);
    }
    char *out = (char *)row->gathered + su->spec->nf4_begin * dt_size(e);
    for (int k = 0; k < k_ranks; k++) {
        const char *shard = packed + (size_t)k * bytes;
        FSDP_OP(&e->ops_gather, nf4_dequant, out + (size_t)k * su->nf4_shard * dt_size(e),
                (const uint8_t *)shard, (const float *)(shard + su->nf4_shard / 2),
                su->nf4_shard);
    }
    if (fsdp_engine_sharded(e))
        fsdp_device_free(&e->dev, packed); /* stream-ordered: after the dequantization */
    else
        stage_done(e, row->nf4, mine);
    return FSDP_STATUS_OK;
}

/* Issue the all-gather of unit u on the comm stream (no-op if resident):
 * the trainable segment, then the frozen one over its padding (shardmap.h).
 * Without sharding the buffer is the trainable shard itself, or, with a
 * frozen segment or the shard in host memory, the shards copied into one
 * device buffer of the model's layout. */
fsdp_status fsdp_engine_gather_issue(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    if (row->state != FSDP_UNIT_SHARDED)
        return FSDP_STATUS_OK;
    FSDP_TRY(e->place->params_ready(e, u));
    if (!fsdp_engine_sharded(e) && !su->frozen_numel && !su->nf4_numel &&
        !fsdp_offload_trainable_params(&e->sh->cfg)) {
        row->gathered = row->param;
        row->state = FSDP_UNIT_GATHERED;
        return FSDP_STATUS_OK;
    }
    char what[96];
    size_t n = fsdp_shardmap_gathered_numel(su);
    snprintf(what, sizeof what, "unit '%s' gather", su->spec->name);
    FSDP_TRY(fsdp_device_alloc(&e->dev, n * dt_size(e), FSDP_MEM_GATHER, what, &row->gathered));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMM, "all_gather", su->spec->name, n * dt_size(e));
    char *frozen_at = (char *)row->gathered + su->numel * dt_size(e);
    if (fsdp_engine_sharded(e)) {
        if (su->shard_numel) {
            void *mine;
            FSDP_TRY(stage(e, u, true, row->param, su->shard_numel * dt_size(e), &mine));
            fsdp_comm_label(e->shard_comm, "unit '%s' all-gather", su->spec->name);
            FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, row->gathered, su->shard_numel,
                                          dt, e->dev.comm));
            stage_done(e, row->param, mine);
        }
        if (su->frozen_shard) {
            void *mine;
            FSDP_TRY(stage(e, u, false, row->frozen, su->frozen_shard * dt_size(e), &mine));
            fsdp_comm_label(e->shard_comm, "unit '%s' frozen all-gather", su->spec->name);
            FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, frozen_at, su->frozen_shard, dt,
                                          e->dev.comm));
            stage_done(e, row->frozen, mine);
        }
    } else { /* copies: from pinned host memory too */
        if (su->shard_numel)
            FSDP_TRY(fsdp_device_memcpy(&e->dev, row->gathered, row->param,
                                        su->shard_numel * dt_size(e), e->dev.comm));
        if (su->frozen_shard)
            FSDP_TRY(fsdp_device_memcpy(&e->dev, frozen_at, row->frozen,
                                        su->frozen_shard * dt_size(e), e->dev.comm));
    }
    fsdp_trace_end(&e->tr, FSDP_TRACE_COMM);
    FSDP_TRY(gather_nf4(e, u));
    FSDP_TRY(fsdp_device_event_record(&e->dev, e->ev_gather[u], e->dev.comm));
    row->state = FSDP_UNIT_GATHERING;
    return FSDP_STATUS_OK;
}

/* Make unit u's gathered parameters usable on the compute stream. */
fsdp_status fsdp_engine_gather_wait(fsdp_engine *e, int u)
{
    FSDP_TRY(fsdp_engine_gather_issue(e, u));
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    if (row->state == FSDP_UNIT_GATHERING) {
        FSDP_TRY(fsdp_device_stream_wait_event(&e->dev, e->dev.compute, e->ev_gather[u]));
        row->state = FSDP_UNIT_GATHERED;
    }
    return FSDP_STATUS_OK;
}

/* Free unit u's gathered buffer. The free is stream-ordered (device.h):
 * the memory is reused only after the work already queued on the device's
 * streams (this unit's gather and compute) is done, so the host does not
 * wait here and the next gather overlaps this unit's compute. */
fsdp_status fsdp_engine_gather_release(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    if (row->state == FSDP_UNIT_SHARDED)
        return FSDP_STATUS_OK;
    if (row->gathered != row->param)
        fsdp_device_free(&e->dev, row->gathered);
    row->gathered = NULL;
    row->state = FSDP_UNIT_SHARDED;
    return FSDP_STATUS_OK;
}

/* ---- a unit to the host (export) ------------------------------------------ */

/* The export's gather: this rank's shard `mine` (count elements of dt) all-gathered
 * into the device buffer `full` (copied, full_bytes, without sharding), then its
 * first host_bytes copied to `host` and the comm stream synced. */
static fsdp_status export_gather(fsdp_engine *e, const void *mine, void *full, size_t count,
                                 fsdp_dtype dt, size_t full_bytes, void *host, size_t host_bytes)
{
    if (fsdp_engine_sharded(e))
        FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, full, count, dt, e->dev.comm));
    else
        FSDP_TRY(fsdp_device_memcpy(&e->dev, full, mine, full_bytes, e->dev.comm));
    FSDP_TRY(fsdp_device_memcpy(&e->dev, host, full, host_bytes, e->dev.comm));
    return fsdp_device_stream_sync(&e->dev, e->dev.comm);
}

/* One frozen segment of unit u gathered into a new host buffer *host_out
 * of all_bytes (and `extra` bytes after them for the caller; it frees the
 * buffer, also on failure): `seg` is the row's buffer, shard_bytes of it
 * this rank's, count elements of dt per rank; `what` names the device
 * buffer. Collective over the shard ranks. */
static fsdp_status export_segment(fsdp_engine *e, int u, void *seg, size_t shard_bytes,
                                  size_t count, fsdp_dtype dt, size_t all_bytes, size_t extra,
                                  const char *what, char **host_out)
{
    void *full = NULL, *mine = seg;
    char *host = malloc(all_bytes + extra);
    *host_out = host;
    if (!host)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory exporting unit '%s'",
                              e->sh->sm.units[u].spec->name);
    fsdp_status st = fsdp_device_alloc(&e->dev, all_bytes, FSDP_MEM_OTHER, what, &full);
    if (st == FSDP_STATUS_OK)
        st = stage(e, u, false, seg, shard_bytes, &mine);
    if (st == FSDP_STATUS_OK)
        st = export_gather(e, mine, full, count, dt, all_bytes, host, all_bytes);
    stage_done(e, seg, mine);
    fsdp_device_free(&e->dev, full);
    return st;
}

/* Unit u's NF4 segment gathered, dequantized to fp32 into host_out (its
 * nf4_numel elements). Collective over the shard ranks. */
static fsdp_status gather_nf4_export(fsdp_engine *e, int u, float *host_out)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    int k_ranks = fsdp_engine_sharded(e) ? e->sh->sm.shard_ranks : 1;
    size_t bytes = fsdp_shardmap_nf4_bytes(su), all = bytes * (size_t)k_ranks;
    char *host;
    fsdp_status st = export_segment(e, u, fsdp_engine_row(e, u)->nf4, bytes,
                                    bytes / sizeof(float), FSDP_DTYPE_F32, all,
                                    su->nf4_padded * sizeof(float), "unit export (NF4)", &host);
    float *x = st == FSDP_STATUS_OK ? (float *)(host + all) : NULL;
    for (int k = 0; st == FSDP_STATUS_OK && k < k_ranks; k++) {
        const uint8_t *shard = (const uint8_t *)host + (size_t)k * bytes;
        fsdp_nf4_dequant_ref(shard, (const float *)(shard + su->nf4_shard / 2), su->nf4_shard,
                             x + (size_t)k * su->nf4_shard);
    }
    if (st == FSDP_STATUS_OK)
        memcpy(host_out, x, su->nf4_numel * sizeof(float));
    free(host);
    return st;
}

/* Unit u's frozen segments gathered, widened (or dequantized) to fp32 into
 * host_out (the unit's elements from train_numel on). Collective over the
 * shard ranks. */
static fsdp_status gather_frozen(fsdp_engine *e, int u, float *host_out)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    size_t bytes = su->frozen_padded * fsdp_dtype_size(dt);
    if (su->nf4_numel)
        FSDP_TRY(gather_nf4_export(e, u, host_out + su->frozen_numel));
    if (!su->frozen_numel)
        return FSDP_STATUS_OK;
    char *host;
    fsdp_status st = export_segment(e, u, fsdp_engine_row(e, u)->frozen,
                                    su->frozen_shard * fsdp_dtype_size(dt), su->frozen_shard, dt,
                                    bytes, 1, "unit export (frozen)", &host);
    for (size_t i = 0; st == FSDP_STATUS_OK && i < su->frozen_numel; i++)
        host_out[i] = dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(((const fsdp_bf16 *)host)[i])
                                            : ((const float *)host)[i];
    free(host);
    return st;
}

static fsdp_status gather_unit_run(fsdp_engine *e, int u, float *host_out)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    float *full = NULL, *shard = NULL;
    FSDP_TRY(e->place->params_ready(e, u));
    if (!su->padded_numel)
        return gather_frozen(e, u, host_out + su->numel);
    FSDP_TRY(fsdp_device_alloc(&e->dev, su->padded_numel * sizeof(float), FSDP_MEM_OTHER,
                               "unit export", (void **)&full));
    fsdp_status st = e->place->master_on_device(e, u, &shard);
    if (st == FSDP_STATUS_OK)
        st = export_gather(e, shard, full, su->shard_numel, FSDP_DTYPE_F32,
                           su->padded_numel * sizeof(float), host_out, su->numel * sizeof(float));
    if (shard != row->master)
        fsdp_device_free(&e->dev, shard);
    fsdp_device_free(&e->dev, full);
    if (st == FSDP_STATUS_OK)
        st = gather_frozen(e, u, host_out + su->numel);
    return st;
}

fsdp_status fsdp_engine_gather_unit(fsdp_engine *e, int u, float *host_out)
{
    return fsdp_engine_note(e, gather_unit_run(e, u, host_out));
}
