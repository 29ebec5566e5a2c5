/*
 * test_cuda_comm.c - the CUDA collectives: the host rendezvous they share
 * (runs everywhere), an NCCL smoke test on its own (one all_reduce per
 * rank, before any op comparison can confuse the picture), the nccl and
 * peer collectives against a host reference (peer: exactly, in comm.h's
 * tree order) for 1 and 4 virtual ranks and for the GPUs present, and the
 * abort paths: a fault on one rank makes the others return ABORTED, no
 * hang; NCCL's communicator is aborted before any device memory is freed;
 * and hybrid sharding's communicators over groups (a node, a local index).
 * Without a GPU the GPU tests print a SKIP line and pass (cuda_test.h).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/cuda_comm.h"
#include "core/bf16.h"
#include "core/flight.h"
#include "core/rng.h"
#include "core/world.h"
#include "cuda_test.h"
#include "device/device.h"
#include "testutil.h"

/* The rendezvous: 4 rank threads, many exchanges, every record seen by
 * every rank in rank order; then an abort while ranks wait. */
struct rdv_arg {
    int rounds;
    int fail_rank, fail_round; /* -1: none */
    bool stall;                /* the failing rank does not come (until the world stops) */
    int bad[8];
    fsdp_status st[8];
};

static fsdp_status rdv_rank(fsdp_world *w, int rank, void *arg)
{
    struct rdv_arg *a = arg;
    fsdp_comm_rdv *r;
    FSDP_TRY(fsdp_comm_rdv_attach(w, &r));
    fsdp_status st = FSDP_STATUS_OK;
    for (int k = 0; k < a->rounds && st == FSDP_STATUS_OK; k++) {
        if (rank == a->fail_rank && k == a->fail_round) {
            if (a->stall)
                fsdp_world_wait_aborted(w);
            st = fsdp_error_set(a->stall ? FSDP_STATUS_ABORTED : FSDP_STATUS_INTERNAL,
                                "rank %d fails on purpose", rank);
            break;
        }
        long mine[3] = {rank, k, rank * 1000 + k}, all[8][3];
        st = fsdp_comm_rdv_exchange(r, w, rank, mine, sizeof mine, all, true);
        if (st != FSDP_STATUS_OK)
            break;
        for (int q = 0; q < w->n_ranks; q++)
            if (all[q][0] != q || all[q][1] != k || all[q][2] != q * 1000 + k)
                a->bad[rank]++;
    }
    fsdp_comm_rdv_detach(w, r);
    a->st[rank] = st;
    return st;
}

START_TEST(test_rdv_exchange_and_abort)
{
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    struct rdv_arg a = {.rounds = 300, .fail_rank = -1, .fail_round = -1};
    ck_assert_msg(fsdp_world_launch(w, rdv_rank, &a) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    for (int r = 0; r < 4; r++)
        ck_assert_int_eq(a.bad[r], 0);
    ck_assert_ptr_null(w->rdv_shared); /* the last rank to leave freed it */

    struct rdv_arg b = {.rounds = 300, .fail_rank = 2, .fail_round = 57};
    double t0 = now_s();
    fsdp_status st = fsdp_world_launch(w, rdv_rank, &b);
    ck_assert_int_eq(st, FSDP_STATUS_INTERNAL);
    ck_assert(strstr(fsdp_error_msg(), "on purpose") != NULL);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(b.bad[r], 0);
        if (r != 2)
            ck_assert_int_eq(b.st[r], FSDP_STATUS_ABORTED);
    }
    ck_assert(now_s() - t0 < 5.0);
    ck_assert_ptr_null(w->rdv_shared);

    /* the world is usable again after the abort */
    struct rdv_arg c = {.rounds = 20, .fail_rank = -1, .fail_round = -1};
    ck_assert_int_eq(fsdp_world_launch(w, rdv_rank, &c), FSDP_STATUS_OK);
    fsdp_world_free(w);
}
END_TEST

/* The stall watchdog (core/flight.h) on the rendezvous, the wait of the
 * peer and nccl collectives on the host: rank 1 does not come to exchange
 * 41; one report names the handshake and who has not arrived, within the
 * deadline; the world is usable again. */
START_TEST(test_rdv_stall_is_reported)
{
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_set_watchdog(w, 0.3, NULL), FSDP_STATUS_OK);
    struct rdv_arg b = {.rounds = 100, .fail_rank = 1, .fail_round = 40, .stall = true};
    double t0 = now_s();
    fsdp_status st = fsdp_world_launch(w, rdv_rank, &b);
    double dt = now_s() - t0;
    const char *msg = fsdp_error_msg();
    ck_assert_msg(st == FSDP_STATUS_STALLED, "%s: %s", fsdp_status_name(st), msg);
    ck_assert_msg(strstr(msg, "the collective handshake 41 of the job's ranks") &&
                      strstr(msg, "arrived: ranks 0, 2-3; not arrived: rank 1"), "%s", msg);
    ck_assert_msg(dt >= 0.3 && dt < 2.0, "ended after %.2f s", dt);
    int n_stalled = 0;
    for (int r = 0; r < 4; r++)
        n_stalled += b.st[r] == FSDP_STATUS_STALLED;
    ck_assert_int_eq(n_stalled, 1);
    ck_assert_ptr_null(w->rdv_shared);
    struct rdv_arg c = {.rounds = 20, .fail_rank = -1, .fail_round = -1};
    ck_assert_int_eq(fsdp_world_launch(w, rdv_rank, &c), FSDP_STATUS_OK);
    fsdp_world_free(w);
}
END_TEST

/* ---- collectives ---------------------------------------------------------- */

enum { COMM_PEER = 0, COMM_NCCL = 1 };

struct coll_arg {
    int comm;                 /* COMM_PEER / COMM_NCCL */
    int spread;               /* rank r on GPU r % n_gpus (else all on GPU 0) */
    int n_gpus;
    fsdp_dtype dt;
    size_t numel;             /* per-rank chunk */
    int fault_rank;           /* -1: none */
    long fault_k;
    int big;                  /* one large all_reduce/reduce_scatter (chunked staging) */
    int issue_then_wait;      /* abort test: issue an all_reduce, then sync the stream */
    int smoke;                /* one all_reduce and a barrier, nothing else */
    long mismatches[8];
    fsdp_status st[8];
    int hooked[8];            /* a stop hook was registered by the communicator */
    int stopped[8];           /* teardown's fsdp_world_rank_stop ran it (or found it run) */
};

/* The value rank r holds at element i. */
static float coll_val(fsdp_dtype dt, int r, size_t i)
{
    float v = fsdp_rng_normal(SEED, 100 + (uint64_t)r, i);
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
}

static float coll_round(fsdp_dtype dt, float v)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(v)) : v;
}

/* Reference: the tree sum over ranks of element i (AVG: times 1/N). */
static float coll_ref(fsdp_dtype dt, int n, size_t i, int avg)
{
    float v[8];
    for (int r = 0; r < n; r++)
        v[r] = coll_val(dt, r, i);
    float s = fsdp_tree_sum(v, n);
    if (avg)
        s = s * (1.0f / (float)n);
    return coll_round(dt, s);
}

static void host_to_dt(void *dst, fsdp_dtype dt, size_t i, float v)
{
    if (dt == FSDP_DTYPE_BF16)
        ((fsdp_bf16 *)dst)[i] = fsdp_f32_to_bf16(v);
    else
        ((float *)dst)[i] = v;
}

static float host_from_dt(const void *src, fsdp_dtype dt, size_t i)
{
    return dt == FSDP_DTYPE_BF16 ? fsdp_bf16_to_f32(((const fsdp_bf16 *)src)[i])
                                 : ((const float *)src)[i];
}

/* Upload host values f(i) for i < n into device buffer d. */
static fsdp_status upload(fsdp_device *dev, void *d, fsdp_dtype dt, size_t n, int rank,
                          size_t base)
{
    size_t es = fsdp_dtype_size(dt);
    void *h = malloc(n * es + 1);
    if (!h)
        return fsdp_error_set(FSDP_STATUS_OOM, "test host buffer");
    for (size_t i = 0; i < n; i++)
        host_to_dt(h, dt, i, coll_val(dt, rank, base + i));
    fsdp_status st = fsdp_device_memcpy(dev, d, h, n * es, dev->comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_stream_sync(dev, dev->comm);
    free(h);
    return st;
}

static fsdp_status download(fsdp_device *dev, void *h, const void *d, size_t bytes)
{
    FSDP_TRY(fsdp_device_memcpy(dev, h, d, bytes, dev->comm));
    return fsdp_device_stream_sync(dev, dev->comm);
}

/* The checks one rank runs on buffers send and recv of numel * N elements
 * (owned by the caller, freed after the communicator is stopped). */
static fsdp_status coll_checks(struct coll_arg *a, fsdp_comm *c, fsdp_device *dev, int rank,
                               void *send, void *recv)
{
    const int N = c->n_ranks;
    const fsdp_dtype dt = a->dt;
    const size_t es = fsdp_dtype_size(dt), n = a->numel, full = n * (size_t)N;
    fsdp_status st = FSDP_STATUS_OK;
    void *h = malloc(full * es + 1);
    long *bad = &a->mismatches[rank];
    const int exact = a->comm == COMM_PEER || N == 1;
    const float tol = dt == FSDP_DTYPE_BF16 ? 1e-2f : 1e-5f;
#define EXPECT(got, want)                                                                     \
    do {                                                                                      \
        float g_ = (got), w_ = (want);                                                        \
        if (exact ? memcmp(&g_, &w_, 4) != 0 : !(fabsf(g_ - w_) <= tol * (1.0f + fabsf(w_)))) \
            (*bad)++;                                                                         \
    } while (0)
    if (!h)
        return fsdp_error_set(FSDP_STATUS_OOM, "test host buffer");
    if (a->smoke) {
        /* every rank holds r + 1: the sum is N (N + 1) / 2, exactly */
        for (size_t i = 0; i < full; i++)
            host_to_dt(h, dt, i, (float)(rank + 1));
        FSDP_CHECK(fsdp_device_memcpy(dev, send, h, full * es, dev->comm));
        FSDP_CHECK(fsdp_comm_all_reduce(c, send, recv, full, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(download(dev, h, recv, full * es));
        for (size_t i = 0; i < full; i++)
            EXPECT(host_from_dt(h, dt, i), (float)(N * (N + 1) / 2));
        FSDP_CHECK(fsdp_comm_barrier(c));
        goto done;
    }

    if (a->issue_then_wait) {
        /* abort test: queue a collective, then wait for it */
        FSDP_CHECK(upload(dev, send, dt, full, rank, 0));
        FSDP_CHECK(fsdp_comm_all_reduce(c, send, recv, full, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(fsdp_device_stream_sync(dev, dev->comm));
        FSDP_CHECK(fsdp_comm_all_reduce(c, send, recv, full, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(fsdp_device_stream_sync(dev, dev->comm));
        goto done;
    }
    if (a->big) {
        FSDP_CHECK(upload(dev, send, dt, full, rank, 0));
        FSDP_CHECK(fsdp_comm_reduce_scatter(c, send, recv, n, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(download(dev, h, recv, n * es));
        for (size_t i = 0; i < n; i += 997)
            EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, (size_t)rank * n + i, 0));
        FSDP_CHECK(fsdp_comm_all_reduce(c, send, send, full, dt, FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(download(dev, h, send, full * es));
        for (size_t i = 0; i < full; i += 997)
            EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, i, 0));
        goto done;
    }
    /* all_gather: out of place, then in place */
    FSDP_CHECK(upload(dev, send, dt, n, rank, 0));
    FSDP_CHECK(fsdp_comm_all_gather(c, send, recv, n, dt, NULL));
    FSDP_CHECK(download(dev, h, recv, full * es));
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++)
            EXPECT(host_from_dt(h, dt, (size_t)r * n + i), coll_val(dt, r, i));
    FSDP_CHECK(fsdp_device_memset(dev, recv, 0, full * es, dev->comm));
    FSDP_CHECK(upload(dev, (char *)recv + (size_t)rank * n * es, dt, n, rank, 0));
    FSDP_CHECK(fsdp_comm_all_gather(c, (char *)recv + (size_t)rank * n * es, recv, n, dt, NULL));
    FSDP_CHECK(download(dev, h, recv, full * es));
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < n; i++)
            EXPECT(host_from_dt(h, dt, (size_t)r * n + i), coll_val(dt, r, i));
    /* reduce_scatter, sum and avg */
    for (int avg = 0; avg < 2; avg++) {
        FSDP_CHECK(upload(dev, send, dt, full, rank, 0));
        FSDP_CHECK(fsdp_comm_reduce_scatter(c, send, recv, n, dt,
                                            avg ? FSDP_REDUCE_AVG : FSDP_REDUCE_SUM, NULL));
        FSDP_CHECK(download(dev, h, recv, n * es));
        for (size_t i = 0; i < n; i++)
            EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, (size_t)rank * n + i, avg));
    }
    /* all_reduce: out of place (sum), in place (avg); an odd size */
    size_t odd = full - 1 > 0 ? full - 1 : 1;
    FSDP_CHECK(upload(dev, send, dt, odd, rank, 0));
    FSDP_CHECK(fsdp_comm_all_reduce(c, send, recv, odd, dt, FSDP_REDUCE_SUM, NULL));
    FSDP_CHECK(download(dev, h, recv, odd * es));
    for (size_t i = 0; i < odd; i++)
        EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, i, 0));
    FSDP_CHECK(fsdp_comm_all_reduce(c, send, send, odd, dt, FSDP_REDUCE_AVG, NULL));
    FSDP_CHECK(download(dev, h, send, odd * es));
    for (size_t i = 0; i < odd; i++)
        EXPECT(host_from_dt(h, dt, i), coll_ref(dt, N, i, 1));
    /* broadcast from the last rank */
    FSDP_CHECK(upload(dev, send, dt, n, rank, 0));
    FSDP_CHECK(fsdp_comm_broadcast(c, send, n, dt, N - 1, NULL));
    FSDP_CHECK(download(dev, h, send, n * es));
    for (size_t i = 0; i < n; i++)
        EXPECT(host_from_dt(h, dt, i), coll_val(dt, N - 1, i));
    FSDP_CHECK(fsdp_comm_barrier(c));
#undef EXPECT
done:
fail:
    free(h);
    return st;
}

/* One rank: device, communicator, buffers, checks; then the teardown the
 * engine must do too: after a failure or an abort, stop this rank's
 * collectives (nccl: ncclCommAbort through the stop hook) before any
 * device memory is freed, since cudaFree waits for the whole device and a
 * collective kernel waiting for a failed rank never ends; then the
 * communicator, then the buffers and the device. */
static fsdp_status coll_rank(fsdp_world *w, int rank, void *arg)
{
    struct coll_arg *a = arg;
    fsdp_device dev;
    fsdp_comm c = {0};
    int have_comm = 0;
    void *send = NULL, *recv = NULL;
    const size_t bytes = a->numel * (size_t)w->n_ranks * fsdp_dtype_size(a->dt);
    int ordinal = a->spread ? rank % a->n_gpus : 0;
    fsdp_status st = fsdp_device_init(&dev, FSDP_BACKEND_CUDA, w, rank, ordinal, 0);
    if (st != FSDP_STATUS_OK) {
        a->st[rank] = st;
        return st;
    }
    st = a->comm == COMM_NCCL ? fsdp_comm_nccl_init(&c, w, &dev, rank)
                              : fsdp_comm_peer_init(&c, w, &dev, rank);
    if (st == FSDP_STATUS_OK) {
        have_comm = 1;
        a->hooked[rank] = w->stop[rank].n > 0;
        st = fsdp_device_alloc(&dev, bytes, FSDP_MEM_COMM, "test send", &send);
    }
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_alloc(&dev, bytes, FSDP_MEM_COMM, "test recv", &recv);
    if (st == FSDP_STATUS_OK)
        st = coll_checks(a, &c, &dev, rank, send, recv);
    a->stopped[rank] = fsdp_world_rank_stop(w, rank, st);
    if (have_comm)
        fsdp_comm_fini(&c);
    fsdp_device_free(&dev, send);
    fsdp_device_free(&dev, recv);
    fsdp_device_fini(&dev);
    a->st[rank] = st;
    return st;
}

static void run_coll(struct coll_arg *a, int n_ranks, fsdp_status want)
{
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init(&w, n_ranks), FSDP_STATUS_OK);
    a->n_gpus = fsdp_cuda_device_count();
    if (a->fault_rank >= 0)
        fsdp_world_set_fault(w, FSDP_FAULT_COLLECTIVE, a->fault_rank, a->fault_k);
    double t0 = now_s();
    fsdp_status st = fsdp_world_launch(w, coll_rank, a);
    ck_assert_msg(st == want, "collectives over %d ranks: got %s, want %s: %s", n_ranks,
                  fsdp_status_name(st), fsdp_status_name(want), fsdp_error_msg());
    ck_assert_msg(now_s() - t0 < 60.0, "collectives took %.1f s", now_s() - t0);
    if (want == FSDP_STATUS_OK)
        for (int r = 0; r < n_ranks; r++)
            ck_assert_msg(a->mismatches[r] == 0, "rank %d: %ld values differ from the reference",
                          r, a->mismatches[r]);
    ck_assert_ptr_null(w->rdv_shared);
    fsdp_world_free(w);
}

/* NCCL on its own: one all_reduce over every GPU (or the one GPU) and a
 * barrier, before the full comparison below can confuse the picture. */
START_TEST(test_nccl_smoke)
{
    NEED_GPU("test_nccl_smoke");
    NEED_NCCL("test_nccl_smoke");
    int n = fsdp_cuda_device_count();
    if (n > 8)
        n = 8;
    struct coll_arg a = {.comm = COMM_NCCL, .spread = 1, .dt = FSDP_DTYPE_F32, .numel = 1024,
                         .fault_rank = -1, .smoke = 1};
    run_coll(&a, n, FSDP_STATUS_OK);
    for (int r = 0; r < n; r++) {
        ck_assert_msg(a.hooked[r], "rank %d: NCCL registered no stop hook", r);
        ck_assert_int_eq(a.stopped[r], 0); /* a clean run stops nothing */
    }
}
END_TEST

/* _i: bit 0 = dtype, bit 1 = 4 ranks (else 1). */
START_TEST(test_peer_collectives)
{
    char name[64];
    snprintf(name, sizeof name, "test_peer_collectives(%d ranks, %s)", _i & 2 ? 4 : 1,
             _i & 1 ? "bf16" : "f32");
    NEED_GPU(name);
    struct coll_arg a = {.comm = COMM_PEER, .dt = (fsdp_dtype)(_i & 1), .numel = 1001,
                         .fault_rank = -1};
    run_coll(&a, _i & 2 ? 4 : 1, FSDP_STATUS_OK);
    if (fsdp_cuda_device_count() > 1) { /* the same across GPUs */
        struct coll_arg b = {.comm = COMM_PEER, .spread = 1, .dt = (fsdp_dtype)(_i & 1),
                             .numel = 1001, .fault_rank = -1};
        run_coll(&b, _i & 2 ? 4 : 1, FSDP_STATUS_OK);
    }
}
END_TEST

/* Larger than the staging buffer: the reduction goes in chunks. */
START_TEST(test_peer_collectives_chunked)
{
    NEED_GPU("test_peer_collectives_chunked");
    struct coll_arg a = {.comm = COMM_PEER, .dt = FSDP_DTYPE_F32, .numel = (size_t)9 << 20 >> 1,
                         .fault_rank = -1, .big = 1};
    run_coll(&a, 4, FSDP_STATUS_OK);
}
END_TEST

START_TEST(test_nccl_collectives)
{
    NEED_GPU(_i ? "test_nccl_collectives(bf16)" : "test_nccl_collectives(f32)");
    NEED_NCCL("test_nccl_collectives");
    int n = fsdp_cuda_device_count();
    if (n > 4)
        n = 4;
    struct coll_arg a = {.comm = COMM_NCCL, .spread = 1, .dt = (fsdp_dtype)_i, .numel = 1001,
                         .fault_rank = -1};
    run_coll(&a, n, FSDP_STATUS_OK);
}
END_TEST

/* NCCL refuses two ranks on one GPU on every rank alike, without hanging. */
START_TEST(test_nccl_two_ranks_one_gpu_refused)
{
    NEED_GPU("test_nccl_two_ranks_one_gpu_refused");
    NEED_NCCL("test_nccl_two_ranks_one_gpu_refused");
    struct coll_arg a = {.comm = COMM_NCCL, .spread = 0, .dt = FSDP_DTYPE_F32, .numel = 16,
                         .fault_rank = -1};
    run_coll(&a, 2, FSDP_STATUS_UNSUPPORTED);
    ck_assert(strstr(fsdp_error_msg(), "--comm peer") != NULL);
    ck_assert_int_eq(a.st[0], FSDP_STATUS_UNSUPPORTED);
    ck_assert_int_eq(a.st[1], FSDP_STATUS_UNSUPPORTED);
}
END_TEST

START_TEST(test_peer_abort)
{
    NEED_GPU("test_peer_abort");
    struct coll_arg a = {.comm = COMM_PEER, .dt = FSDP_DTYPE_F32, .numel = 1001,
                         .fault_rank = 2, .fault_k = 3};
    run_coll(&a, 4, FSDP_STATUS_INTERNAL);
    ck_assert(strstr(fsdp_error_msg(), "injected") != NULL);
    for (int r = 0; r < 4; r++)
        if (r != 2)
            ck_assert_msg(a.st[r] == FSDP_STATUS_ABORTED, "rank %d: %s", r,
                          fsdp_status_name(a.st[r]));
}
END_TEST

/* NCCL abort: a rank fails while the others have queued their half of a
 * collective and wait for it on the GPU. Needs two GPUs. */
START_TEST(test_nccl_abort)
{
    NEED_GPU("test_nccl_abort");
    NEED_NCCL("test_nccl_abort");
    int n = fsdp_cuda_device_count();
    if (n < 2) {
        printf("SKIP: test_nccl_abort: needs 2 GPUs\n");
        fflush(stdout);
        return;
    }
    if (n > 4)
        n = 4;
    struct coll_arg a = {.comm = COMM_NCCL, .spread = 1, .dt = FSDP_DTYPE_F32, .numel = 4096,
                         .fault_rank = 1, .fault_k = 2, .issue_then_wait = 1};
    run_coll(&a, n, FSDP_STATUS_INTERNAL);
    for (int r = 0; r < n; r++) {
        if (r != 1)
            ck_assert_msg(a.st[r] == FSDP_STATUS_ABORTED, "rank %d: %s", r,
                          fsdp_status_name(a.st[r]));
        ck_assert_int_eq(a.hooked[r], 1);
        ck_assert_int_eq(a.stopped[r], 1);
    }
}
END_TEST

/* ---- groups (hybrid sharding) ---------------------------------------------- */

/* Hybrid sharding's communicators on 2 nodes x 2 ranks: the ranks of a
 * node (group {2q, 1, 2}) and the ranks with one local index j on every
 * node ({j, 2, 2}). A node's reduce-scatter then an all-reduce across
 * nodes adds each element in the two-level tree (exactly, on peer); the
 * node's all_gather and the cross group's broadcast move the right
 * values. peer: four virtual ranks on GPU 0; nccl: rank 2q + j on GPU
 * (q + j) % 2, so no group holds two ranks of one GPU (needs 2 GPUs). */
enum { G_NODES = 2, G_LOCAL = 2, G_RANKS = G_NODES * G_LOCAL };

struct group_arg {
    int comm;                 /* COMM_PEER / COMM_NCCL */
    int stray;                /* rank 3 all-gathers where the others all-reduce */
    long mismatches[G_RANKS];
    fsdp_status st[G_RANKS];
};

/* The two-level tree of element i: each node's ranks, then the nodes. */
static float group_ref(size_t i)
{
    float nodes[G_NODES], mine[G_LOCAL];
    for (int n = 0; n < G_NODES; n++) {
        for (int k = 0; k < G_LOCAL; k++)
            mine[k] = coll_val(FSDP_DTYPE_F32, n * G_LOCAL + k, i);
        nodes[n] = fsdp_tree_sum(mine, G_LOCAL);
    }
    return fsdp_tree_sum(nodes, G_NODES);
}

/* Download n floats of d and count those that differ from want(k) (exactly
 * on peer, within 1e-5 relative on nccl, whose order is its own). */
static fsdp_status group_compare(struct group_arg *a, fsdp_device *dev, int rank, const void *d,
                                 float *h, size_t n, float (*want)(int, size_t), bool sum)
{
    FSDP_TRY(download(dev, h, d, n * sizeof(float)));
    for (size_t k = 0; k < n; k++) {
        float v = want(rank, k);
        bool ok = a->comm == COMM_PEER || !sum ? memcmp(&h[k], &v, sizeof v) == 0
                                               : fabsf(h[k] - v) <= 1e-5f * (1.0f + fabsf(v));
        a->mismatches[rank] += !ok;
    }
    return FSDP_STATUS_OK;
}

static float want_sum(int rank, size_t e) { return group_ref((size_t)(rank % G_LOCAL) * 1001 + e); }
static float label(int rank, size_t e) { return (float)(rank * 100000 + (int)e); }
static float want_gather(int rank, size_t i)
{
    return label(rank / G_LOCAL * G_LOCAL + (int)(i / 1001), i % 1001);
}
static float want_bcast(int rank, size_t e)
{
    return label((G_NODES - 1) * G_LOCAL + rank % G_LOCAL, e);
}

static fsdp_status group_rank(fsdp_world *w, int rank, void *arg)
{
    struct group_arg *a = arg;
    const int q = rank / G_LOCAL, j = rank % G_LOCAL;
    const size_t shard = 1001, S = G_LOCAL * shard;
    fsdp_device dev;
    fsdp_comm node, cross;
    bool have_node = false, have_cross = false;
    void *in = NULL, *sh = NULL, *out = NULL;
    float *h = malloc(S * sizeof *h);
    int ordinal = a->comm == COMM_NCCL ? (q + j) % 2 : 0;
    fsdp_status st = h ? fsdp_device_init(&dev, FSDP_BACKEND_CUDA, w, rank, ordinal, 0)
                       : fsdp_error_set(FSDP_STATUS_OOM, "test host buffer");
    if (st != FSDP_STATUS_OK) {
        free(h);
        a->st[rank] = st;
        return st;
    }
    fsdp_status (*init)(fsdp_comm *, fsdp_world *, fsdp_device *, const fsdp_comm_group *, int) =
        a->comm == COMM_NCCL ? fsdp_comm_nccl_init_group : fsdp_comm_peer_init_group;
    fsdp_comm_group gn = {q * G_LOCAL, 1, G_LOCAL, G_LOCAL}, gc = {j, G_LOCAL, G_NODES, G_LOCAL};
    st = init(&node, w, &dev, &gn, rank);
    have_node = st == FSDP_STATUS_OK;
    if (st == FSDP_STATUS_OK)
        st = init(&cross, w, &dev, &gc, rank);
    have_cross = st == FSDP_STATUS_OK;
    if (st == FSDP_STATUS_OK && (node.rank != j || node.n_ranks != G_LOCAL || cross.rank != q ||
                                 cross.n_ranks != G_NODES || cross.global_rank != rank))
        st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: group ranks %d/%d and %d/%d", rank,
                            node.rank, node.n_ranks, cross.rank, cross.n_ranks);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_alloc(&dev, S * sizeof(float), FSDP_MEM_COMM, "test in", &in);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_alloc(&dev, S * sizeof(float), FSDP_MEM_COMM, "test out", &out);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_alloc(&dev, shard * sizeof(float), FSDP_MEM_COMM, "test shard", &sh);
    if (st == FSDP_STATUS_OK)
        st = upload(&dev, in, FSDP_DTYPE_F32, S, rank, 0);
    if (st == FSDP_STATUS_OK)
        st = fsdp_comm_reduce_scatter(&node, in, sh, shard, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                      NULL);
    if (st == FSDP_STATUS_OK && a->stray && rank == G_RANKS - 1)
        st = fsdp_comm_all_gather(&cross, sh, out, shard, FSDP_DTYPE_F32, NULL);
    else if (st == FSDP_STATUS_OK)
        st = fsdp_comm_all_reduce(&cross, sh, sh, shard, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
    if (st == FSDP_STATUS_OK)
        st = group_compare(a, &dev, rank, sh, h, shard, want_sum, true);
    /* the node's all-gather of labelled shards, the cross group's broadcast */
    for (size_t e = 0; e < shard; e++)
        h[e] = label(rank, e);
    if (st == FSDP_STATUS_OK)
        st = fsdp_device_memcpy(&dev, sh, h, shard * sizeof(float), dev.comm);
    if (st == FSDP_STATUS_OK)
        st = fsdp_comm_all_gather(&node, sh, out, shard, FSDP_DTYPE_F32, NULL);
    if (st == FSDP_STATUS_OK)
        st = group_compare(a, &dev, rank, out, h, S, want_gather, false);
    if (st == FSDP_STATUS_OK)
        st = fsdp_comm_broadcast(&cross, sh, shard, FSDP_DTYPE_F32, G_NODES - 1, NULL);
    if (st == FSDP_STATUS_OK)
        st = group_compare(a, &dev, rank, sh, h, shard, want_bcast, false);
    fsdp_world_rank_stop(w, rank, st);
    if (have_cross)
        fsdp_comm_fini(&cross);
    if (have_node)
        fsdp_comm_fini(&node);
    fsdp_device_free(&dev, in);
    fsdp_device_free(&dev, out);
    fsdp_device_free(&dev, sh);
    fsdp_device_fini(&dev);
    free(h);
    a->st[rank] = st;
    return st;
}

static void run_groups(struct group_arg *a, fsdp_status want)
{
    fsdp_world *w;
    ck_assert_int_eq(fsdp_world_init(&w, G_RANKS), FSDP_STATUS_OK);
    double t0 = now_s();
    fsdp_status st = fsdp_world_launch(w, group_rank, a);
    ck_assert_msg(st == want, "groups on %s: got %s, want %s: %s",
                  a->comm == COMM_NCCL ? "nccl" : "peer", fsdp_status_name(st),
                  fsdp_status_name(want), fsdp_error_msg());
    ck_assert_msg(now_s() - t0 < 60.0, "groups took %.1f s", now_s() - t0);
    for (int r = 0; r < G_RANKS && want == FSDP_STATUS_OK; r++)
        ck_assert_msg(a->mismatches[r] == 0, "rank %d: %ld values differ from the reference", r,
                      a->mismatches[r]);
    ck_assert_ptr_null(w->rdv_shared);
    fsdp_world_free(w);
}

START_TEST(test_peer_groups)
{
    NEED_GPU("test_peer_groups");
    struct group_arg a = {.comm = COMM_PEER};
    run_groups(&a, FSDP_STATUS_OK);
    /* a rank of another group in a different collective: refused, no hang */
    struct group_arg b = {.comm = COMM_PEER, .stray = 1};
    run_groups(&b, FSDP_STATUS_INVALID_ARG);
    /* rank 3's group partner names the mismatch, the others the order */
    ck_assert_msg(strstr(fsdp_error_msg(), "all_gather") != NULL, "%s", fsdp_error_msg());
}
END_TEST

START_TEST(test_nccl_groups)
{
    NEED_GPU("test_nccl_groups");
    NEED_NCCL("test_nccl_groups");
    if (fsdp_cuda_device_count() < 2) {
        printf("SKIP: test_nccl_groups: needs 2 GPUs\n");
        fflush(stdout);
        return;
    }
    struct group_arg a = {.comm = COMM_NCCL};
    run_groups(&a, FSDP_STATUS_OK);
}
END_TEST

int main(void)
{
    /* Nothing CUDA here: Check forks each test, and CUDA must not be
     * initialised in the parent. */
    const fsdp_test_tcase tcases[] = {
        {"everywhere", 60, FSDP_TESTS(test_rdv_exchange_and_abort, test_rdv_stall_is_reported)},
        {"collectives", 120,
         FSDP_TESTS(test_nccl_smoke, FSDP_TEST_LOOP(test_peer_collectives, 4),
                    test_peer_collectives_chunked, FSDP_TEST_LOOP(test_nccl_collectives, 2),
                    test_nccl_two_ranks_one_gpu_refused, test_peer_abort, test_nccl_abort,
                    test_peer_groups, test_nccl_groups)},
    };
    return fsdp_test_main("cuda_comm", tcases, FSDP_TEST_LEN(tcases));
}
