/*
 * coll_sweep.h - one rank's run of every collective (all_gather,
 * reduce_scatter, all_reduce in and out of place, broadcast from several
 * roots, barrier) for fp32 and bf16, SUM and AVG, over a list of sizes,
 * for any transport. Each output is compared with a serial reference built
 * from fsdp_tree_sum over the global ranks, bit for bit, and folded into a
 * digest, so runs of one job laid out differently (1 process x 4 ranks,
 * 2 x 2, 4 x 1) can be compared by their digests too.
 *
 * Header-only: shared by test_mpi.c (in-process) and test_mpi_procs.c
 * (processes under mpirun). Rank threads never call Check's assertions:
 * a wrong result is returned as INTERNAL with a message naming it.
 */
#ifndef FSDP_TESTS_COLL_SWEEP_H
#define FSDP_TESTS_COLL_SWEEP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm_util.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "core/world.h"
#include "device/device.h"

#define SWEEP_SEED 0x5eedc0ffeeull

/* Element i of rank r's input for collective `tag`: a random sign and
 * mantissa, exponent in [-10, 10], so the order of a sum shows in its
 * rounding. */
static inline float sweep_gen(uint64_t tag, int r, size_t i)
{
    return ref_input_f32(SWEEP_SEED ^ (tag << 52) ^ ((uint64_t)r << 40) ^ i);
}

static inline void sweep_fill(void *buf, fsdp_dtype dt, uint64_t tag, int r, size_t first,
                              size_t n)
{
    ref_fill(buf, dt, sweep_gen, tag, r, first, n);
}

/* The reference of an element: op over the N ranks' element `at`. */
static inline void sweep_reduce(void *out, size_t i, fsdp_dtype dt, fsdp_reduce_op op,
                                uint64_t tag, int N, size_t at)
{
    float vals[FSDP_MAX_RANKS];
    for (int q = 0; q < N; q++) {
        float v = sweep_gen(tag, q, at);
        vals[q] = dt == FSDP_DTYPE_F32 ? v : fsdp_bf16_to_f32(fsdp_f32_to_bf16(v));
    }
    ref_reduce_store(out, i, dt, op, vals, N);
}

static inline uint64_t sweep_fold(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static inline fsdp_status sweep_check(int rank, const char *what, size_t numel, fsdp_dtype dt,
                                      const void *got, const void *want, size_t n)
{
    size_t es = fsdp_dtype_size(dt);
    if (!memcmp(got, want, n * es))
        return FSDP_STATUS_OK;
    size_t i = 0;
    while (!memcmp((const char *)got + i * es, (const char *)want + i * es, es))
        i++;
    float g = dt == FSDP_DTYPE_F32 ? ((const float *)got)[i]
                                   : fsdp_bf16_to_f32(((const fsdp_bf16 *)got)[i]);
    float e = dt == FSDP_DTYPE_F32 ? ((const float *)want)[i]
                                   : fsdp_bf16_to_f32(((const fsdp_bf16 *)want)[i]);
    return fsdp_error_set(FSDP_STATUS_INTERNAL,
                          "rank %d: %s of %zu x %s: element %zu is %.9g, the tree gives %.9g",
                          rank, what, numel, fsdp_dtype_name(dt), i, (double)g, (double)e);
}

/* Run the sweep on this rank's communicator; *digest folds every output. */
static inline fsdp_status coll_sweep_rank(fsdp_comm *c, const size_t *sizes, int n_sizes,
                                          uint64_t *digest)
{
    int N = c->n_ranks, r = c->rank;
    uint64_t h = 0xcbf29ce484222325ull, tag = 0;
    fsdp_status st = FSDP_STATUS_OK;
    size_t max = 0;
    for (int s = 0; s < n_sizes; s++)
        max = sizes[s] > max ? sizes[s] : max;
    size_t cap = (max ? max : 1) * (size_t)N * sizeof(float);
    char *a = malloc(cap), *b = malloc(cap), *want = malloc(cap);
    if (!a || !b || !want) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "rank %d: sweep buffers", r);
        goto out;
    }
    for (int s = 0; s < n_sizes && st == FSDP_STATUS_OK; s++) {
        size_t n = sizes[s];
        for (int d = 0; d < FSDP_DTYPE_COUNT && st == FSDP_STATUS_OK; d++) {
            fsdp_dtype dt = (fsdp_dtype)d;
            size_t es = fsdp_dtype_size(dt);
            /* all_gather */
            tag++;
            sweep_fill(a, dt, tag, r, 0, n);
            FSDP_CHECK(synced(c, fsdp_comm_all_gather(c, a, b, n, dt, NULL)));
            for (int q = 0; q < N; q++)
                sweep_fill(want + (size_t)q * n * es, dt, tag, q, 0, n);
            FSDP_CHECK(sweep_check(r, "all_gather", n, dt, b, want, (size_t)N * n));
            h = sweep_fold(h, b, (size_t)N * n * es);
            for (int o = 0; o < 2; o++) {
                fsdp_reduce_op op = (fsdp_reduce_op)o;
                /* reduce_scatter */
                tag++;
                sweep_fill(a, dt, tag, r, 0, (size_t)N * n);
                FSDP_CHECK(synced(c, fsdp_comm_reduce_scatter(c, a, b, n, dt, op, NULL)));
                for (size_t i = 0; i < n; i++)
                    sweep_reduce(want, i, dt, op, tag, N, (size_t)r * n + i);
                FSDP_CHECK(sweep_check(r, "reduce_scatter", n, dt, b, want, n));
                h = sweep_fold(h, b, n * es);
                /* all_reduce, then in place */
                for (int inplace = 0; inplace < 2; inplace++) {
                    tag++;
                    sweep_fill(a, dt, tag, r, 0, n);
                    void *out = inplace ? (void *)a : (void *)b;
                    FSDP_CHECK(synced(c, fsdp_comm_all_reduce(c, a, out, n, dt, op, NULL)));
                    for (size_t i = 0; i < n; i++)
                        sweep_reduce(want, i, dt, op, tag, N, i);
                    FSDP_CHECK(sweep_check(r, inplace ? "all_reduce in place" : "all_reduce", n,
                                           dt, out, want, n));
                    h = sweep_fold(h, out, n * es);
                }
            }
            /* broadcast from the first, the last and a middle rank */
            int roots[3] = {0, N - 1, N / 2};
            for (int k = 0; k < 3; k++) {
                tag++;
                if (r == roots[k])
                    sweep_fill(a, dt, tag, r, 0, n);
                else
                    memset(a, 0x5a, n * es);
                FSDP_CHECK(synced(c, fsdp_comm_broadcast(c, a, n, dt, roots[k], NULL)));
                sweep_fill(want, dt, tag, roots[k], 0, n);
                FSDP_CHECK(sweep_check(r, "broadcast", n, dt, a, want, n));
                h = sweep_fold(h, a, n * es);
            }
        }
        FSDP_CHECK(fsdp_comm_barrier(c));
    }
fail:
out:
    free(a);
    free(b);
    free(want);
    *digest = h;
    return st;
}

struct coll_sweep_host {
    const size_t *sizes;
    int n_sizes;
    uint64_t *digest; /* (n_ranks,) */
};

static inline fsdp_status coll_sweep_host_rank(fsdp_world *w, int rank, void *arg)
{
    struct coll_sweep_host *h = arg;
    fsdp_device dev;
    fsdp_comm c;
    FSDP_TRY(fsdp_device_init(&dev, FSDP_BACKEND_CPU, w, rank, rank, 0));
    fsdp_status st = fsdp_comm_host_init(&c, w, &dev, rank);
    if (st == FSDP_STATUS_OK) {
        st = coll_sweep_rank(&c, h->sizes, h->n_sizes, &h->digest[rank]);
        fsdp_comm_fini(&c);
    }
    fsdp_device_fini(&dev);
    return st;
}

/* The reference a job laid out across processes must match: the sweep's
 * digests (digest[0..n_ranks)) over the host transport with n_ranks cpu
 * ranks in this process. Called from the test's thread; returns the first
 * rank's failure. */
static inline fsdp_status coll_sweep_host_digests(int n_ranks, const size_t *sizes, int n_sizes,
                                                  uint64_t *digest)
{
    struct coll_sweep_host h = {.sizes = sizes, .n_sizes = n_sizes, .digest = digest};
    fsdp_world *w;
    FSDP_TRY(fsdp_world_init(&w, n_ranks));
    fsdp_status st = fsdp_world_launch(w, coll_sweep_host_rank, &h);
    fsdp_world_free(w);
    return st;
}

#endif /* FSDP_TESTS_COLL_SWEEP_H */
