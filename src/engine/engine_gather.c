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

/* ---- the ranks' shards and the model's layout ------------------------------- */

static fsdp_status copy_rows(fsdp_engine *e, void *dst, size_t dpitch, const void *src,
                             size_t spitch, size_t width, size_t height, fsdp_stream_t s,
                             bool host)
{
    if (!host)
        return fsdp_device_memcpy2d(&e->dev, dst, dpitch, src, spitch, width, height, s);
    for (size_t i = 0; i < height; i++)
        memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
    return FSDP_STATUS_OK;
}

static fsdp_status zero(fsdp_engine *e, void *dst, size_t bytes, fsdp_stream_t s, bool host)
{
    if (!host)
        return fsdp_device_memset(&e->dev, dst, 0, bytes, s);
    memset(dst, 0, bytes);
    return FSDP_STATUS_OK;
}

/* Per parameter: the slots that hold shard_rows real rows as one strided
 * copy, then the last slots' fewer rows (and, copying in, their padding). */
fsdp_status fsdp_engine_permute(fsdp_engine *e, int u, int first, int end, size_t stride,
                                size_t base, void *flat, void *rm, size_t es, bool to_flat,
                                fsdp_stream_t s, bool host)
{
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    size_t K = (size_t)e->sh->sm.shard_ranks, S = stride * es, used = 0;
    for (int i = first; i < end; i++) {
        const fsdp_shard_param *sp = &su->params[i];
        size_t span = fsdp_shard_param_span(sp) * es, full = sp->rows / sp->shard_rows;
        char *f = (char *)flat + sp->spec->offset * es;
        char *r = (char *)rm + (sp->shard_off - base) * es;
        full = full < K ? full : K;
        if (to_flat)
            FSDP_TRY(copy_rows(e, f, span, r, S, span, full, s, host));
        else
            FSDP_TRY(copy_rows(e, r, S, f, span, span, full, s, host));
        for (size_t k = full; k < K; k++) {
            size_t at, n = fsdp_shard_param_run(sp, (int)k, &at) * es;
            char *slot = r + k * S, *fk = (char *)flat + at * es;
            FSDP_TRY(to_flat ? copy_rows(e, fk, n, slot, n, n, 1, s, host)
                             : copy_rows(e, slot, n, fk, n, n, 1, s, host));
            if (!to_flat)
                FSDP_TRY(zero(e, slot + n, span - n, s, host));
        }
        used = (sp->shard_off - base) * es + span;
    }
    for (size_t k = 0; !to_flat && used < S && k < K; k++) /* the slots' end padding */
        FSDP_TRY(zero(e, (char *)rm + k * S + used, S - used, s, host));
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
    const char *what =
        fsdp_engine_label(e, u, trainable ? FSDP_LABEL_UPLOAD : FSDP_LABEL_FROZEN_UPLOAD);
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
    if (!fsdp_engine_permuted(e)) /* the shard is the segment: one dequantization */
        FSDP_OP(&e->ops_gather, nf4_dequant,
                (char *)row->gathered + su->spec->nf4_begin * dt_size(e), (const uint8_t *)packed,
                (const float *)(packed + su->nf4_shard / 2), su->nf4_shard);
    for (int k = 0; k < k_ranks && fsdp_engine_permuted(e); k++) /* each slot's rows of each */
        for (int i = su->seg_first[FSDP_SEG_NF4]; i < su->seg_first[FSDP_SEG_NF4 + 1]; i++) {
            const fsdp_shard_param *sp = &su->params[i];
            const char *shard = packed + (size_t)k * bytes;
            size_t at, n = fsdp_shard_param_run(sp, k, &at);
            if (n)
                FSDP_OP(&e->ops_gather, nf4_dequant, (char *)row->gathered + at * dt_size(e),
                        (const uint8_t *)shard + sp->shard_off / 2,
                        (const float *)(shard + su->nf4_shard / 2) + sp->shard_off / 64, n);
        }
    if (fsdp_engine_sharded(e))
        fsdp_device_free(&e->dev, packed); /* stream-ordered: after the dequantization */
    else
        stage_done(e, row->nf4, mine);
    return FSDP_STATUS_OK;
}

/* Group g of unit u (shardmap.h) from this rank's shard of its segment
 * (`mine`, device memory) into the gathered buffer, on the comm stream: a
 * direct one all-gathered into its place, a packed one into a rank-major
 * buffer of its own, copied out and freed (stream-ordered). */
static fsdp_status gather_group(fsdp_engine *e, int u, const fsdp_shard_group *g, const char *mine,
                                fsdp_unit_label label)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    size_t es = dt_size(e), K = (size_t)e->sh->sm.shard_ranks;
    fsdp_dtype dt = e->sh->cfg.compute_dtype;
    void *rm = (char *)row->gathered + su->params[g->first].spec->offset * es;
    if (!g->direct)
        FSDP_TRY(fsdp_device_alloc(&e->dev, g->span * es * K, FSDP_MEM_GATHER,
                                   fsdp_engine_label(e, u, FSDP_LABEL_ALL_GATHER), &rm));
    fsdp_comm_label_str(e->shard_comm, fsdp_engine_label(e, u, label));
    FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine + g->shard_off * es, rm, g->span, dt,
                                  e->dev.comm));
    if (g->direct)
        return FSDP_STATUS_OK;
    FSDP_TRY(fsdp_engine_permute(e, u, g->first, g->end, g->span, g->shard_off, row->gathered, rm,
                                 es, true, e->dev.comm, false));
    fsdp_device_free(&e->dev, rm); /* stream-ordered: after the copies out */
    return FSDP_STATUS_OK;
}

/* Segment seg of unit u into its place in the gathered buffer, on the
 * comm stream: this rank's shard `shard` (uploaded first where it is in
 * host memory) all-gathered group by group over several shard ranks,
 * straight into the buffer over one; without sharding a copy. */
static fsdp_status gather_segment(fsdp_engine *e, int u, fsdp_shard_seg seg, void *shard)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    size_t n = fsdp_shard_seg_numel(su, seg), es = dt_size(e);
    char *at = (char *)row->gathered + (seg == FSDP_SEG_TRAIN ? 0 : su->numel) * es;
    if (!n)
        return FSDP_STATUS_OK;
    if (!fsdp_engine_sharded(e)) /* copies: from pinned host memory too */
        return fsdp_device_memcpy(&e->dev, at, shard, n * es, e->dev.comm);
    void *mine;
    FSDP_TRY(stage(e, u, seg == FSDP_SEG_TRAIN, shard, n * es, &mine));
    fsdp_unit_label label =
        seg == FSDP_SEG_TRAIN ? FSDP_LABEL_ALL_GATHER : FSDP_LABEL_FROZEN_GATHER;
    if (!fsdp_engine_permuted(e)) {
        fsdp_comm_label_str(e->shard_comm, fsdp_engine_label(e, u, label));
        FSDP_TRY(fsdp_comm_all_gather(e->shard_comm, mine, at, n, e->sh->cfg.compute_dtype,
                                      e->dev.comm));
    }
    for (int g = su->group_first[seg]; g < su->group_first[seg + 1]; g++)
        FSDP_TRY(gather_group(e, u, &su->groups[g], mine, label));
    stage_done(e, shard, mine);
    return FSDP_STATUS_OK;
}

/* Issue the all-gather of unit u on the comm stream (no-op if resident):
 * the trainable segment, then the frozen ones (gather_segment, gather_nf4).
 * Without sharding the buffer is the trainable shard itself, or, with a
 * frozen segment or the shard in host memory, the shards copied into one
 * device buffer of the model's layout. */
fsdp_status fsdp_engine_gather_issue(fsdp_engine *e, int u)
{
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    if (row->state != FSDP_UNIT_SHARDED)
        return FSDP_STATUS_OK;
    FSDP_TRY(e->place->params_ready(e, u));
    if (!fsdp_engine_sharded(e) && !su->frozen_numel && !su->nf4_numel &&
        !fsdp_offload_trainable_params(&e->sh->cfg)) {
        row->gathered = row->param;
        row->state = FSDP_UNIT_GATHERED;
        return FSDP_STATUS_OK;
    }
    size_t n = su->extent;
    FSDP_TRY(fsdp_device_alloc(&e->dev, n * dt_size(e), FSDP_MEM_GATHER,
                               fsdp_engine_label(e, u, FSDP_LABEL_GATHER), &row->gathered));
    fsdp_trace_begin(&e->tr, FSDP_TRACE_COMM, "all_gather", su->spec->name, n * dt_size(e));
    FSDP_TRY(gather_segment(e, u, FSDP_SEG_TRAIN, row->param));
    FSDP_TRY(gather_segment(e, u, FSDP_SEG_FROZEN, row->frozen));
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

/* The shard ranks' shards side by side in host memory `host` (all bytes):
 * this rank's `mine` (count elements of dt, in device memory) all-gathered
 * into a device buffer of their own, or copied without sharding. */
static fsdp_status export_pull(fsdp_engine *e, const void *mine, size_t count, fsdp_dtype dt,
                               size_t all, void *host)
{
    void *full = NULL;
    fsdp_status st = fsdp_device_alloc(&e->dev, all, FSDP_MEM_OTHER, "unit export", &full);
    if (st == FSDP_STATUS_OK && fsdp_engine_sharded(e))
        st = fsdp_comm_all_gather(e->shard_comm, mine, full, count, dt, e->dev.comm);
    else if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&e->dev, full, mine, all, e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&e->dev, host, full, all, e->dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(&e->dev, e->dev.comm);
    fsdp_device_free(&e->dev, full);
    return st;
}

/* Segment seg of unit u to host memory in the model's layout: this rank's
 * shard `seg_buf` (n elements of dt; in pinned host memory too, staged)
 * all-gathered into a device buffer (copied, without sharding), the ranks'
 * shards to a host buffer, and their real rows into `flat` (the unit's
 * element 0 in elements of dt: only the segment's range is written).
 * Collective over the shard ranks. */
static fsdp_status export_segment(fsdp_engine *e, int u, fsdp_shard_seg seg, void *seg_buf,
                                  fsdp_dtype dt, void *flat)
{
    const fsdp_shard_unit *su = &e->sh->sm.units[u];
    size_t n = fsdp_shard_seg_numel(su, seg), es = fsdp_dtype_size(dt);
    size_t k = fsdp_engine_sharded(e) ? (size_t)e->sh->sm.shard_ranks : 1, all = n * k * es;
    void *mine = seg_buf;
    char *host = malloc(all + 1);
    if (!host)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory exporting unit '%s'",
                              su->spec->name);
    fsdp_status st = seg == FSDP_SEG_TRAIN ? FSDP_STATUS_OK
                                           : stage(e, u, false, seg_buf, n * es, &mine);
    if (st == FSDP_STATUS_OK)
        st = export_pull(e, mine, n, dt, all, host);
    if (seg != FSDP_SEG_TRAIN)
        stage_done(e, seg_buf, mine);
    if (st == FSDP_STATUS_OK) /* one shard rank: each parameter's rows are all of it */
        st = fsdp_engine_permute(e, u, su->seg_first[seg], su->seg_first[seg + 1], n, 0, flat,
                                 host, es, true, NULL, true);
    free(host);
    return st;
}

/* Unit u's NF4 segment gathered, dequantized to fp32 into x (its
 * nf4_numel elements). Collective over the shard ranks. The shard bytes
 * travel as fp32 words. */
static fsdp_status gather_nf4_export(fsdp_engine *e, int u, float *x)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    int k_ranks = fsdp_engine_sharded(e) ? e->sh->sm.shard_ranks : 1;
    size_t bytes = fsdp_shardmap_nf4_bytes(su), all = bytes * (size_t)k_ranks;
    void *mine = NULL, *nf4 = fsdp_engine_row(e, u)->nf4;
    uint8_t *host = malloc(all + 1);
    if (!host)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory exporting unit '%s'",
                              su->spec->name);
    fsdp_status st = stage(e, u, false, nf4, bytes, &mine);
    if (st == FSDP_STATUS_OK)
        st = export_pull(e, mine, bytes / sizeof(float), FSDP_DTYPE_F32, all, host);
    stage_done(e, nf4, mine);
    for (int k = 0; st == FSDP_STATUS_OK && k < k_ranks; k++) /* each slot's rows of each */
        for (int i = su->seg_first[FSDP_SEG_NF4]; i < su->seg_first[FSDP_SEG_NF4 + 1]; i++) {
            const fsdp_shard_param *sp = &su->params[i];
            const uint8_t *shard = host + (size_t)k * bytes;
            size_t at, n = fsdp_shard_param_run(sp, k, &at);
            if (n)
                fsdp_nf4_dequant_ref(shard + sp->shard_off / 2,
                                     (const float *)(shard + su->nf4_shard / 2) +
                                         sp->shard_off / 64,
                                     n, x + (at - su->spec->nf4_begin));
        }
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
    size_t es = fsdp_dtype_size(dt);
    if (su->nf4_numel)
        FSDP_TRY(gather_nf4_export(e, u, host_out + su->frozen_numel));
    if (!su->frozen_numel)
        return FSDP_STATUS_OK;
    char *flat = malloc(su->spec->nf4_begin * es); /* [train_numel, nf4_begin) is written */
    if (!flat)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory exporting unit '%s'",
                              su->spec->name);
    fsdp_status st = export_segment(e, u, FSDP_SEG_FROZEN, fsdp_engine_row(e, u)->frozen, dt,
                                    flat);
    const char *frozen = flat + su->numel * es;
    for (size_t i = 0; st == FSDP_STATUS_OK && i < su->frozen_numel; i++)
        host_out[i] = dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(((const fsdp_bf16 *)frozen)[i])
                                            : ((const float *)frozen)[i];
    free(flat);
    return st;
}

static fsdp_status gather_unit_run(fsdp_engine *e, int u, float *host_out)
{
    fsdp_shard_unit *su = &e->sh->sm.units[u];
    fsdp_shard_row *row = fsdp_engine_row(e, u);
    float *shard = NULL;
    FSDP_TRY(e->place->params_ready(e, u));
    if (!su->padded_numel)
        return gather_frozen(e, u, host_out + su->numel);
    fsdp_status st = e->place->master_on_device(e, u, &shard);
    if (st == FSDP_STATUS_OK)
        st = export_segment(e, u, FSDP_SEG_TRAIN, shard, FSDP_DTYPE_F32, host_out);
    if (shard != row->master)
        fsdp_device_free(&e->dev, shard);
    if (st == FSDP_STATUS_OK)
        st = gather_frozen(e, u, host_out + su->numel);
    return st;
}

fsdp_status fsdp_engine_gather_unit(fsdp_engine *e, int u, float *host_out)
{
    return fsdp_engine_note(e, gather_unit_run(e, u, host_out));
}
