/*
 * test_comm.c - the host collectives (comm/host.c), the meta communicator,
 * and the transport table that picks between them (comm/transport.c).
 *
 * Every collective runs on 1, 2, 3, 4 and 8 rank threads (8 oversubscribes a
 * 2-core machine, which exercises the sleeping path of the meetings), for
 * both dtypes and both reduce ops, and each rank compares its result with a
 * serial reference built from fsdp_tree_sum, bit for bit (memcmp). Inputs
 * have random mantissas and exponents spread over 2^-10..2^10, so adding in
 * any other order than the tree changes some sums (checked explicitly).
 *
 * Results and failures are read after the comm stream's sync (synced()),
 * so the suite also runs on async cpu streams (make test's second pass).
 *
 * Rank threads never call Check's assertions: a rank that sees a wrong
 * result returns INTERNAL with a message, and the main thread asserts on
 * the launcher's status and prints the message.
 */
#include <check.h>
#include <string.h>
#include <unistd.h>

#include "comm/transport.h"
#include "comm_util.h"
#include "core/bf16.h"
#include "core/clock.h"
#include "core/flight.h"
#include "core/rng.h"
#include "core/world.h"
#include "device/cpu.h"
#include "device/device.h"
#include "testutil.h"

#define SEED 0x5eedc0ffeeull

/* ThreadSanitizer makes every memory access ~10x dearer; it is after the
 * synchronisation, which the smaller buffers exercise just as well. */
#define TEST_TSAN FSDP_TEST_TSAN

/* ---- inputs and the reference ------------------------------------------- */

/* Element i of rank r's input: a float with a random sign and mantissa and
 * an exponent in [-10, 10], so rounding depends on the order of the sums. */
static float gen_f32(uint64_t tag, int r, size_t i)
{
    return ref_input_f32(SEED ^ (tag << 56) ^ ((uint64_t)r << 48) ^ i);
}

/* Write n elements of rank r's input starting at element `first` in dtype dt. */
static void fill(void *buf, fsdp_dtype dt, uint64_t tag, int r, size_t first, size_t n)
{
    ref_fill(buf, dt, gen_f32, tag, r, first, n);
}

/* Value of element i of rank r's input as the collective sees it (fp32). */
static float input_value(fsdp_dtype dt, uint64_t tag, int r, size_t i)
{
    float v = gen_f32(tag, r, i);
    return dt == FSDP_DTYPE_F32 ? v : fsdp_bf16_to_f32(fsdp_f32_to_bf16(v));
}

/* expected[0..n) = op over ranks of element (first + i) of every rank's
 * input: the tree sum, times 1.0f/N for AVG, rounded once for bf16. */
static void reference_reduce(void *expected, fsdp_dtype dt, fsdp_reduce_op op, uint64_t tag,
                             int n_ranks, size_t first, size_t n)
{
    float vals[64];
    for (size_t i = 0; i < n; i++) {
        for (int q = 0; q < n_ranks; q++)
            vals[q] = input_value(dt, tag, q, first + i);
        ref_reduce_store(expected, i, dt, op, vals, n_ranks);
    }
}

/* ---- a rank's harness ---------------------------------------------------- */

/* A device of backend `be` and the transport the table picks for it. */
static fsdp_status env_init(struct rank_env *e, fsdp_world *w, int rank, fsdp_backend be)
{
    memset(e, 0, sizeof *e);
    FSDP_TRY(fsdp_device_init(&e->dev, be, w, rank, rank, 0));
    e->have_dev = true;
    fsdp_transport_req req = {.backend = be, .kind = FSDP_COMM_AUTO};
    FSDP_TRY(fsdp_comm_init(&e->comm, &req, w, &e->dev, rank));
    if (strcmp(e->comm.iface->name, be == FSDP_BACKEND_META ? "meta" : "host"))
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: auto picked '%s' for --backend %s",
                              rank, e->comm.iface->name, fsdp_backend_name(be));
    e->have_comm = true;
    return FSDP_STATUS_OK;
}

/* Run fn on n rank threads; assert that every rank succeeded and that the
 * host collectives' shared state went away with the last fini. */
static void launch_ok(int n, fsdp_rank_fn fn, void *arg)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
    fsdp_status st = fsdp_world_launch(w, fn, arg);
    ck_assert_msg(st == FSDP_STATUS_OK, "%d ranks: %s: %s", n, fsdp_status_name(st),
                  fsdp_error_msg());
    ck_assert_ptr_null(w->comm_shared);
    fsdp_world_free(w);
}

/* Compare bytes; on a difference return INTERNAL naming the first element. */
static fsdp_status expect_same(int rank, const char *what, const void *got, const void *want,
                               size_t numel, fsdp_dtype dt)
{
    size_t es = fsdp_dtype_size(dt);
    if (!memcmp(got, want, numel * es))
        return FSDP_STATUS_OK;
    size_t i = 0;
    while (!memcmp((const char *)got + i * es, (const char *)want + i * es, es))
        i++;
    uint32_t g = 0, x = 0;
    memcpy(&g, (const char *)got + i * es, es);
    memcpy(&x, (const char *)want + i * es, es);
    return fsdp_error_set(FSDP_STATUS_INTERNAL,
                          "rank %d: %s (%zu x %s): element %zu is 0x%08x, expected 0x%08x", rank,
                          what, numel, fsdp_dtype_name(dt), i, g, x);
}

/* ---- every collective against the reference ----------------------------- */

/* The expected results are shared by the ranks and computed cooperatively
 * (each rank fills its slice, then a world barrier), so the serial
 * reference costs no more than the collectives it checks. */
struct sweep_arg {
    const size_t *sizes;
    int n_sizes;
    size_t max_full;      /* largest numel * n_ranks */
    void *want_gather;    /* (max_full,) concatenation of every rank's input */
    void *want_red[2];    /* (max_full,) SUM and AVG over ranks of full inputs */
};

/* Fill this rank's slice of the shared expected results for (numel, dt). */
static void sweep_reference(struct sweep_arg *a, int r, int n, size_t numel, fsdp_dtype dt,
                            uint64_t tag)
{
    size_t es = fsdp_dtype_size(dt), full = numel * (size_t)n;
    fill((char *)a->want_gather + (size_t)r * numel * es, dt, tag, r, 0, numel);
    size_t lo = full * (size_t)r / (size_t)n, hi = full * (size_t)(r + 1) / (size_t)n;
    for (int op = FSDP_REDUCE_SUM; op <= FSDP_REDUCE_AVG; op++)
        reference_reduce((char *)a->want_red[op] + lo * es, dt, (fsdp_reduce_op)op, tag + 1, n,
                         lo, hi - lo);
}

static fsdp_status sweep_one(fsdp_comm *c, fsdp_device *d, struct sweep_arg *a, size_t numel,
                             fsdp_dtype dt, uint64_t tag)
{
    fsdp_status st = FSDP_STATUS_OK;
    int r = c->rank, n = c->n_ranks;
    size_t es = fsdp_dtype_size(dt), full = numel * (size_t)n;
    void *send = NULL, *recv = NULL;
    char what[64];
    FSDP_CHECK(fsdp_device_alloc(d, full * es, FSDP_MEM_COMM, "test send", &send));
    /* one element more: out-of-place reductions write at recv + 1 element,
     * an output that is not 16-byte aligned */
    FSDP_CHECK(fsdp_device_alloc(d, (full + 1) * es, FSDP_MEM_COMM, "test recv", &recv));
    char *odd = (char *)recv + es;
    sweep_reference(a, r, n, numel, dt, tag);
    FSDP_CHECK(fsdp_world_barrier(c->world));

    /* all_gather, out of place then in place */
    fill(send, dt, tag, r, 0, numel);
    memset(recv, 0xa5, full * es);
    FSDP_CHECK(synced(c, fsdp_comm_all_gather(c, send, recv, numel, dt, NULL)));
    FSDP_CHECK(expect_same(r, "all_gather", recv, a->want_gather, full, dt));
    memset(recv, 0x5a, full * es);
    char *mine = (char *)recv + (size_t)r * numel * es;
    fill(mine, dt, tag, r, 0, numel);
    FSDP_CHECK(synced(c, fsdp_comm_all_gather(c, mine, recv, numel, dt, NULL)));
    FSDP_CHECK(expect_same(r, "all_gather in place", recv, a->want_gather, full, dt));

    for (int op = FSDP_REDUCE_SUM; op <= FSDP_REDUCE_AVG; op++) {
        const char *opn = op == FSDP_REDUCE_SUM ? "sum" : "avg";
        const char *want = a->want_red[op];
        fsdp_reduce_op o = (fsdp_reduce_op)op;
        /* reduce_scatter: this rank's output is chunk r of the full reduction */
        fill(send, dt, tag + 1, r, 0, full);
        memset(recv, 0xa5, numel * es);
        FSDP_CHECK(synced(c, fsdp_comm_reduce_scatter(c, send, recv, numel, dt, o, NULL)));
        snprintf(what, sizeof what, "reduce_scatter %s", opn);
        FSDP_CHECK(expect_same(r, what, recv, want + (size_t)r * numel * es, numel, dt));
        FSDP_CHECK(synced(c, fsdp_comm_reduce_scatter(c, send, odd, numel, dt, o, NULL)));
        snprintf(what, sizeof what, "reduce_scatter %s unaligned", opn);
        FSDP_CHECK(expect_same(r, what, odd, want + (size_t)r * numel * es, numel, dt));

        /* all_reduce over the full vector, out of place then in place */
        memset(recv, 0xa5, full * es);
        FSDP_CHECK(synced(c, fsdp_comm_all_reduce(c, send, odd, full, dt, o, NULL)));
        snprintf(what, sizeof what, "all_reduce %s unaligned", opn);
        FSDP_CHECK(expect_same(r, what, odd, want, full, dt));
        memset(recv, 0xa5, full * es);
        FSDP_CHECK(synced(c, fsdp_comm_all_reduce(c, send, recv, full, dt, o, NULL)));
        snprintf(what, sizeof what, "all_reduce %s", opn);
        FSDP_CHECK(expect_same(r, what, recv, want, full, dt));
        memcpy(recv, send, full * es);
        FSDP_CHECK(synced(c, fsdp_comm_all_reduce(c, recv, recv, full, dt, o, NULL)));
        snprintf(what, sizeof what, "all_reduce %s in place", opn);
        FSDP_CHECK(expect_same(r, what, recv, want, full, dt));
    }

    /* broadcast from every root in turn */
    for (int root = 0; root < n; root++) {
        fill(recv, dt, tag, r, 0, numel);
        FSDP_CHECK(synced(c, fsdp_comm_broadcast(c, recv, numel, dt, root, NULL)));
        snprintf(what, sizeof what, "broadcast from %d", root);
        FSDP_CHECK(expect_same(r, what, recv, (char *)a->want_gather + (size_t)root * numel * es,
                               numel, dt));
    }
    /* nobody may refill the shared references while another rank compares */
    FSDP_CHECK(fsdp_comm_barrier(c));
fail:
    fsdp_device_free(d, send);
    fsdp_device_free(d, recv);
    return st;
}

static fsdp_status sweep_rank(fsdp_world *w, int rank, void *p)
{
    struct sweep_arg *a = p;
    struct rank_env e;
    fsdp_status st;
    FSDP_CHECK(env_init(&e, w, rank, FSDP_BACKEND_CPU));
    for (int s = 0; s < a->n_sizes; s++)
        for (int dt = 0; dt < FSDP_DTYPE_COUNT; dt++)
            FSDP_CHECK(sweep_one(&e.comm, &e.dev, a, a->sizes[s], (fsdp_dtype)dt,
                                 (uint64_t)(s * 16 + dt * 4)));
fail:
    env_fini(&e);
    return st;
}

static void run_sweep(int n, const size_t *sizes, int n_sizes)
{
    struct sweep_arg a = {sizes, n_sizes, 0, NULL, {NULL, NULL}};
    for (int s = 0; s < n_sizes; s++)
        if (sizes[s] * (size_t)n > a.max_full)
            a.max_full = sizes[s] * (size_t)n;
    a.want_gather = malloc(a.max_full * 4);
    a.want_red[0] = malloc(a.max_full * 4);
    a.want_red[1] = malloc(a.max_full * 4);
    launch_ok(n, sweep_rank, &a);
    free(a.want_gather);
    free(a.want_red[0]);
    free(a.want_red[1]);
}

static const int world_sizes[] = {1, 2, 3, 4, 8};

START_TEST(test_collectives_match_tree_reference)
{
    /* 2048 is the block of the tree reduction: sizes around it cross blocks. */
    static const size_t sizes[] = {1, 2, 3, 17, 2047, 2049, 5000};
    run_sweep(world_sizes[_i], sizes, (int)FSDP_TEST_LEN(sizes));
}
END_TEST

/* Outputs of more than 4 MiB per rank take the non-temporal store path of
 * fp32 reductions (2 ranks: 4 MiB + 20 bytes each). */
START_TEST(test_collectives_streamed)
{
    static const size_t big[] = {TEST_TSAN ? (size_t)1 << 14 : ((size_t)1 << 20) + 5};
    run_sweep(2, big, 1);
}
END_TEST

/* Several MiB per buffer: many blocks per rank slice, both dtypes. */
START_TEST(test_collectives_large)
{
    /* 256 Ki elements per rank: full fp32 buffers of 4 MiB (4 ranks) and
     * 3 MiB (3 ranks); 16 Ki under TSan */
    static const size_t big[] = {TEST_TSAN ? (size_t)1 << 14 : (size_t)1 << 18};
    run_sweep(_i == 0 ? 4 : 3, big, 1);
}
END_TEST

/* The inputs can tell the tree from a left-to-right sum, so the bitwise
 * comparisons above would catch a reduction in the wrong order. */
START_TEST(test_inputs_detect_summation_order)
{
    for (int n = 3; n <= 8; n++) {
        size_t differ = 0;
        for (size_t i = 0; i < 1000; i++) {
            float vals[8], seq = 0.0f;
            for (int q = 0; q < n; q++) {
                vals[q] = input_value(FSDP_DTYPE_F32, 7, q, i);
                seq += vals[q];
            }
            float tree = fsdp_tree_sum(vals, n);
            differ += memcmp(&tree, &seq, 4) != 0;
        }
        ck_assert_msg(differ > 10, "n=%d: tree and sequential sums differ in only %zu of 1000",
                      n, differ);
    }
    /* and the reference tree itself: ((a+b)+(c+d)) for 4, a+(b+c) for 3 */
    float v[4] = {1e8f, 1.0f, -1e8f, 1.0f};
    ck_assert_float_eq(fsdp_tree_sum(v, 4), (1e8f + 1.0f) + (-1e8f + 1.0f));
    ck_assert_float_eq(fsdp_tree_sum(v, 3), 1e8f + (1.0f + -1e8f));
    ck_assert_float_eq(fsdp_tree_sum(v, 1), 1e8f);
    ck_assert_float_eq(fsdp_tree_sum(v, 0), 0.0f);
}
END_TEST

/* ---- byte counters -------------------------------------------------------- */

struct count_arg {
    size_t numel;
    fsdp_backend be;
    size_t sent[8][FSDP_COLL_KIND_COUNT], recv[8][FSDP_COLL_KIND_COUNT];
    size_t calls[8][FSDP_COLL_KIND_COUNT];
    size_t total_sent[8], total_recv[8];
};

static fsdp_status count_rank(fsdp_world *w, int rank, void *p)
{
    struct count_arg *a = p;
    struct rank_env e;
    fsdp_status st;
    void *buf = NULL;
    int n = w->n_ranks;
    FSDP_CHECK(env_init(&e, w, rank, a->be));
    size_t full = a->numel * (size_t)n;
    FSDP_CHECK(fsdp_device_alloc(&e.dev, full * 4 * 2, FSDP_MEM_COMM, "test", &buf));
    if (fsdp_device_computes(&e.dev))
        memset(buf, 0, full * 4 * 2);
    float *send = buf, *recv = (float *)buf + full;
    /* some traffic to be discarded by the reset */
    FSDP_CHECK(fsdp_comm_all_reduce(&e.comm, send, recv, 3, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL));
    fsdp_comm_reset_stats(&e.comm);
    FSDP_CHECK(fsdp_comm_all_gather(&e.comm, send, recv, a->numel, FSDP_DTYPE_F32, NULL));
    FSDP_CHECK(fsdp_comm_reduce_scatter(&e.comm, send, recv, a->numel, FSDP_DTYPE_BF16,
                                        FSDP_REDUCE_AVG, NULL));
    FSDP_CHECK(fsdp_comm_all_reduce(&e.comm, send, recv, a->numel, FSDP_DTYPE_F32,
                                    FSDP_REDUCE_SUM, NULL));
    FSDP_CHECK(fsdp_comm_all_reduce(&e.comm, send, recv, a->numel, FSDP_DTYPE_BF16,
                                    FSDP_REDUCE_SUM, NULL));
    FSDP_CHECK(fsdp_comm_broadcast(&e.comm, send, a->numel, FSDP_DTYPE_F32, n - 1, NULL));
    FSDP_CHECK(fsdp_comm_barrier(&e.comm));
    memcpy(a->sent[rank], e.comm.bytes_sent, sizeof a->sent[rank]);
    memcpy(a->recv[rank], e.comm.bytes_recv, sizeof a->recv[rank]);
    memcpy(a->calls[rank], e.comm.n_calls, sizeof a->calls[rank]);
    a->total_sent[rank] = fsdp_comm_total_sent(&e.comm);
    a->total_recv[rank] = fsdp_comm_total_recv(&e.comm);
fail:
    if (buf)
        fsdp_device_free(&e.dev, buf);
    env_fini(&e);
    return st;
}

static void check_counts(int n, size_t numel, fsdp_backend be)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
    struct count_arg *a = calloc(1, sizeof *a);
    a->numel = numel;
    a->be = be;
    fsdp_status st = fsdp_world_launch(w, count_rank, a);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    size_t m = (size_t)n - 1;
    for (int r = 0; r < n; r++) {
        /* all_gather: chunk c = numel fp32 elements */
        size_t c = numel * 4;
        ck_assert_uint_eq(a->sent[r][FSDP_COLL_ALL_GATHER], c * m);
        ck_assert_uint_eq(a->recv[r][FSDP_COLL_ALL_GATHER], c * m);
        /* reduce_scatter: chunk c = numel bf16 elements */
        ck_assert_uint_eq(a->sent[r][FSDP_COLL_REDUCE_SCATTER], numel * 2 * m);
        ck_assert_uint_eq(a->recv[r][FSDP_COLL_REDUCE_SCATTER], numel * 2 * m);
        /* all_reduce: 2 * floor(S (N-1) / N), for S = 4 numel and S = 2 numel */
        size_t ar = 2 * (numel * 4 * m / (size_t)n) + 2 * (numel * 2 * m / (size_t)n);
        ck_assert_uint_eq(a->sent[r][FSDP_COLL_ALL_REDUCE], ar);
        ck_assert_uint_eq(a->recv[r][FSDP_COLL_ALL_REDUCE], ar);
        /* broadcast: the root sends S, the others receive S (none if alone) */
        size_t bs = n > 1 && r == n - 1 ? numel * 4 : 0;
        size_t br = n > 1 && r != n - 1 ? numel * 4 : 0;
        ck_assert_uint_eq(a->sent[r][FSDP_COLL_BROADCAST], bs);
        ck_assert_uint_eq(a->recv[r][FSDP_COLL_BROADCAST], br);
        ck_assert_uint_eq(a->calls[r][FSDP_COLL_ALL_GATHER], 1);
        ck_assert_uint_eq(a->calls[r][FSDP_COLL_REDUCE_SCATTER], 1);
        ck_assert_uint_eq(a->calls[r][FSDP_COLL_ALL_REDUCE], 2);
        ck_assert_uint_eq(a->calls[r][FSDP_COLL_BROADCAST], 1);
        ck_assert_uint_eq(a->total_sent[r], c * m + numel * 2 * m + ar + bs);
        ck_assert_uint_eq(a->total_recv[r], c * m + numel * 2 * m + ar + br);
    }
    free(a);
    fsdp_world_free(w);
}

START_TEST(test_byte_counters_follow_formulas)
{
    /* numel = 5: S (N-1) / N is not an integer for N = 3, 4, 8 */
    check_counts(world_sizes[_i], 5, FSDP_BACKEND_CPU);
    check_counts(world_sizes[_i], 1000, FSDP_BACKEND_CPU);
}
END_TEST

START_TEST(test_meta_counts_same_bytes)
{
    check_counts(world_sizes[_i], 5, FSDP_BACKEND_META);
    check_counts(world_sizes[_i], 1 << 20, FSDP_BACKEND_META);
}
END_TEST

/* Meta comm moves nothing: real host buffers given to it stay untouched. */
static fsdp_status meta_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    struct rank_env e;
    fsdp_status st;
    enum { NUMEL = 64 };
    float send[NUMEL * 8], recv[NUMEL * 8];
    FSDP_CHECK(env_init(&e, w, rank, FSDP_BACKEND_META));
    for (int i = 0; i < NUMEL * 8; i++) {
        send[i] = (float)(rank * 1000 + i);
        recv[i] = -1.0f;
    }
    FSDP_CHECK(fsdp_comm_all_gather(&e.comm, send, recv, NUMEL, FSDP_DTYPE_F32, NULL));
    FSDP_CHECK(fsdp_comm_reduce_scatter(&e.comm, send, recv, NUMEL, FSDP_DTYPE_F32,
                                        FSDP_REDUCE_SUM, NULL));
    FSDP_CHECK(fsdp_comm_all_reduce(&e.comm, send, recv, NUMEL, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                    NULL));
    FSDP_CHECK(fsdp_comm_broadcast(&e.comm, send, NUMEL, FSDP_DTYPE_F32, 0, NULL));
    FSDP_CHECK(fsdp_comm_barrier(&e.comm));
    for (int i = 0; i < NUMEL * 8; i++)
        if (send[i] != (float)(rank * 1000 + i) || recv[i] != -1.0f) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: meta comm wrote element %d",
                                rank, i);
            goto fail;
        }
    if (fsdp_comm_total_sent(&e.comm) == 0 && w->n_ranks > 1)
        st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: meta comm counted nothing", rank);
fail:
    env_fini(&e);
    return st;
}

START_TEST(test_meta_moves_nothing) { launch_ok(4, meta_rank, NULL); }
END_TEST

/* ---- faults, aborts, mismatches ------------------------------------------ */

#define FAULT_SEQ 6 /* collectives each rank issues in fault_rank */

struct fault_arg {
    fsdp_status st[8];
    char msg[8][FSDP_ERROR_MSG_MAX];
    int late_rank;            /* -1, or a rank that sleeps before each collective */
};

/* A fixed sequence of FAULT_SEQ collectives of every kind; records this
 * rank's status and message. */
static fsdp_status fault_rank(fsdp_world *w, int rank, void *p)
{
    struct fault_arg *a = p;
    struct rank_env e;
    fsdp_status st;
    void *buf = NULL;
    size_t numel = 3000, full = numel * (size_t)w->n_ranks;
    FSDP_CHECK(env_init(&e, w, rank, FSDP_BACKEND_CPU));
    FSDP_CHECK(fsdp_device_alloc(&e.dev, full * 4 * 2, FSDP_MEM_COMM, "test", &buf));
    memset(buf, 0, full * 4 * 2);
    float *send = buf, *recv = (float *)buf + full;
    for (int k = 1; k <= FAULT_SEQ; k++) {
        if (rank == a->late_rank)
            usleep(20000);
        switch (k) {
        case 1:
            st = fsdp_comm_all_gather(&e.comm, send, recv, numel, FSDP_DTYPE_F32, NULL);
            break;
        case 2:
            st = fsdp_comm_reduce_scatter(&e.comm, send, recv, numel, FSDP_DTYPE_BF16,
                                          FSDP_REDUCE_SUM, NULL);
            break;
        case 3:
            st = fsdp_comm_all_reduce(&e.comm, send, recv, full, FSDP_DTYPE_F32, FSDP_REDUCE_AVG,
                                      NULL);
            break;
        case 4:
            st = fsdp_comm_broadcast(&e.comm, send, full, FSDP_DTYPE_F32, 1 % w->n_ranks, NULL);
            break;
        case 5: st = fsdp_comm_barrier(&e.comm); break;
        default:
            st = fsdp_comm_all_reduce(&e.comm, recv, recv, full, FSDP_DTYPE_BF16,
                                      FSDP_REDUCE_SUM, NULL);
            break;
        }
        if ((st = synced(&e.comm, st)) != FSDP_STATUS_OK)
            goto fail;
    }
fail:
    a->st[rank] = st;
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", st ? fsdp_error_msg() : "");
    if (buf)
        fsdp_device_free(&e.dev, buf);
    env_fini(&e);
    return st;
}

START_TEST(test_fault_in_kth_collective_aborts_others)
{
    static const char *const kinds[FAULT_SEQ + 1] = {
        "", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "all_reduce"};
    int n = 4;
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
    for (int k = 1; k <= FAULT_SEQ; k++) {
        int bad = (k * 3) % n;
        struct fault_arg a = {.late_rank = k % 2 ? -1 : (bad + 1) % n};
        fsdp_world_set_fault(w, FSDP_FAULT_COLLECTIVE, bad, k);
        double t0 = fsdp_now_s();
        fsdp_status st = fsdp_world_launch(w, fault_rank, &a);
        double dt = fsdp_now_s() - t0;
        ck_assert_msg(st == FSDP_STATUS_INTERNAL, "k=%d: launcher returned %s: %s", k,
                      fsdp_status_name(st), fsdp_error_msg());
        char want[128];
        snprintf(want, sizeof want, "rank %d: injected failure in collective %d (%s)", bad, k,
                 kinds[k]);
        ck_assert_msg(strstr(fsdp_error_msg(), want), "k=%d: message '%s' lacks '%s'", k,
                      fsdp_error_msg(), want);
        ck_assert_int_eq(a.st[bad], FSDP_STATUS_INTERNAL);
        for (int r = 0; r < n; r++) {
            if (r == bad)
                continue;
            ck_assert_msg(a.st[r] == FSDP_STATUS_ABORTED, "k=%d rank %d: %s: %s", k, r,
                          fsdp_status_name(a.st[r]), a.msg[r]);
            ck_assert_msg(strstr(a.msg[r], "another rank failed"), "%s", a.msg[r]);
        }
        ck_assert_msg(dt < 2.0, "k=%d: the failure took %.2f s to propagate", k, dt);
        ck_assert_ptr_null(w->comm_shared);
    }
    /* The same world runs cleanly once the fault is disarmed. */
    fsdp_world_set_fault(w, FSDP_FAULT_COLLECTIVE, 0, 0);
    struct fault_arg a = {.late_rank = 2};
    ck_assert_int_eq(fsdp_world_launch(w, fault_rank, &a), FSDP_STATUS_OK);
    for (int r = 0; r < n; r++)
        ck_assert_int_eq(a.st[r], FSDP_STATUS_OK);
    fsdp_world_free(w);
}
END_TEST

/* The stall watchdog (core/flight.h): rank `bad` holds back its k-th
 * collective (FSDP_FAULT's stall); the first rank to wait past the
 * deadline ends the launch with one report naming the collective, who
 * arrived, who did not and what that rank ran last; every other rank
 * returns ABORTED; the world then runs cleanly. */
START_TEST(test_stall_in_kth_collective_is_reported)
{
    static const char *const kinds[FAULT_SEQ + 1] = {
        "", "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "all_reduce"};
    static const char *const arrived[4] = {"ranks 1-3", "ranks 0, 2-3", "ranks 0-1, 3",
                                           "ranks 0-2"};
    const double limit = 0.4;
    int n = 4;
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, n), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_set_watchdog(w, limit, NULL), FSDP_STATUS_OK);
    for (int k = 1; k <= FAULT_SEQ; k += 2) {
        int bad = (k * 3) % n;
        struct fault_arg a = {.late_rank = -1};
        fsdp_world_set_fault(w, FSDP_FAULT_STALL, bad, k);
        double t0 = fsdp_now_s();
        fsdp_status st = fsdp_world_launch(w, fault_rank, &a);
        double dt = fsdp_now_s() - t0;
        const char *msg = fsdp_error_msg();
        ck_assert_msg(st == FSDP_STATUS_STALLED, "k=%d: launcher returned %s: %s", k,
                      fsdp_status_name(st), msg);
        char want[3][160];
        snprintf(want[0], sizeof want[0], "collective %d (%s", k, kinds[k]);
        snprintf(want[1], sizeof want[1], "arrived: %s; not arrived: rank %d", arrived[bad], bad);
        snprintf(want[2], sizeof want[2], "rank %d's newest collective: %s", bad, kinds[k]);
        for (int i = 0; i < 3; i++)
            ck_assert_msg(strstr(msg, want[i]), "k=%d: the report lacks '%s':\n%s", k, want[i],
                          msg);
        ck_assert_msg(strstr(msg, "stalled: waited") && strstr(msg, "--watchdog 0.4"), "%s", msg);
        int n_stalled = 0;
        for (int r = 0; r < n; r++) {
            n_stalled += a.st[r] == FSDP_STATUS_STALLED;
            ck_assert_msg(a.st[r] == FSDP_STATUS_STALLED || a.st[r] == FSDP_STATUS_ABORTED,
                          "k=%d rank %d: %s: %s", k, r, fsdp_status_name(a.st[r]), a.msg[r]);
        }
        ck_assert_msg(n_stalled == 1, "k=%d: %d reports", k, n_stalled);
        ck_assert_int_eq(a.st[bad], FSDP_STATUS_ABORTED);
        ck_assert_msg(dt >= limit && dt < limit + 1.5, "k=%d: the stall ended the launch after "
                      "%.2f s (limit %.1f s)", k, dt, limit);
        ck_assert_ptr_null(w->comm_shared);
    }
    fsdp_world_set_fault(w, FSDP_FAULT_STALL, 0, 0);
    struct fault_arg a = {.late_rank = 2};
    ck_assert_int_eq(fsdp_world_launch(w, fault_rank, &a), FSDP_STATUS_OK);
    fsdp_world_free(w);
}
END_TEST

/* Communicators kept across launches: a collective fails in launch 1, and
 * launch 2 uses the same communicators (no re-init). The ranks that gave
 * up withdrew their arrival, so all ranks are in step again. They have no
 * device, so the collectives run on the rank threads in either stream mode
 * (a device's failure is sticky on async cpu streams, as on CUDA: its
 * streams would skip launch 2's work). */
struct persist_arg {
    struct rank_env env[4];
    struct fault_arg fa;
    int phase;               /* 0: init + failing sequence, 1: use, 2: fini */
};

static fsdp_status persist_rank(fsdp_world *w, int rank, void *p)
{
    struct persist_arg *a = p;
    struct rank_env *e = &a->env[rank];
    fsdp_status st = FSDP_STATUS_OK;
    if (a->phase == 0) {
        memset(e, 0, sizeof *e);
        FSDP_TRY(fsdp_comm_host_init(&e->comm, w, NULL, rank));
        e->have_comm = true;
        float x[64] = {0}, y[256];
        for (int k = 1; k <= 4 && st == FSDP_STATUS_OK; k++) {
            if (k == 3 && rank == 1)
                usleep(50000); /* the others are waiting when rank 1 fails */
            st = k % 2 ? fsdp_comm_all_gather(&e->comm, x, y, 64, FSDP_DTYPE_F32, NULL)
                       : fsdp_comm_all_reduce(&e->comm, x, y, 64, FSDP_DTYPE_F32,
                                              FSDP_REDUCE_SUM, NULL);
            st = synced(&e->comm, st);
        }
        a->fa.st[rank] = st;
        return st;
    }
    if (a->phase == 2) {
        env_fini(e);
        return FSDP_STATUS_OK;
    }
    /* fresh heap buffers each round: a rank out of step would read freed
     * memory (ASan) or another round's values */
    for (int it = 0; it < 50 && st == FSDP_STATUS_OK; it++) {
        float *x = malloc(8 * sizeof *x), *y = malloc(32 * sizeof *y);
        for (int i = 0; i < 8; i++)
            x[i] = (float)(rank * 100 + it * 8 + i);
        if (rank == it % 4)
            usleep(1000);
        st = synced(&e->comm, fsdp_comm_all_gather(&e->comm, x, y, 8, FSDP_DTYPE_F32, NULL));
        for (int q = 0; q < w->n_ranks && st == FSDP_STATUS_OK; q++)
            for (int i = 0; i < 8 && st == FSDP_STATUS_OK; i++)
                if (y[q * 8 + i] != (float)(q * 100 + it * 8 + i))
                    st = fsdp_error_set(FSDP_STATUS_INTERNAL,
                                        "rank %d it %d: gathered element %d of rank %d is %g",
                                        rank, it, i, q, (double)y[q * 8 + i]);
        if (st == FSDP_STATUS_OK)
            st = synced(&e->comm, fsdp_comm_all_reduce(&e->comm, x, y, 8, FSDP_DTYPE_F32,
                                                       FSDP_REDUCE_SUM, NULL));
        for (int i = 0; i < 8 && st == FSDP_STATUS_OK; i++) /* sum of 100 q + 8 it + i */
            if (y[i] != (float)(100 * 6 + 4 * (it * 8 + i)))
                st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d it %d: sum %g", rank, it,
                                    (double)y[i]);
        free(x);
        free(y);
    }
    return st;
}

/* _i = 0: rank 1's third collective fails; 1: it stalls until the
 * watchdog ends the launch. */
START_TEST(test_comm_survives_failed_launch)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_world_set_watchdog(w, 0.3, NULL), FSDP_STATUS_OK);
    struct persist_arg *a = calloc(1, sizeof *a);
    fsdp_fault_kind kind = _i ? FSDP_FAULT_STALL : FSDP_FAULT_COLLECTIVE;
    fsdp_world_set_fault(w, kind, 1, 3);
    a->phase = 0;
    ck_assert_int_eq(fsdp_world_launch(w, persist_rank, a),
                     _i ? FSDP_STATUS_STALLED : FSDP_STATUS_INTERNAL);
    ck_assert_int_eq(a->fa.st[1], _i ? FSDP_STATUS_ABORTED : FSDP_STATUS_INTERNAL);
    if (!_i)
        ck_assert_int_eq(a->fa.st[0], FSDP_STATUS_ABORTED);
    fsdp_world_set_fault(w, kind, 0, 0);
    a->phase = 1;
    fsdp_status st = fsdp_world_launch(w, persist_rank, a);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    a->phase = 2;
    ck_assert_int_eq(fsdp_world_launch(w, persist_rank, a), FSDP_STATUS_OK);
    ck_assert_ptr_null(w->comm_shared);
    free(a);
    fsdp_world_free(w);
}
END_TEST

/* A rank that fails outside any collective: the others, blocked in one,
 * return ABORTED promptly. */
static fsdp_status early_fail_rank(fsdp_world *w, int rank, void *p)
{
    if (rank == 0) {
        usleep(30000);
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open 'x.bin'");
    }
    return fault_rank(w, rank, p);
}

START_TEST(test_abort_while_waiting)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 8), FSDP_STATUS_OK);
    struct fault_arg a = {.late_rank = -1};
    double t0 = fsdp_now_s();
    fsdp_status st = fsdp_world_launch(w, early_fail_rank, &a);
    double dt = fsdp_now_s() - t0;
    ck_assert_int_eq(st, FSDP_STATUS_IO);
    ck_assert_str_eq(fsdp_error_msg(), "rank 0: cannot open 'x.bin'");
    for (int r = 1; r < 8; r++)
        ck_assert_msg(a.st[r] == FSDP_STATUS_ABORTED, "rank %d: %s", r, fsdp_status_name(a.st[r]));
    ck_assert_msg(dt < 1.0, "abort took %.2f s", dt);
    ck_assert_ptr_null(w->comm_shared);
    fsdp_world_free(w);
}
END_TEST

/* Ranks that disagree on a collective's size all fail with INVALID_ARG
 * instead of reading past a buffer or hanging. */
static fsdp_status mismatch_rank(fsdp_world *w, int rank, void *p)
{
    struct fault_arg *a = p;
    struct rank_env e;
    fsdp_status st;
    float send[16] = {0}, recv[64];
    FSDP_CHECK(env_init(&e, w, rank, FSDP_BACKEND_CPU));
    size_t numel = rank == 2 ? 8 : 16;
    st = synced(&e.comm, fsdp_comm_all_gather(&e.comm, send, recv, numel, FSDP_DTYPE_F32, NULL));
fail:
    a->st[rank] = st;
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", st ? fsdp_error_msg() : "");
    env_fini(&e);
    return st;
}

START_TEST(test_mismatched_collectives_fail_cleanly)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 4), FSDP_STATUS_OK);
    struct fault_arg a = {.late_rank = -1};
    fsdp_status st = fsdp_world_launch(w, mismatch_rank, &a);
    ck_assert_int_eq(st, FSDP_STATUS_INVALID_ARG);
    for (int r = 0; r < 4; r++) {
        ck_assert_msg(a.st[r] == FSDP_STATUS_INVALID_ARG || a.st[r] == FSDP_STATUS_ABORTED,
                      "rank %d: %s", r, fsdp_status_name(a.st[r]));
        if (a.st[r] == FSDP_STATUS_INVALID_ARG)
            ck_assert_msg(strstr(a.msg[r], "mismatch"), "%s", a.msg[r]);
    }
    ck_assert_int_eq(a.st[2], FSDP_STATUS_INVALID_ARG);
    fsdp_world_free(w);
}
END_TEST

/* Initialising twice on one rank without fini is refused; fini frees. */
static fsdp_status double_init_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    fsdp_comm a, b;
    FSDP_TRY(fsdp_comm_host_init(&a, w, NULL, rank));
    fsdp_status st = fsdp_comm_host_init(&b, w, NULL, rank);
    fsdp_comm_fini(&a);
    if (st != FSDP_STATUS_INTERNAL || !strstr(fsdp_error_msg(), "initialised twice"))
        return fsdp_error_set(FSDP_STATUS_INTERNAL, "second init returned %s: %s",
                              fsdp_status_name(st), fsdp_error_msg());
    /* after fini the rank may initialise again */
    FSDP_TRY(fsdp_comm_host_init(&b, w, NULL, rank));
    st = fsdp_comm_barrier(&b);
    fsdp_comm_fini(&b);
    return st;
}

START_TEST(test_init_twice_refused)
{
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 3), FSDP_STATUS_OK);
    fsdp_status st = fsdp_world_launch(w, double_init_rank, NULL);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_ptr_null(w->comm_shared);
    fsdp_comm c;
    ck_assert_int_eq(fsdp_comm_host_init(&c, w, NULL, 3), FSDP_STATUS_INVALID_ARG);
    fsdp_world_free(w);
}
END_TEST

/* Many small collectives with one slow rank: the meetings' sleep/wake path. */
static fsdp_status pingpong_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    struct rank_env e;
    fsdp_status st;
    float x[4], y[4];
    FSDP_CHECK(env_init(&e, w, rank, FSDP_BACKEND_CPU));
    for (int it = 0; it < 200; it++) {
        if (rank == it % w->n_ranks && it % 20 == 0)
            usleep(2000);
        for (int i = 0; i < 4; i++)
            x[i] = (float)(rank + it + i);
        FSDP_CHECK(synced(&e.comm, fsdp_comm_all_reduce(&e.comm, x, y, 4, FSDP_DTYPE_F32,
                                                        FSDP_REDUCE_SUM, NULL)));
        /* sum over r of (r + it + i), exact in fp32 for these sizes */
        int n = w->n_ranks;
        for (int i = 0; i < 4; i++)
            if (y[i] != (float)(n * (n - 1) / 2 + n * (it + i))) {
                st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d it %d: got %g", rank, it,
                                    (double)y[i]);
                goto fail;
            }
    }
fail:
    env_fini(&e);
    return st;
}

START_TEST(test_many_small_collectives) { launch_ok(world_sizes[_i], pingpong_rank, NULL); }
END_TEST

/* ---- the transport table -------------------------------------------------- */

#ifdef FSDP_NCCL
static const bool nccl_built = true;
#else
static const bool nccl_built = false; /* auto passes over its stub */
#endif

/* The rule, written out apart from the table: the transport each request
 * gets, or -1 where it must be refused. */
static int expected_transport(fsdp_backend b, fsdp_comm_kind k, int rpd, int n_proc)
{
    bool one = rpd == 1, alone = n_proc <= 1; /* one rank per device; one process */
    switch (k) {
    case FSDP_COMM_AUTO:
        return b == FSDP_BACKEND_CPU    ? (one ? (alone ? FSDP_COMM_HOST : FSDP_COMM_MPI) : -1)
               : b == FSDP_BACKEND_META ? (one && alone ? FSDP_COMM_META : -1)
               : one && nccl_built      ? FSDP_COMM_NCCL
               : alone                  ? FSDP_COMM_PEER
                                        : -1;
    case FSDP_COMM_HOST: return b == FSDP_BACKEND_CPU && one && alone ? FSDP_COMM_HOST : -1;
    case FSDP_COMM_MPI: return b == FSDP_BACKEND_CPU && one && !alone ? FSDP_COMM_MPI : -1;
    case FSDP_COMM_META: return b == FSDP_BACKEND_META && one && alone ? FSDP_COMM_META : -1;
    case FSDP_COMM_NCCL: return b == FSDP_BACKEND_CUDA && one ? FSDP_COMM_NCCL : -1;
    case FSDP_COMM_PEER: return b == FSDP_BACKEND_CUDA && alone ? FSDP_COMM_PEER : -1;
    default: return -1;
    }
}

START_TEST(test_transport_pick_matrix)
{
    static const int rpds[] = {1, 2, 4}, procs[] = {1, 2};
    int n_checked = 0;
    for (int b = 0; b < FSDP_BACKEND_COUNT; b++)
        for (int k = 0; k < FSDP_COMM_KIND_COUNT; k++)
            for (size_t i = 0; i < FSDP_TEST_LEN(rpds); i++)
                for (size_t j = 0; j < FSDP_TEST_LEN(procs); j++, n_checked++) {
                    fsdp_transport_req req = {(fsdp_backend)b, (fsdp_comm_kind)k, rpds[i],
                                              procs[j]};
                    const fsdp_transport *t = (const fsdp_transport *)1;
                    fsdp_status st = fsdp_transport_pick(&req, &t);
                    int want = expected_transport(req.backend, req.kind, rpds[i], procs[j]);
                    char desc[128];
                    snprintf(desc, sizeof desc, "--backend %s --comm %s, %d rank(s)/device, %d "
                             "process(es)", fsdp_backend_name(req.backend),
                             fsdp_comm_kind_name(req.kind), rpds[i], procs[j]);
                    if (want >= 0) {
                        ck_assert_msg(st == FSDP_STATUS_OK, "%s: refused: %s", desc,
                                      fsdp_error_msg());
                        ck_assert_msg(t && (int)t->kind == want, "%s: picked %s, want %s", desc,
                                      t ? fsdp_comm_kind_name(t->kind) : "nothing",
                                      fsdp_comm_kind_name((fsdp_comm_kind)want));
                        ck_assert_ptr_nonnull(t->init);
                        continue;
                    }
                    ck_assert_ptr_null(t);
                    const char *msg = fsdp_error_msg();
                    if (!nccl_built && req.backend == FSDP_BACKEND_CUDA && rpds[i] == 1 &&
                        procs[j] > 1 && k != FSDP_COMM_NCCL) {
                        /* only nccl would do, and this build has its stub */
                        ck_assert_msg(st == FSDP_STATUS_UNSUPPORTED &&
                                          strstr(msg, "--comm nccl would serve --backend cuda") &&
                                          strstr(msg, "no NCCL"),
                                      "%s: %s", desc, msg);
                        continue;
                    }
                    ck_assert_msg(st == FSDP_STATUS_INVALID_ARG, "%s: %s (%s)", desc,
                                  fsdp_status_name(st), fsdp_error_msg());
                    char want_b[32];
                    snprintf(want_b, sizeof want_b, "--backend %s", fsdp_backend_name(req.backend));
                    ck_assert_msg(strstr(msg, want_b) || procs[j] > 1 || rpds[i] > 1,
                                  "%s: '%s' does not name the backend", desc, msg);
                    /* a refused explicit choice names what would fit */
                    int alt = expected_transport(req.backend, FSDP_COMM_AUTO, rpds[i], procs[j]);
                    if (k != FSDP_COMM_AUTO && alt >= 0) {
                        char use[64];
                        snprintf(use, sizeof use, "use --comm %s",
                                 fsdp_comm_kind_name((fsdp_comm_kind)alt));
                        ck_assert_msg(strstr(msg, use), "%s: '%s' lacks '%s'", desc, msg, use);
                    }
                    /* where nothing fits, it says the first property missing:
                     * sharing a device (only cuda's peer can), then processes
                     * (mpi on cpu and nccl on cuda can) */
                    if (alt < 0 && rpds[i] > 1 && req.backend != FSDP_BACKEND_CUDA)
                        ck_assert_msg(strstr(msg, "share a device") &&
                                          strstr(msg, "peer on --backend cuda does"),
                                      "%s: %s", desc, msg);
                    else if (alt < 0)
                        ck_assert_msg(strstr(msg, "processes") &&
                                          strstr(msg, "mpi on --backend cpu; nccl on --backend "
                                                      "cuda do"),
                                      "%s: %s", desc, msg);
                }
    ck_assert_int_eq(n_checked, FSDP_BACKEND_COUNT * FSDP_COMM_KIND_COUNT * 3 * 2);
    /* out-of-range requests are refused, not read past the tables */
    const fsdp_transport *t;
    fsdp_transport_req bad_b = {FSDP_BACKEND_COUNT, FSDP_COMM_AUTO, 1, 1};
    ck_assert_int_eq(fsdp_transport_pick(&bad_b, &t), FSDP_STATUS_INVALID_ARG);
    fsdp_transport_req bad_k = {FSDP_BACKEND_CPU, FSDP_COMM_KIND_COUNT, 1, 1};
    ck_assert_int_eq(fsdp_transport_pick(&bad_k, &t), FSDP_STATUS_INVALID_ARG);
}
END_TEST

/* Each transport's help line (what --help prints) names exactly the
 * backends the table lets it serve. */
/* Hybrid sharding's communicators over groups: every transport forms
 * them (nccl across processes and GPUs, peer for virtual ranks). */
START_TEST(test_transport_groups)
{
    const fsdp_transport *t;
    fsdp_transport_req cpu = {FSDP_BACKEND_CPU, FSDP_COMM_AUTO, 1, 2};
    ck_assert_int_eq(fsdp_transport_pick(&cpu, &t), FSDP_STATUS_OK);
    ck_assert_int_eq(t->kind, FSDP_COMM_MPI);
    fsdp_transport_req meta = {FSDP_BACKEND_META, FSDP_COMM_AUTO, 1, 1};
    ck_assert_int_eq(fsdp_transport_pick(&meta, &t), FSDP_STATUS_OK);
    fsdp_transport_req cuda = {FSDP_BACKEND_CUDA, FSDP_COMM_NCCL, 1, 2};
    ck_assert_int_eq(fsdp_transport_pick(&cuda, &t), FSDP_STATUS_OK);
    ck_assert_int_eq(t->kind, FSDP_COMM_NCCL);
    fsdp_transport_req virt = {FSDP_BACKEND_CUDA, FSDP_COMM_AUTO, 4, 1};
    ck_assert_int_eq(fsdp_transport_pick(&virt, &t), FSDP_STATUS_OK);
    ck_assert_int_eq(t->kind, FSDP_COMM_PEER);
}
END_TEST

START_TEST(test_transport_help_names_its_backends)
{
    const fsdp_name_table *kt = &fsdp_comm_kind_names;
    ck_assert_int_eq(kt->n, FSDP_COMM_KIND_COUNT);
    for (int i = 0; i < kt->n; i++) {
        const fsdp_name *e = &kt->v[i];
        ck_assert_str_eq(fsdp_comm_kind_name((fsdp_comm_kind)e->value), e->name);
        ck_assert_ptr_nonnull(e->help);
        if (e->value == FSDP_COMM_AUTO)
            continue;
        for (int b = 0; b < FSDP_BACKEND_COUNT; b++) {
            /* in a job of one process or of several (mpi needs several) */
            fsdp_transport_req one = {(fsdp_backend)b, (fsdp_comm_kind)e->value, 1, 1};
            fsdp_transport_req two = {(fsdp_backend)b, (fsdp_comm_kind)e->value, 1, 2};
            const fsdp_transport *t;
            bool serves = fsdp_transport_pick(&one, &t) == FSDP_STATUS_OK ||
                          fsdp_transport_pick(&two, &t) == FSDP_STATUS_OK;
            char want[32];
            snprintf(want, sizeof want, "--backend %s", fsdp_backend_name((fsdp_backend)b));
            ck_assert_msg(serves == (strstr(e->help, want) != NULL),
                          "transport %s: serves %s = %d, but its help says '%s'", e->name,
                          fsdp_backend_name((fsdp_backend)b), serves, e->help);
        }
    }
}
END_TEST

struct misfit_arg {
    fsdp_status st_meta[4], st_wrong_dev[4];
    char msg[4][FSDP_ERROR_MSG_MAX];
};

/* fsdp_comm_fini with collectives still queued (async cpu streams with
 * delays): fini waits for them, so they neither read the freed transport
 * nor leave their buffer half reduced. Each rank doubles x 20 times. */
enum { FINI_N = 16, FINI_ROUNDS = 20 };

static fsdp_status fini_queued_rank(fsdp_world *w, int rank, void *p)
{
    (void)p;
    struct rank_env e;
    fsdp_status st;
    float *x = NULL;
    FSDP_CHECK(env_init(&e, w, rank, FSDP_BACKEND_CPU));
    FSDP_CHECK(fsdp_device_alloc(&e.dev, FINI_N * sizeof *x, FSDP_MEM_COMM, "test", (void **)&x));
    for (int i = 0; i < FINI_N; i++)
        x[i] = 1.0f;
    for (int k = 0; k < FINI_ROUNDS; k++)
        FSDP_CHECK(fsdp_comm_all_reduce(&e.comm, x, x, FINI_N, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                        NULL));
    fsdp_comm_fini(&e.comm); /* no sync before it */
    e.have_comm = false;
    FSDP_CHECK(fsdp_device_stream_sync(&e.dev, e.dev.comm));
    for (int i = 0; i < FINI_N; i++)
        if (x[i] != (float)(1 << FINI_ROUNDS)) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: x[%d] = %g after fini, want %d",
                                rank, i, (double)x[i], 1 << FINI_ROUNDS);
            goto fail;
        }
fail:
    if (x)
        fsdp_device_free(&e.dev, x);
    env_fini(&e);
    return st;
}

START_TEST(test_fini_waits_for_queued_collectives)
{
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_ASYNC, 3);
    launch_ok(2, fini_queued_rank, NULL);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_DEFAULT, 0);
}
END_TEST

/* On cpu devices: --comm meta is refused on every rank, a request for
 * another backend than the device's is an internal error, auto works. */
static fsdp_status misfit_rank(fsdp_world *w, int rank, void *p)
{
    struct misfit_arg *a = p;
    fsdp_device dev;
    fsdp_comm c;
    FSDP_TRY(fsdp_device_init(&dev, FSDP_BACKEND_CPU, w, rank, rank, 0));
    fsdp_transport_req meta = {.backend = FSDP_BACKEND_CPU, .kind = FSDP_COMM_META};
    a->st_meta[rank] = fsdp_comm_init(&c, &meta, w, &dev, rank);
    snprintf(a->msg[rank], sizeof a->msg[rank], "%s", fsdp_error_msg());
    fsdp_transport_req other = {.backend = FSDP_BACKEND_META, .kind = FSDP_COMM_AUTO};
    a->st_wrong_dev[rank] = fsdp_comm_init(&c, &other, w, &dev, rank);
    fsdp_transport_req ok = {.backend = FSDP_BACKEND_CPU, .kind = FSDP_COMM_AUTO};
    fsdp_status st = fsdp_comm_init(&c, &ok, w, &dev, rank);
    if (st == FSDP_STATUS_OK) {
        float x = (float)rank, sum = 0;
        st = synced(&c, fsdp_comm_all_reduce(&c, &x, &sum, 1, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                             NULL));
        if (st == FSDP_STATUS_OK && sum != 6.0f)
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: sum %g, want 6", rank, sum);
        fsdp_comm_fini(&c);
    }
    fsdp_device_fini(&dev);
    return st;
}

START_TEST(test_comm_init_refuses_misfit)
{
    struct misfit_arg a;
    memset(&a, 0, sizeof a);
    launch_ok(4, misfit_rank, &a);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(a.st_meta[r], FSDP_STATUS_INVALID_ARG);
        ck_assert_msg(strstr(a.msg[r], "--comm meta does not run on --backend cpu: use --comm "
                                       "host or auto"), "rank %d: %s", r, a.msg[r]);
        ck_assert_int_eq(a.st_wrong_dev[r], FSDP_STATUS_INTERNAL);
    }
}
END_TEST

int main(void)
{
    int n_worlds = (int)FSDP_TEST_LEN(world_sizes);
    const fsdp_test_tcase tcases[] = {
        {"host", 120,
         FSDP_TESTS(test_inputs_detect_summation_order,
                    FSDP_TEST_LOOP(test_collectives_match_tree_reference, n_worlds),
                    FSDP_TEST_LOOP(test_collectives_large, 2), test_collectives_streamed,
                    FSDP_TEST_LOOP(test_byte_counters_follow_formulas, n_worlds),
                    FSDP_TEST_LOOP(test_many_small_collectives, n_worlds))},
        {"meta", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_meta_counts_same_bytes, n_worlds),
                    test_meta_moves_nothing)},
        {"transport", 60,
         FSDP_TESTS(test_transport_pick_matrix, test_transport_help_names_its_backends,
                    test_transport_groups, test_comm_init_refuses_misfit,
                    test_fini_waits_for_queued_collectives)},
        {"failures", 60,
         FSDP_TESTS(test_fault_in_kth_collective_aborts_others, test_abort_while_waiting,
                    FSDP_TEST_LOOP(test_comm_survives_failed_launch, 2),
                    test_mismatched_collectives_fail_cleanly, test_init_twice_refused,
                    test_stall_in_kth_collective_is_reported)},
    };
    return fsdp_test_main("comm", tcases, FSDP_TEST_LEN(tcases));
}
