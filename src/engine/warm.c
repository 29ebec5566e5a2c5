/*
 * warm.c - the engine's warm-up: before the first step, reserve on the
 * device (fsdp_device_reserve) the buffers that the step allocates and
 * frees again, as many of each size as the step holds at once.
 *
 * Why: on cuda every allocation comes from the device's block cache, which
 * otherwise learns the step's sizes during the first step by asking the
 * driver; a cudaMalloc while another rank's collective kernel waits for its
 * peers is a known hang pattern, and a cudaFree waits for the whole device.
 * With the reservation not even the first step asks the driver. cpu
 * devices reserve the same blocks in their host-memory cache, meta
 * prepares nothing, and nothing is counted on any backend: in-use bytes,
 * peaks and the planner's figures stay exact.
 *
 * How many: two steps' allocations and frees of the buffers that come and
 * go (gathered units, full gradients, accumulation buffers) are replayed
 * here on sizes alone, in the order micro_step in engine.c makes them, and
 * the most live at once of each size is reserved (the second step starts
 * with the accumulation buffers the first one made and kept). Replaying the order, not
 * adding up kinds, lets one size serve several kinds when they alternate
 * (a block's gathered buffer goes just before its accumulation buffer is
 * made). With prefetch, one more full gradient of each block size is
 * reserved beyond what the step holds: the next unit's backward writes it
 * while the previous one is still being reduce-scattered, so the backward
 * need not wait for the collective. An inference engine (config
 * `inference`) only runs forwards: its root and one unit at a time are
 * replayed. The step's exchanges (engine_comms.c: the norm and losses,
 * the figures, a job's stop word) come after its last micro-step. Op
 * scratch, grown by the ops on first use, is not reserved here. tests/test_engine_device.c checks
 * the replay against the real step through the device's warm-up ledger, for every strategy,
 * prefetch, placement and accumulation depth.
 *
 * What it costs on a GPU: the planner's peak (mem.peak_bytes) is the bytes
 * the engine asks for, exact as on cpu and meta, reservation or not. What
 * the device holds beyond them is mem.reserved_bytes: at the peak, the
 * size classes' rounding of the live blocks (under 512 B each up to 1 MiB,
 * 128 KiB up to 32 MiB, 2 MiB above), the reserved blocks of a size whose
 * most-live moment is not the peak's, the prefetch's extra full gradient
 * of each block size, and the backend's own buffers (cuBLAS workspace, op
 * scratch, peer staging). fsdp plan --fit's cuda overhead estimates the
 * rounding, the workspace and the scratch; the extra full gradient (one
 * block's padded numel x 4 bytes) is the part it does not count yet.
 *
 * Placements: the device placement lends its gradient shard to the
 * accumulation counter (fsdp_accum_adopt) and keeps the counter's other
 * buffers for good; with host_grads (offload) the counter lives in pinned
 * host memory and the device holds only each reduction's own shard-sized
 * buffer, made before the collective and freed once its copy to the host
 * is queued.
 */
#include <stdlib.h>

#include "core/log.h"
#include "core/world.h"
#include "engine/engine_internal.h"

/* Live and most-live counts per size. */
struct sizes {
    struct size_count {
        size_t bytes, live, peak;
        bool extra; /* the full gradient added for the overlap */
    } *v;
    int n, cap;
};

static struct size_count *size_at(struct sizes *s, size_t bytes)
{
    for (int i = 0; i < s->n; i++)
        if (s->v[i].bytes == bytes)
            return &s->v[i];
    FSDP_ASSERT(s->n < s->cap);
    s->v[s->n] = (struct size_count){.bytes = bytes};
    return &s->v[s->n++];
}

static void take(struct sizes *s, size_t bytes, size_t n)
{
    struct size_count *c = size_at(s, bytes);
    c->live += n;
    if (c->live > c->peak)
        c->peak = c->live;
}

static void give(struct sizes *s, size_t bytes, size_t n)
{
    struct size_count *c = size_at(s, bytes);
    FSDP_ASSERT(c->live >= n);
    c->live -= n;
}

/* The replay's view of the engine. */
struct replay {
    fsdp_engine *e;
    struct sizes s;
    bool *gathered;  /* [U] */
    int *made;       /* [U] accumulation buffers made (the lent shard counts) */
    bool lent;       /* the placement lends its gradient shard as buffer 0 */
    bool host;       /* the counter is in host memory (host_grads) */
    bool flat;       /* --accum flat: one buffer per unit and one shared scratch */
    bool scratch;    /* flat's scratch is made */
};

static const fsdp_shard_unit *unit(const struct replay *r, int u)
{
    return &r->e->sh->sm.units[u];
}

static bool sharded(const struct replay *r)
{
    return r->e->sh->cfg.shard != FSDP_SHARD_NONE;
}

static size_t gather_bytes(const struct replay *r, int u)
{
    return unit(r, u)->extent * fsdp_dtype_size(r->e->sh->cfg.compute_dtype);
}

/* Whether the trainable shard lives in pinned host memory (engine.h). */
static bool params_host(const struct replay *r)
{
    return fsdp_offload_trainable_params(&r->e->sh->cfg);
}

/* Whether the gather allocates (engine.c's gather_issue): sharded, or a
 * frozen segment to join with the trainable shard, or that shard on the
 * host. */
static bool gather_allocates(const struct replay *r, int u)
{
    return sharded(r) || unit(r, u)->frozen_numel || unit(r, u)->nf4_numel || params_host(r);
}

/* The NF4 segment's packed all-gather buffer (engine.c's gather_nf4), live
 * only until its dequantization; 0 when there is none. */
static size_t nf4_gather_bytes(const struct replay *r, int u)
{
    if (!sharded(r) || !unit(r, u)->nf4_numel)
        return 0;
    return fsdp_shardmap_nf4_bytes(unit(r, u)) * (size_t)r->e->sh->sm.shard_ranks;
}

static size_t grad_bytes(const struct replay *r, int u)
{
    return unit(r, u)->train_extent * sizeof(float);
}

/* engine.c's grad_reduce: each packed group's rank-major copy of its
 * gradients, made and freed around its reduce-scatter, then the full
 * gradient goes. */
static void reduce_send(struct replay *r, int u)
{
    const fsdp_shard_unit *su = unit(r, u);
    for (int g = su->group_first[FSDP_SEG_TRAIN]; g < su->group_first[FSDP_SEG_TRAIN + 1]; g++)
        if (!su->groups[g].direct) {
            size_t pack = su->groups[g].span * sizeof(float) * (size_t)r->e->sh->sm.shard_ranks;
            take(&r->s, pack, 1);
            give(&r->s, pack, 1);
        }
    give(&r->s, grad_bytes(r, u), 1);
}

static size_t accum_bytes(const struct replay *r, int u)
{
    return unit(r, u)->shard_numel * sizeof(float);
}

/* gather_issue / gather_release */
static void gather(struct replay *r, int u)
{
    if (r->gathered[u])
        return;
    r->gathered[u] = true;
    if (gather_allocates(r, u))
        take(&r->s, gather_bytes(r, u), 1);
    const fsdp_shard_unit *su = unit(r, u);
    size_t dt = fsdp_dtype_size(r->e->sh->cfg.compute_dtype);
    /* engine_gather.c's gather_segment, each segment: the upload of a host
     * shard, each packed group's rank-major buffer (made and freed around its
     * copy out), the upload freed after the segment's last all-gather */
    bool staged = r->e->sh->cfg.offload_params;
    size_t up[2] = {params_host(r) ? su->shard_numel * dt : 0,
                    staged ? su->frozen_shard * dt : 0};
    size_t seg_numel[2] = {su->shard_numel, su->frozen_shard};
    for (int seg = 0; seg < 2 && sharded(r); seg++) {
        if (!seg_numel[seg])
            continue;
        if (up[seg])
            take(&r->s, up[seg], 1);
        for (int g = su->group_first[seg]; g < su->group_first[seg + 1]; g++)
            if (!su->groups[g].direct) {
                size_t rm = su->groups[g].span * dt * (size_t)r->e->sh->sm.shard_ranks;
                take(&r->s, rm, 1);
                give(&r->s, rm, 1);
            }
        if (up[seg])
            give(&r->s, up[seg], 1);
    }
    size_t nf4_up = su->nf4_numel ? fsdp_shardmap_nf4_bytes(su) : 0;
    if (staged && nf4_up)
        take(&r->s, nf4_up, 1);
    if (nf4_gather_bytes(r, u)) {
        take(&r->s, nf4_gather_bytes(r, u), 1);
        if (staged && nf4_up) /* freed once the all-gather has read it */
            give(&r->s, nf4_up, 1);
        give(&r->s, nf4_gather_bytes(r, u), 1);
    } else if (staged && nf4_up) {
        give(&r->s, nf4_up, 1);
    }
}

static void release(struct replay *r, int u)
{
    if (!r->gathered[u])
        return;
    r->gathered[u] = false;
    if (gather_allocates(r, u))
        give(&r->s, gather_bytes(r, u), 1);
}

/* grad_reduce(u) in micro-step j of A: the counter takes its first free
 * buffer, index popcount(j) (accum.c), made on first use (flat: buffer 0,
 * then the rank's one scratch of the largest shard, kept); the full
 * gradient goes; after the last micro-step a placement that lends no
 * buffer releases the unit's. */
static void reduce(struct replay *r, int u, int j, int A)
{
    if (!unit(r, u)->shard_numel) /* a unit that trains nothing reduces nothing */
        return;
    if (r->host) { /* the reduction's buffer, the full gradient, the buffer */
        take(&r->s, accum_bytes(r, u), 1);
        reduce_send(r, u);
        give(&r->s, accum_bytes(r, u), 1);
        return;
    }
    if (r->flat && j > 0 && !r->scratch) {
        take(&r->s, r->e->acc.max_numel * sizeof(float), 1);
        r->scratch = true;
    }
    int k = r->flat ? 0 : __builtin_popcount((unsigned)j);
    if (k >= r->made[u]) {
        take(&r->s, accum_bytes(r, u), (size_t)(k + 1 - r->made[u]));
        r->made[u] = k + 1;
    }
    reduce_send(r, u);
    if (j == A - 1 && !r->lent) {
        give(&r->s, accum_bytes(r, u), (size_t)r->made[u]);
        r->made[u] = 0;
    }
}

/* fsdp_engine_exchange (engine_comms.c): its send and receive buffers,
 * live together, freed before it returns. */
static void exchange(struct replay *r, size_t bytes)
{
    size_t send, recv;
    fsdp_engine_exchange_bytes(r->e, bytes, &send, &recv);
    take(&r->s, send, 1);
    take(&r->s, recv, 1);
    give(&r->s, recv, 1);
    give(&r->s, send, 1);
}

/* One step of micro_step (engine.c), sizes only, then the step's
 * exchanges: the norm's and losses', the figures'. */
static void replay_step(struct replay *r)
{
    const fsdp_engine_config *cfg = &r->e->sh->cfg;
    int U = r->e->sh->sm.n_units, A = cfg->grad_accum;
    bool full = cfg->shard == FSDP_SHARD_FULL || cfg->shard == FSDP_SHARD_HYBRID;
    gather(r, 0);
    for (int j = 0; j < A; j++) {
        if (U > 1)
            gather(r, 1);
        for (int u = 1; u < U; u++) {
            gather(r, u);
            if (cfg->prefetch && u + 1 < U)
                gather(r, u + 1);
            if (full)
                release(r, u);
        }
        if (grad_bytes(r, 0))
            take(&r->s, grad_bytes(r, 0), 1);
        if (U > 1)
            gather(r, U - 1);
        for (int u = U - 1; u >= 1; u--) {
            gather(r, u);
            if (cfg->prefetch && u - 1 >= 1)
                gather(r, u - 1);
            if (grad_bytes(r, u))
                take(&r->s, grad_bytes(r, u), 1);
            release(r, u);
            reduce(r, u, j, A);
        }
        reduce(r, 0, j, A);
    }
    release(r, 0);
    exchange(r, fsdp_engine_norm_record_bytes(r->e));
    exchange(r, fsdp_engine_publish_record_bytes());
    if (r->e->sh->world && r->e->sh->world->n_processes > 1) /* train.c's fsdp_engine_or */
        exchange(r, sizeof(uint32_t));
}

/* forward_only (engine.c): an inference engine's only use of the units. */
static void replay_forward(struct replay *r)
{
    int U = r->e->sh->sm.n_units;
    gather(r, 0);
    for (int u = 1; u < U; u++) {
        gather(r, u);
        release(r, u);
    }
    release(r, 0);
}

fsdp_status fsdp_engine_warm_up(fsdp_engine *e)
{
    int U = e->sh->sm.n_units;
    struct replay r = {.e = e, .host = e->acc.host, .flat = e->acc.mode == FSDP_ACCUM_FLAT};
    for (int u = 0; u < U; u++) /* whether the placement lends its gradient shards */
        if (e->sh->sm.units[u].shard_numel) {
            r.lent = e->acc.units[u].buf[0] != NULL;
            break;
        }
    size_t cap = 8 * (size_t)U + 7; /* + the exchanges' send and receive sizes */
    for (int u = 0; u < U; u++) /* + the packed groups' buffers, gathered and reduced */
        cap += 2 * (size_t)e->sh->sm.units[u].group_first[FSDP_SEG_COUNT];
    r.s.cap = (int)cap;
    r.s.v = calloc(cap, sizeof *r.s.v);
    r.gathered = calloc((size_t)U, sizeof *r.gathered);
    r.made = calloc((size_t)U, sizeof *r.made);
    fsdp_status st = FSDP_STATUS_OK;
    if (!r.s.v || !r.gathered || !r.made) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory planning rank %d's warm-up",
                            e->rank);
        goto out;
    }
    for (int u = 0; u < U; u++)
        r.made[u] = r.lent ? 1 : 0;
    if (e->sh->cfg.inference) {
        replay_forward(&r);
    } else {
        /* two steps: buffers the counter keeps for good are made during
         * the first one, and are live from the start of the second */
        replay_step(&r);
        replay_step(&r);
    }
    if (e->sh->cfg.prefetch && !e->sh->cfg.inference) /* RS overlaps the next backward */
        for (int u = 1; u < U; u++) {
            if (!grad_bytes(&r, u))
                continue;
            struct size_count *c = size_at(&r.s, grad_bytes(&r, u));
            c->peak += !c->extra;
            c->extra = true;
        }
    for (int i = 0; i < r.s.n && st == FSDP_STATUS_OK; i++)
        st = fsdp_device_reserve(&e->dev, r.s.v[i].bytes, r.s.v[i].peak);
    if (st == FSDP_STATUS_OOM) {
        FSDP_WARN(FSDP_SUB_ALLOC, "rank %d: %s; the first step will ask the driver as it goes",
                  e->rank, fsdp_error_msg());
        fsdp_error_clear();
        st = FSDP_STATUS_OK;
    }
out:
    free(r.s.v);
    free(r.gathered);
    free(r.made);
    return st;
}
