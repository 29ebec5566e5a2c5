/*
 * host.c - collectives among cpu rank threads through shared memory.
 *
 * The ranks of a world are threads of one process, so a collective needs no
 * transport: each rank publishes its buffer pointers in its own slot of a
 * table kept in the world's registry (comm.h), all ranks meet, the work is done by
 * reading the other ranks' buffers directly, and all ranks meet again
 * before anyone returns (so no buffer is reused or freed while another rank
 * still reads it). Rank r's share of the work is its own output:
 *
 *   all_gather      every rank's send chunk copied into r's recv
 *   reduce_scatter  chunk r reduced over all ranks into r's recv
 *   all_reduce      slice r of the vector reduced into r's recv; meet; the
 *                   other slices copied from the recv of the ranks that
 *                   reduced them into r's recv; meet
 *   broadcast       the root's buffer copied into r's (root: nothing)
 *
 * Shares are cut into pieces; a rank does its own share first, then helps
 * with what is left of the others' (see "shares of work" below), so a rank
 * the OS is not running delays nobody.
 *
 * Sums follow the fixed balanced binary tree of comm.h exactly, per element
 * (tree(lo,hi) = tree(lo,mid) + tree(mid,hi), mid = lo + (hi-lo)/2), in fp32
 * (bf16 inputs are widened exactly and the result is rounded once), so the
 * result is bit-identical to fsdp_tree_sum() over the per-rank values and
 * does not depend on timing or on which rank computes it. The tree is
 * evaluated over blocks of HOST_BLOCK elements at a time into per-rank
 * scratch vectors, not element by element. AVG is defined as
 * tree_sum * (1.0f / N), one fp32 multiply, then (bf16) one rounding.
 * fp32 outputs of HOST_STREAM_BYTES or more per rank are written with
 * non-temporal stores (no read-for-ownership of the output), which the
 * memory-bound 2-rank reductions feel most.
 *
 * Meetings (comm/meet.h, shared with the mpi transport's ranks of one
 * process): the slots, the meetings and their abort polling. Only the
 * first meeting of a collective can be left on an abort, and a rank that
 * leaves withdraws its arrival, so the communicators can be used by a
 * later launch of the same world.
 *
 * Fault hook: every collective, barrier included, counts as one
 * FSDP_FAULT_COLLECTIVE operation on its rank; the k-th fails with INTERNAL
 * ("rank R: injected failure in collective K (kind)") before publishing
 * anything, and the other ranks return ABORTED once the launcher sets the
 * abort flag on that rank's return.
 *
 * Groups (comm.h): a communicator over a group of the process's ranks
 * works the same way among its members (slots by member index); each
 * group has its own table, so collectives of different groups may run at
 * once. Messages and the fault hook name global ranks.
 *
 * Lifetime: the first member to call fsdp_comm_host_init_group creates the
 * group's shared table under world->mu (in the world's registry, comm.h);
 * every fsdp_comm_fini drops a reference and the last one frees it, so
 * every rank that initialised must also call fsdp_comm_fini, including
 * after a failure.
 */
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "comm/meet.h"
#include "core/bf16.h"
#include "core/log.h"

#define HOST_BLOCK 2048 /* elements per block of the tree reduction */
#define HOST_STREAM_BYTES ((size_t)4 << 20) /* fp32 outputs this large bypass the caches */
#define HOST_PIECE 65536 /* elements per piece of work (a multiple of HOST_BLOCK) */

/* Rank r's work counters (one cache line: stealers hammer it):
 * next[phase] is the next unclaimed piece of r's share in that phase. */
struct host_work {
    _Alignas(64) atomic_size_t next[2];
};

struct host_shared {
    fsdp_meet meet;          /* slots by member index: every member is in this process */
    struct host_work *work;  /* (n_ranks,) */
};

struct host_ctx {
    struct host_shared *sh;
    fsdp_meet_rank mr;   /* this rank's slot and meetings */
    const void **src;    /* (n_ranks,) per-rank source pointers of a reduction */
    float **tmp;         /* (n_tmp,) scratch vectors of HOST_BLOCK floats */
    int n_tmp;
    float *tmp_mem;      /* backing of tmp: (n_tmp, HOST_BLOCK) */
};

/* The published slots of c's group. */
static const fsdp_meet_slot *slots_of(const fsdp_comm *c)
{
    return ((const struct host_ctx *)c->ctx)->sh->meet.slots;
}

/* Start a collective on this rank (comm/meet.h: fault hook, argument
 * checks, publish, first meeting), then check that every rank issued the
 * same collective. On error nothing of this rank is read by the others.
 * The rank's work counters are reset first: every rank finished claiming
 * in the previous collective before its last meeting. */
static fsdp_status begin(fsdp_comm *c, int kind, const void *send, void *recv, size_t numel,
                         fsdp_dtype dt, fsdp_reduce_op op, int root)
{
    struct host_ctx *h = c->ctx;
    atomic_store_explicit(&h->sh->work[c->rank].next[0], 0, memory_order_relaxed);
    atomic_store_explicit(&h->sh->work[c->rank].next[1], 0, memory_order_relaxed);
    const fsdp_coll_args args = {kind, dt, op, root, numel};
    FSDP_TRY(fsdp_meet_begin(&h->mr, c, &args, send, recv, NULL, NULL));
    const fsdp_meet_slot *slots = slots_of(c);
    for (int q = 0; q < c->n_ranks; q++)
        FSDP_TRY(fsdp_coll_args_check(c->global_rank, h->mr.n_coll, &slots[c->rank].args,
                                      fsdp_comm_group_rank(&c->group, q), &slots[q].args));
    return FSDP_STATUS_OK;
}

/* ---- vector kernels (block-sized, may alias elementwise) ---------------- */

typedef float host_v4f __attribute__((vector_size(16)));

/* p[0..8) as two vectors, and back; p need not be aligned. */
static inline void load8(host_v4f v[2], const float *p)
{
    memcpy(&v[0], p, 16);
    memcpy(&v[1], p + 4, 16);
}

static inline void store8(float *p, const host_v4f v[2])
{
    memcpy(p, &v[0], 16);
    memcpy(p + 4, &v[1], 16);
}

/* d[i] = a[i] + b[i]; d may equal a or b. */
static void add_f32(float *d, const float *a, const float *b, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        host_v4f x[2], y[2];
        load8(x, a + i);
        load8(y, b + i);
        x[0] += y[0];
        x[1] += y[1];
        store8(d + i, x);
    }
    for (; i < n; i++)
        d[i] = a[i] + b[i];
}

/* d[i] = (a[i] + b[i]) * s; d may equal a or b. */
static void add_scale_f32(float *d, const float *a, const float *b, float s, size_t n)
{
    host_v4f sv = {s, s, s, s};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        host_v4f x[2], y[2];
        load8(x, a + i);
        load8(y, b + i);
        x[0] = (x[0] + y[0]) * sv;
        x[1] = (x[1] + y[1]) * sv;
        store8(d + i, x);
    }
    for (; i < n; i++)
        d[i] = (a[i] + b[i]) * s;
}

/* d[i] = a[i] + b[i] (times s if scale) with non-temporal stores: for
 * outputs far larger than the caches, skipping the read-for-ownership of d
 * saves a quarter of the memory traffic of a 2-rank reduction. d may equal
 * a or b; the caller fences (host_stream_fence) before others read d. */
static void add_stream_f32(float *d, const float *a, const float *b, bool scale, float s,
                           size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    for (; i < n && ((uintptr_t)(d + i) & 15); i++)
        d[i] = scale ? (a[i] + b[i]) * s : a[i] + b[i];
    __m128 sv = _mm_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m128 x0 = _mm_add_ps(_mm_loadu_ps(a + i), _mm_loadu_ps(b + i));
        __m128 x1 = _mm_add_ps(_mm_loadu_ps(a + i + 4), _mm_loadu_ps(b + i + 4));
        if (scale) {
            x0 = _mm_mul_ps(x0, sv);
            x1 = _mm_mul_ps(x1, sv);
        }
        _mm_stream_ps(d + i, x0);
        _mm_stream_ps(d + i + 4, x1);
    }
#endif
    for (; i < n; i++)
        d[i] = scale ? (a[i] + b[i]) * s : a[i] + b[i];
}

static void host_stream_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

static void widen_bf16(float *d, const fsdp_bf16 *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = fsdp_bf16_to_f32(x[i]);
}

/* ---- the tree over ranks, one block at a time --------------------------- */

struct reduce_job {
    const void *const *src; /* (n_ranks,) sources, already offset to the range */
    fsdp_dtype dt;
    size_t off, n;          /* the current block within the range */
};

/* tree(lo, hi) of the current block: a source pointer (fp32 leaf) or dst.
 * Right subtrees go to tmp[0], deeper levels to tmp[1..]. */
static const float *tree_block(const struct reduce_job *j, int lo, int hi, float *dst,
                               float *const *tmp)
{
    if (hi - lo == 1) {
        if (j->dt == FSDP_DTYPE_F32)
            return (const float *)j->src[lo] + j->off;
        widen_bf16(dst, (const fsdp_bf16 *)j->src[lo] + j->off, j->n);
        return dst;
    }
    int mid = lo + (hi - lo) / 2;
    const float *a = tree_block(j, lo, mid, dst, tmp + 1);
    const float *b = tree_block(j, mid, hi, tmp[0], tmp + 1);
    add_f32(dst, a, b, j->n);
    return dst;
}

/* out[0..numel) = op over the n_ranks sources src[q][0..numel). out may
 * alias one source exactly (in place); only the last step of each block
 * writes out. stream: fp32 output written with non-temporal stores (then
 * fenced). */
static void reduce_range(struct host_ctx *h, int n_ranks, const void *const *src, void *out,
                         size_t numel, fsdp_dtype dt, fsdp_reduce_op op, bool stream)
{
    bool avg = op == FSDP_REDUCE_AVG;
    float scale = 1.0f / (float)n_ranks;
    float *const *t = h->tmp;
    stream = stream && dt == FSDP_DTYPE_F32 && n_ranks > 1;
    struct reduce_job j = {.src = src, .dt = dt};
    for (j.off = 0; j.off < numel; j.off += HOST_BLOCK) {
        j.n = numel - j.off < HOST_BLOCK ? numel - j.off : HOST_BLOCK;
        const float *sum;
        if (n_ranks == 1) {
            sum = tree_block(&j, 0, 1, t[0], t + 2);
            if (avg) {
                for (size_t i = 0; i < j.n; i++)
                    t[1][i] = sum[i] * scale;
                sum = t[1];
            }
        } else {
            int mid = n_ranks / 2;
            const float *a = tree_block(&j, 0, mid, t[0], t + 2);
            const float *b = tree_block(&j, mid, n_ranks, t[1], t + 2);
            float *d = dt == FSDP_DTYPE_F32 ? (float *)out + j.off : t[0];
            if (stream)
                add_stream_f32(d, a, b, avg, scale, j.n);
            else if (avg)
                add_scale_f32(d, a, b, scale, j.n);
            else
                add_f32(d, a, b, j.n);
            sum = d;
        }
        if (dt == FSDP_DTYPE_F32) {
            float *o = (float *)out + j.off;
            if (sum != o)
                memmove(o, sum, j.n * sizeof(float));
        } else {
            fsdp_bf16 *o = (fsdp_bf16 *)out + j.off;
            for (size_t i = 0; i < j.n; i++)
                o[i] = fsdp_f32_to_bf16(sum[i]);
        }
    }
    if (stream)
        host_stream_fence();
}

/* ---- shares of work --------------------------------------------------------- */

/* The work of a collective is cut into one share per rank (its own output),
 * and each share into pieces of HOST_PIECE elements. A rank claims the
 * pieces of its own share first, then those left in the others' shares, so
 * a rank that the OS does not run (other processes, more ranks than cores)
 * delays nobody: whoever runs does the work. Who computes a piece does not
 * change its value (the tree is per element). Pieces are claimed from the
 * owner's counter; the owner resets its counters before it arrives at the
 * first meeting (every rank has finished claiming in the previous
 * collective by then), and the last meeting makes every piece visible. */

typedef bool (*host_piece_fn)(fsdp_comm *c, int owner, size_t piece);

static size_t n_pieces(size_t numel) { return (numel + HOST_PIECE - 1) / HOST_PIECE; }

static void run_shares(fsdp_comm *c, int phase, host_piece_fn fn)
{
    struct host_shared *sh = ((struct host_ctx *)c->ctx)->sh;
    for (int i = 0; i < c->n_ranks; i++) {
        int q = (c->rank + i) % c->n_ranks;
        atomic_size_t *next = &sh->work[q].next[phase];
        while (fn(c, q, atomic_fetch_add_explicit(next, 1, memory_order_relaxed)))
            ;
    }
}

/* The slice of an all_reduce that rank r reduces: [lo, hi) elements, cut at
 * multiples of 64 bytes so ranks do not write the same cache lines. */
static size_t slice_len(size_t numel, int n_ranks, fsdp_dtype dt)
{
    size_t align = 64 / fsdp_dtype_size(dt);
    size_t per = (numel + (size_t)n_ranks - 1) / (size_t)n_ranks;
    return (per + align - 1) / align * align;
}

static void slice(size_t numel, int n_ranks, int r, fsdp_dtype dt, size_t *lo, size_t *hi)
{
    size_t per = slice_len(numel, n_ranks, dt);
    size_t a = per * (size_t)r, b = a + per;
    *lo = a < numel ? a : numel;
    *hi = b < numel ? b : numel;
}

/* all_gather: owner r's share fills its recv, chunk by chunk (starting
 * after r, so ranks read different sources at once). */
static bool piece_all_gather(fsdp_comm *c, int r, size_t p)
{
    const fsdp_meet_slot *slots = slots_of(c);
    size_t numel = slots[r].args.numel, es = fsdp_dtype_size(slots[r].args.dt);
    size_t per_src = n_pieces(numel);
    if (p >= per_src * (size_t)c->n_ranks)
        return false;
    int q = (int)((size_t)(r + 1) + p / per_src) % c->n_ranks;
    size_t lo = p % per_src * HOST_PIECE, n = numel - lo < HOST_PIECE ? numel - lo : HOST_PIECE;
    const char *from = (const char *)slots[q].send + lo * es;
    char *to = (char *)slots[r].recv + ((size_t)q * numel + lo) * es;
    if (from != to)
        memmove(to, from, n * es);
    return true;
}

/* reduce_scatter: owner r's share is its output, chunk r of the sum. */
static bool piece_reduce_scatter(fsdp_comm *c, int r, size_t p)
{
    struct host_ctx *h = c->ctx;
    const fsdp_meet_slot *slots = slots_of(c);
    size_t numel = slots[r].args.numel, es = fsdp_dtype_size(slots[r].args.dt);
    if (p >= n_pieces(numel))
        return false;
    size_t lo = p * HOST_PIECE, n = numel - lo < HOST_PIECE ? numel - lo : HOST_PIECE;
    for (int q = 0; q < c->n_ranks; q++)
        h->src[q] = (const char *)slots[q].send + ((size_t)r * numel + lo) * es;
    reduce_range(h, c->n_ranks, h->src, (char *)slots[r].recv + lo * es, n, slots[r].args.dt,
                 slots[r].args.op, numel * es >= HOST_STREAM_BYTES);
    return true;
}

/* all_reduce, first phase: owner r's share is slice r, reduced into its recv. */
static bool piece_all_reduce_sum(fsdp_comm *c, int r, size_t p)
{
    struct host_ctx *h = c->ctx;
    const fsdp_meet_slot *slots = slots_of(c);
    size_t numel = slots[r].args.numel, es = fsdp_dtype_size(slots[r].args.dt), lo, hi;
    slice(numel, c->n_ranks, r, slots[r].args.dt, &lo, &hi);
    if (p >= n_pieces(hi - lo))
        return false;
    size_t a = lo + p * HOST_PIECE, n = hi - a < HOST_PIECE ? hi - a : HOST_PIECE;
    for (int q = 0; q < c->n_ranks; q++)
        h->src[q] = (const char *)slots[q].send + a * es;
    reduce_range(h, c->n_ranks, h->src, (char *)slots[r].recv + a * es, n, slots[r].args.dt,
                 slots[r].args.op, (hi - lo) * es >= HOST_STREAM_BYTES);
    return true;
}

/* all_reduce, second phase: owner r's share copies every other slice from
 * the recv of the rank that reduced it into its own recv. */
static bool piece_all_reduce_copy(fsdp_comm *c, int r, size_t p)
{
    const fsdp_meet_slot *slots = slots_of(c);
    size_t numel = slots[r].args.numel, es = fsdp_dtype_size(slots[r].args.dt);
    if (p >= n_pieces(numel))
        return false;
    size_t a = p * HOST_PIECE, b = numel - a < HOST_PIECE ? numel : a + HOST_PIECE;
    size_t per = slice_len(numel, c->n_ranks, slots[r].args.dt);
    for (size_t q = a / per; q * per < b; q++) {
        size_t lo = q * per > a ? q * per : a, hi = (q + 1) * per < b ? (q + 1) * per : b;
        if ((int)q != r)
            memcpy((char *)slots[r].recv + lo * es, (const char *)slots[q].recv + lo * es,
                   (hi - lo) * es);
    }
    return true;
}

/* broadcast: owner r's share copies the root's buffer (the root's is empty). */
static bool piece_broadcast(fsdp_comm *c, int r, size_t p)
{
    const fsdp_meet_slot *slots = slots_of(c);
    int root = slots[r].args.root;
    size_t numel = slots[r].args.numel, es = fsdp_dtype_size(slots[r].args.dt);
    if (r == root || p >= n_pieces(numel))
        return false;
    size_t lo = p * HOST_PIECE, n = numel - lo < HOST_PIECE ? numel - lo : HOST_PIECE;
    const char *from = (const char *)slots[root].recv + lo * es;
    char *to = (char *)slots[r].recv + lo * es;
    if (from != to)
        memcpy(to, from, n * es);
    return true;
}

/* ---- the collectives ----------------------------------------------------- */

/* What a collective does once begun: phase 0's pieces, then phase 1's where
 * there is one, each followed by a meeting so that no rank's buffers are
 * reused before every rank is done with them (a lone rank meets nobody). */
static fsdp_status run_phases(fsdp_comm *c, host_piece_fn first, host_piece_fn second)
{
    fsdp_meet_rank *mr = &((struct host_ctx *)c->ctx)->mr;
    run_shares(c, 0, first);
    if (c->n_ranks == 1)
        return FSDP_STATUS_OK;
    fsdp_meet_arrive(mr, c);
    if (!second)
        return FSDP_STATUS_OK;
    run_shares(c, 1, second);
    fsdp_meet_arrive(mr, c);
    return FSDP_STATUS_OK;
}

static fsdp_status host_all_gather(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_stream_t s)
{
    (void)s;
    FSDP_TRY(begin(c, FSDP_COLL_ALL_GATHER, send, recv, numel, dt, FSDP_REDUCE_SUM, 0));
    return run_phases(c, piece_all_gather, NULL);
}

static fsdp_status host_reduce_scatter(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                       fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    (void)s;
    FSDP_TRY(begin(c, FSDP_COLL_REDUCE_SCATTER, send, recv, numel, dt, op, 0));
    return run_phases(c, piece_reduce_scatter, NULL);
}

static fsdp_status host_all_reduce(fsdp_comm *c, const void *send, void *recv, size_t numel,
                                   fsdp_dtype dt, fsdp_reduce_op op, fsdp_stream_t s)
{
    (void)s;
    FSDP_TRY(begin(c, FSDP_COLL_ALL_REDUCE, send, recv, numel, dt, op, 0));
    return run_phases(c, piece_all_reduce_sum, piece_all_reduce_copy);
}

/* A lone rank is its own root: piece_broadcast copies nothing. */
static fsdp_status host_broadcast(fsdp_comm *c, void *buf, size_t numel, fsdp_dtype dt, int root,
                                  fsdp_stream_t s)
{
    (void)s;
    FSDP_TRY(begin(c, FSDP_COLL_BROADCAST, NULL, buf, numel, dt, FSDP_REDUCE_SUM, root));
    return run_phases(c, piece_broadcast, NULL);
}

/* Two meetings, like the others: the second keeps every rank's slot stable
 * until all ranks have checked it against their own. */
static fsdp_status host_barrier(fsdp_comm *c)
{
    FSDP_TRY(begin(c, FSDP_COLL_BARRIER, NULL, NULL, 0, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, 0));
    if (c->n_ranks > 1)
        fsdp_meet_arrive(&((struct host_ctx *)c->ctx)->mr, c);
    return FSDP_STATUS_OK;
}

/* ---- lifetime ------------------------------------------------------------ */

/* This transport's tables of members, in the world's registry (comm.h). */
static const fsdp_meet_kind host_meet_kind;

static void host_ctx_free(struct host_ctx *h)
{
    free(h->src);
    free(h->tmp);
    free(h->tmp_mem);
    free(h);
}

static void host_fini(fsdp_comm *c)
{
    struct host_ctx *h = c->ctx;
    if (!h)
        return;
    fsdp_meet_detach(&h->mr, c->world, &host_meet_kind, &c->group);
    host_ctx_free(h);
    c->ctx = NULL;
}

static const struct fsdp_comm_i host_comm_i = {
    /* .name           = */ "host",
    /* .all_gather     = */ host_all_gather,
    /* .reduce_scatter = */ host_reduce_scatter,
    /* .all_reduce     = */ host_all_reduce,
    /* .broadcast      = */ host_broadcast,
    /* .barrier        = */ host_barrier,
    /* .fini           = */ host_fini,
    /* .host_code      = */ true, /* collectives on the host: in stream order */
    /* .inert          = */ false,
};

static fsdp_status host_shared_create(fsdp_world *w, const fsdp_comm_group *g, void *arg,
                                      fsdp_meet **out)
{
    (void)w;
    (void)arg;
    struct host_shared *sh = calloc(1, sizeof *sh);
    void *work = NULL;
    size_t n = (size_t)g->count;
    if (!sh || !fsdp_meet_init(&sh->meet, g->count) ||
        posix_memalign(&work, 64, n * sizeof(struct host_work))) {
        if (sh)
            fsdp_meet_fini(&sh->meet);
        free(sh);
        return fsdp_error_set(FSDP_STATUS_OOM,
                              "out of host memory for the host collectives of %d ranks",
                              g->count);
    }
    memset(work, 0, n * sizeof(struct host_work));
    sh->work = work;
    for (int q = 0; q < g->count; q++) {
        atomic_init(&sh->work[q].next[0], 0);
        atomic_init(&sh->work[q].next[1], 0);
    }
    *out = &sh->meet;
    return FSDP_STATUS_OK;
}

static void host_shared_destroy(fsdp_meet *m)
{
    struct host_shared *sh = (struct host_shared *)m;
    fsdp_meet_fini(&sh->meet);
    free(sh->work);
    free(sh);
}

static const fsdp_meet_kind host_meet_kind = {
    /* .name    = */ "host",
    /* .what    = */ "the host collectives",
    /* .create  = */ host_shared_create,
    /* .destroy = */ host_shared_destroy,
};

fsdp_status fsdp_comm_host_init_group(fsdp_comm *c, fsdp_world *w, fsdp_device *dev,
                                      const fsdp_comm_group *g, int rank)
{
    memset(c, 0, sizeof *c);
    FSDP_TRY(fsdp_comm_group_check(g, w, rank, "host collectives"));
    for (int i = 0; i < g->count; i++)
        if (!fsdp_world_is_local(w, fsdp_comm_group_rank(g, i)))
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "host collectives: rank %d of the group runs in another "
                                  "process; the host transport connects the rank threads of one "
                                  "process (use the mpi transport across processes)",
                                  fsdp_comm_group_rank(g, i));
    int index = fsdp_comm_group_index(g, rank);
    int n_tmp = 2;
    for (int span = 1; span < g->count; span *= 2)
        n_tmp++;
    struct host_ctx *h = calloc(1, sizeof *h);
    if (h) {
        h->n_tmp = n_tmp;
        h->src = calloc((size_t)g->count, sizeof *h->src);
        h->tmp = calloc((size_t)n_tmp, sizeof *h->tmp);
        h->tmp_mem = aligned_alloc(64, (size_t)n_tmp * HOST_BLOCK * sizeof(float));
    }
    if (!h || !h->src || !h->tmp || !h->tmp_mem) {
        if (h)
            host_ctx_free(h);
        return fsdp_error_set(FSDP_STATUS_OOM,
                              "rank %d: out of host memory for host collective scratch", rank);
    }
    for (int i = 0; i < n_tmp; i++)
        h->tmp[i] = h->tmp_mem + (size_t)i * HOST_BLOCK;
    fsdp_status st = fsdp_meet_attach(&h->mr, w, &host_meet_kind, g, rank, index, NULL);
    if (st != FSDP_STATUS_OK) {
        host_ctx_free(h);
        return st;
    }
    h->sh = (struct host_shared *)h->mr.m;
    fsdp_comm_bind(c, &host_comm_i, w, dev, g, rank, h);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_comm_host_init(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, int rank)
{
    fsdp_comm_group g = fsdp_comm_group_all(w ? w->n_ranks : 0);
    return fsdp_comm_host_init_group(c, w, dev, &g, rank);
}
