/*
 * bench_comm.c - bandwidth of the host collectives (comm/host.c), in the
 * style of nccl-tests, next to this machine's multi-threaded memcpy
 * bandwidth.
 *
 * For 2, 4 and 8 cpu ranks and total buffer sizes S from 4 KiB to 256 MiB
 * (x4 steps), times all_gather (in place, as FSDP gathers), reduce_scatter
 * (out of place) and all_reduce (in place), fp32, after warm-up, and prints:
 *   time    mean per call over a timed loop of about 128 MiB of buffer (one
 *           call from 128 MiB up), measured by rank 0 between two barriers;
 *           the median of REPS loops (robust to a shared machine's load)
 *   algbw   S / time
 *   busbw   algbw * (N-1)/N   (all_reduce: algbw * 2(N-1)/N)
 *   total   bytes received by all ranks together per second, from the comm
 *           byte counters (comm.h formulas): the figure compared with memcpy
 * memcpy bandwidth: 2 threads each copying its own large buffer once; bytes
 * copied per second by both together. For every point with S >= 16 MiB it
 * is measured right before each of the REPS timed loops (by rank 0 while
 * the other ranks wait at a barrier), and the point's median time is
 * compared with the median of those baselines, so both see the same drift
 * of a shared machine's load. The goal (issue 2): for S >= 16 MiB,
 * total >= 50% of memcpy.
 *
 * usage: bench_comm [--quick] [--max-size BYTES] [--ranks 2,4,8] [--iters N]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/world.h"
#include "device/device.h"

#define GOAL_MIN_BYTES ((size_t)16 << 20)
#define GOAL_RATIO 0.5
#define REPS 5 /* timed loops per point; the median counts */

/* ---- memcpy baseline ----------------------------------------------------- */

#define COPY_THREADS 2

/* Each baseline thread's own buffers, allocated and faulted in once. */
static char *copy_src[COPY_THREADS], *copy_dst[COPY_THREADS];

struct copy_job {
    int t;
    size_t bytes;
    int reps;
    pthread_barrier_t *start;
};

static void *copy_main(void *p)
{
    struct copy_job *j = p;
    pthread_barrier_wait(j->start);
    for (int i = 0; i < j->reps; i++)
        memcpy(copy_dst[j->t], copy_src[j->t], j->bytes);
    return NULL;
}

static void memcpy_setup(size_t bytes)
{
    for (int t = 0; t < COPY_THREADS; t++) {
        copy_src[t] = malloc(bytes);
        copy_dst[t] = malloc(bytes);
        if (!copy_src[t] || !copy_dst[t]) {
            fprintf(stderr, "bench_comm: out of memory for the memcpy baseline\n");
            exit(1);
        }
        memset(copy_src[t], 1, bytes);
        memset(copy_dst[t], 2, bytes);
    }
}

static void memcpy_teardown(void)
{
    for (int t = 0; t < COPY_THREADS; t++) {
        free(copy_src[t]);
        free(copy_dst[t]);
    }
}

/* Bytes per second copied by the baseline threads together, each memcpy'ing
 * its own `bytes`-byte buffer `reps` times. */
static double memcpy_once(size_t bytes, int reps)
{
    struct copy_job jobs[COPY_THREADS];
    pthread_t tids[COPY_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, COPY_THREADS + 1);
    for (int t = 0; t < COPY_THREADS; t++) {
        jobs[t] = (struct copy_job){t, bytes, reps, &start};
        pthread_create(&tids[t], NULL, copy_main, &jobs[t]);
    }
    pthread_barrier_wait(&start);
    double t0 = fsdp_now_s();
    for (int t = 0; t < COPY_THREADS; t++)
        pthread_join(tids[t], NULL);
    double dt = fsdp_now_s() - t0;
    pthread_barrier_destroy(&start);
    return (double)COPY_THREADS * (double)bytes * reps / dt;
}

/* Median of n values (n <= 16); reorders x. */
static double median(double *x, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && x[j - 1] > x[j]; j--) {
            double t = x[j];
            x[j] = x[j - 1];
            x[j - 1] = t;
        }
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The median of REPS measurements of the threads copying `bytes` each once. */
static double memcpy_bandwidth(size_t bytes)
{
    double bw[REPS];
    for (int i = 0; i < REPS; i++)
        bw[i] = memcpy_once(bytes, 1);
    return median(bw, REPS);
}

/* ---- collectives ----------------------------------------------------------- */

enum { OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_ALL_REDUCE, N_OPS };
static const char *const op_names[N_OPS] = {"all_gather", "reduce_scatter", "all_reduce"};
static const fsdp_coll_kind op_kinds[N_OPS] = {FSDP_COLL_ALL_GATHER, FSDP_COLL_REDUCE_SCATTER,
                                               FSDP_COLL_ALL_REDUCE};

struct bench {
    size_t sizes[16];
    int n_sizes;
    int iters;              /* 0: chosen per size */
    /* results, [size][op] */
    size_t copy_bytes;      /* buffer of each memcpy baseline thread */
    double time_s[16][N_OPS];
    double memcpy_bw[16][N_OPS]; /* baseline for the point (S >= 16 MiB) */
    size_t recv_bytes[16][N_OPS][8]; /* per rank, per call */
};

static int iters_for(const struct bench *b, size_t bytes)
{
    if (b->iters > 0)
        return b->iters;
    size_t it = ((size_t)128 << 20) / bytes; /* about 128 MiB of buffer per loop */
    return it < 1 ? 1 : it > 200 ? 200 : (int)it;
}

static fsdp_status run_op(fsdp_comm *c, int op, float *send, float *recv, size_t bytes)
{
    size_t numel = bytes / sizeof(float), chunk = numel / (size_t)c->n_ranks;
    switch (op) {
    case OP_ALL_GATHER:
        return fsdp_comm_all_gather(c, recv + (size_t)c->rank * chunk, recv, chunk,
                                    FSDP_DTYPE_F32, NULL);
    case OP_REDUCE_SCATTER:
        return fsdp_comm_reduce_scatter(c, send, recv, chunk, FSDP_DTYPE_F32, FSDP_REDUCE_SUM,
                                        NULL);
    default:
        return fsdp_comm_all_reduce(c, recv, recv, numel, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
    }
}

static fsdp_status bench_rank(fsdp_world *w, int rank, void *p)
{
    struct bench *b = p;
    fsdp_device dev;
    fsdp_comm comm;
    fsdp_status st = FSDP_STATUS_OK;
    float *send = NULL, *recv = NULL;
    size_t max = b->sizes[b->n_sizes - 1];
    int have_comm = 0;
    FSDP_TRY(fsdp_device_init(&dev, FSDP_BACKEND_CPU, w, rank, rank, 0));
    FSDP_CHECK(fsdp_comm_host_init(&comm, w, &dev, rank));
    have_comm = 1;
    FSDP_CHECK(fsdp_device_alloc(&dev, max, FSDP_MEM_COMM, "bench send", (void **)&send));
    FSDP_CHECK(fsdp_device_alloc(&dev, max, FSDP_MEM_COMM, "bench recv", (void **)&recv));
    /* small values: repeated in-place all_reduces stay finite */
    for (size_t i = 0; i < max / sizeof(float); i++) {
        send[i] = 1e-3f * (float)((i + (size_t)rank) % 7);
        recv[i] = 0.0f;
    }
    for (int s = 0; s < b->n_sizes; s++) {
        size_t bytes = b->sizes[s];
        int iters = iters_for(b, bytes);
        for (int op = 0; op < N_OPS; op++) {
            for (int i = 0; i < 2; i++) /* warm-up */
                FSDP_CHECK(run_op(&comm, op, send, recv, bytes));
            int goal = bytes >= GOAL_MIN_BYTES;
            double times[REPS], mcs[REPS];
            for (int rep = 0; rep < REPS; rep++) {
                /* the baseline right before each loop; the others wait */
                if (goal && rank == 0)
                    mcs[rep] = memcpy_once(b->copy_bytes, 1);
                FSDP_CHECK(fsdp_comm_barrier(&comm));
                fsdp_comm_reset_stats(&comm);
                double t0 = fsdp_now_s();
                for (int i = 0; i < iters; i++)
                    FSDP_CHECK(run_op(&comm, op, send, recv, bytes));
                FSDP_CHECK(fsdp_comm_barrier(&comm));
                times[rep] = (fsdp_now_s() - t0) / iters;
            }
            if (rank == 0) {
                b->time_s[s][op] = median(times, REPS);
                b->memcpy_bw[s][op] = goal ? median(mcs, REPS) : 0;
            }
            b->recv_bytes[s][op][rank] = comm.bytes_recv[op_kinds[op]] / (size_t)iters;
        }
    }
fail:
    fsdp_device_free(&dev, send);
    fsdp_device_free(&dev, recv);
    if (have_comm)
        fsdp_comm_fini(&comm);
    fsdp_device_fini(&dev);
    return st;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_comm [--quick] [--max-size BYTES] [--ranks 2,4,8] [--iters N]\n"
               "  --quick       sizes 4 KiB, 1 MiB, 16 MiB, 64 MiB only\n"
               "  --max-size    largest total buffer size (default 256MiB)\n"
               "  --ranks       comma-separated world sizes (default 2,4,8; at most 8)\n"
               "  --iters       timed calls per loop (default: 128 MiB / size, 1..200)\n");
}

int main(int argc, char **argv)
{
    size_t max_size = (size_t)256 << 20;
    int quick = 0, ranks[8] = {2, 4, 8}, n_worlds = 3;
    struct bench *b = calloc(1, sizeof *b);
    if (!b)
        return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--max-size") && i + 1 < argc) {
            if (fsdp_parse_bytes(argv[++i], &max_size) != FSDP_STATUS_OK) {
                fprintf(stderr, "bench_comm: --max-size: %s\n", fsdp_error_msg());
                return 2;
            }
        } else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            n_worlds = 0;
            for (char *tok = strtok(argv[++i], ","); tok && n_worlds < 8; tok = strtok(NULL, ",")) {
                int n = atoi(tok);
                if (n < 1 || n > 8) {
                    fprintf(stderr, "bench_comm: --ranks: %s is not 1..8\n", tok);
                    return 2;
                }
                ranks[n_worlds++] = n;
            }
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            b->iters = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    /* sizes: multiples of 4 KiB so every world size up to 8 divides them */
    if (quick) {
        static const size_t q[] = {(size_t)4 << 10, (size_t)1 << 20, (size_t)16 << 20,
                                   (size_t)64 << 20};
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
            if (q[i] <= max_size)
                b->sizes[b->n_sizes++] = q[i];
    } else {
        for (size_t s = (size_t)4 << 10; s <= max_size && b->n_sizes < 16; s *= 4)
            b->sizes[b->n_sizes++] = s;
    }
    if (!b->n_sizes) {
        fprintf(stderr, "bench_comm: --max-size must be at least 4KiB\n");
        return 2;
    }

    size_t copy_bytes = b->sizes[b->n_sizes - 1] < ((size_t)64 << 20) ? (size_t)64 << 20
                                                                       : b->sizes[b->n_sizes - 1];
    b->copy_bytes = copy_bytes;
    memcpy_setup(copy_bytes);
    char buf[32];
    double mc0 = memcpy_bandwidth(copy_bytes), mc_min = mc0, mc_max = mc0;
    printf("memcpy baseline: 2 threads, each copying its own %s buffer; bytes copied per\n"
           "second by both, median of %d: %.2f GB/s now; re-measured before each timed loop\n"
           "of every point of 16 MiB or more (column memcpy: median of those)\n"
           "time: median of %d timed loops\n\n",
           fsdp_fmt_bytes(buf, sizeof buf, (double)copy_bytes), REPS, mc0 / 1e9, REPS);
    printf("%5s  %-14s  %10s  %10s  %10s  %10s  %10s  %10s  %7s  %s\n", "ranks", "op", "size",
           "time_us", "algbw_GB/s", "busbw_GB/s", "total_GB/s", "memcpy", "ratio", "goal");

    int all_met = 1;
    for (int wi = 0; wi < n_worlds; wi++) {
        int n = ranks[wi];
        fsdp_world *w = NULL;
        if (fsdp_world_init(&w, n) != FSDP_STATUS_OK) {
            fprintf(stderr, "bench_comm: %s\n", fsdp_error_msg());
            return 1;
        }
        memset(b->time_s, 0, sizeof b->time_s);
        fsdp_status st = fsdp_world_launch(w, bench_rank, b);
        fsdp_world_free(w);
        if (st != FSDP_STATUS_OK) {
            fprintf(stderr, "bench_comm: %d ranks: %s\n", n, fsdp_error_msg());
            return 1;
        }
        for (int s = 0; s < b->n_sizes; s++) {
            for (int op = 0; op < N_OPS; op++) {
                double t = b->time_s[s][op], S = (double)b->sizes[s];
                double algbw = S / t;
                double busbw = algbw * (op == OP_ALL_REDUCE ? 2.0 : 1.0) * (n - 1) / n;
                double moved = 0;
                for (int r = 0; r < n; r++)
                    moved += (double)b->recv_bytes[s][op][r];
                double total = moved / t;
                printf("%5d  %-14s  %10s  %10.1f  %10.2f  %10.2f  %10.2f", n, op_names[op],
                       fsdp_fmt_bytes(buf, sizeof buf, S), t * 1e6, algbw / 1e9, busbw / 1e9,
                       total / 1e9);
                if (b->sizes[s] >= GOAL_MIN_BYTES) {
                    double mc = b->memcpy_bw[s][op];
                    mc_min = mc < mc_min ? mc : mc_min;
                    mc_max = mc > mc_max ? mc : mc_max;
                    int met = total >= GOAL_RATIO * mc;
                    all_met &= met;
                    printf("  %10.2f  %6.0f%%  %s\n", mc / 1e9, 100.0 * total / mc,
                           met ? "met" : "MISSED");
                } else {
                    printf("\n");
                }
            }
        }
    }
    printf("\nmemcpy baseline ranged %.2f..%.2f GB/s during the run\n", mc_min / 1e9,
           mc_max / 1e9);
    printf("goal (total >= %.0f%% of memcpy for sizes >= 16 MiB): %s\n", 100 * GOAL_RATIO,
           all_met ? "met" : "MISSED");
    memcpy_teardown();
    free(b);
    return 0;
}
