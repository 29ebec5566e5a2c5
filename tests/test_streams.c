/*
 * test_streams.c - the cpu backend's async streams (device/cpu_stream.c)
 * and what they find in the engine.
 *
 * The device: host calls return before the work runs; a stream runs its
 * work in order; events order two streams and the host (and without the
 * wait the streams really do run side by side); a failure of queued work
 * stays with the device, later work is skipped and nothing hangs; copies
 * treat pageable and pinned host memory as CUDA does; a freed block is
 * reused only after its last users' work.
 *
 * The engine: training under async streams with random delays gives the
 * inline run's losses, norms and parameters bit for bit over a matrix of
 * settings. Before the engine's fixes, the rows with accumulation failed
 * (the counter's adds read a slot before its reduce-scatter had written
 * it) and so did offload + bf16 (the host cast of the master before the
 * copy into it had run). The trace of an async run shows the comm
 * stream's gathers overlapping the compute stream's work.
 */
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/json.h"
#include "device/cpu.h"
#include "device/device.h"
#include "testutil.h"
#include "train/train.h"
#include "train_util.h"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A cpu device in async mode (jitter: delay seed, 0 none), rank 0, no world. */
static void dev_async(fsdp_device *d, uint64_t jitter)
{
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_ASYNC, jitter);
    ck_assert_int_eq(fsdp_device_init(d, FSDP_BACKEND_CPU, NULL, 0, 0, 0), FSDP_STATUS_OK);
    ck_assert(fsdp_device_cpu_async(d));
    ck_assert_ptr_nonnull(d->compute);
    ck_assert_ptr_nonnull(d->comm);
    ck_assert_ptr_nonnull(d->copy);
}

static void sync_ok(fsdp_device *d, fsdp_stream_t s)
{
    ck_assert_int_eq(fsdp_device_stream_sync(d, s), FSDP_STATUS_OK);
}

/* ---- host functions the tests queue ------------------------------------------ */

/* Waits up to 5 s for *flag, then says whether it saw it. */
struct gate {
    atomic_int *flag;
    atomic_int *seen;
};

static fsdp_status run_gate(void *p)
{
    struct gate *g = p;
    for (int k = 0; k < 5000 && !atomic_load(g->flag); k++)
        sleep_ms(1);
    atomic_store(g->seen, atomic_load(g->flag));
    return FSDP_STATUS_OK;
}

/* arr[(*n)++] = i (the stream's own data: no atomics). */
struct append {
    int *arr, *n, i;
};

static fsdp_status run_append(void *p)
{
    struct append *a = p;
    a->arr[(*a->n)++] = a->i;
    return FSDP_STATUS_OK;
}

/* After `ms` ms, *dst = value. */
struct store {
    atomic_int *dst;
    int value, ms;
};

static fsdp_status run_store(void *p)
{
    struct store *a = p;
    sleep_ms(a->ms);
    atomic_store(a->dst, a->value);
    return FSDP_STATUS_OK;
}

/* *out = *src. */
struct load {
    atomic_int *src;
    int *out;
};

static fsdp_status run_load(void *p)
{
    struct load *a = p;
    *a->out = atomic_load(a->src);
    return FSDP_STATUS_OK;
}

/* After `ms` ms, the first n floats of buf = value (plain memory: the
 * streams' ordering must make it safe). */
struct fill {
    float *buf;
    size_t n;
    float value;
    int ms;
};

static fsdp_status run_fill(void *p)
{
    struct fill *a = p;
    sleep_ms(a->ms);
    for (size_t i = 0; i < a->n; i++)
        a->buf[i] = a->value;
    return FSDP_STATUS_OK;
}

static fsdp_status run_failing(void *p)
{
    (void)p;
    return fsdp_error_set(FSDP_STATUS_IO, "the disk is on fire");
}

static fsdp_status run_count(void *p)
{
    atomic_fetch_add(*(atomic_int **)p, 1);
    return FSDP_STATUS_OK;
}

/* ---- the device ---------------------------------------------------------------- */

/* A launch returns before its work runs: the queued function waits for a
 * flag that the host sets only after the launch has returned (run inline,
 * it would wait 5 s and see nothing). */
START_TEST(test_launch_returns_first)
{
    fsdp_device d;
    dev_async(&d, 0);
    atomic_int flag = 0, seen = 0;
    struct gate g = {&flag, &seen};
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.compute, run_gate, &g, sizeof g, "gate"),
                     FSDP_STATUS_OK);
    atomic_store(&flag, 1);
    sync_ok(&d, d.compute);
    ck_assert_int_eq(atomic_load(&seen), 1);
    fsdp_device_fini(&d);
}
END_TEST

/* 2000 items on one stream, with random delays, run in the order queued. */
START_TEST(test_stream_in_order)
{
    enum { N = 2000 };
    fsdp_device d;
    dev_async(&d, 42);
    int *arr = calloc(N, sizeof *arr), n = 0;
    ck_assert_ptr_nonnull(arr);
    for (int i = 0; i < N; i++) {
        struct append a = {arr, &n, i};
        ck_assert_int_eq(fsdp_device_launch_host(&d, d.comm, run_append, &a, sizeof a, "append"),
                         FSDP_STATUS_OK);
    }
    sync_ok(&d, d.comm);
    ck_assert_int_eq(n, N);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(arr[i], i);
    free(arr);
    fsdp_device_fini(&d);
}
END_TEST

/* The comm stream writes x after a delay; the compute stream reads it.
 * With an event wait the read sees every write; without, the streams run
 * side by side and some read comes first (which is what lets a missing
 * wait show in the engine). The host's event sync waits too. */
START_TEST(test_events_order_streams)
{
    enum { ROUNDS = 12 };
    fsdp_device d;
    dev_async(&d, 0);
    fsdp_event_t e;
    ck_assert_int_eq(fsdp_device_event_create(&d, &e), FSDP_STATUS_OK);
    atomic_int x = 0;
    int with[ROUNDS], without[ROUNDS];
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < ROUNDS; i++) {
            struct store w = {&x, pass * ROUNDS + i + 1, 3};
            ck_assert_int_eq(fsdp_device_launch_host(&d, d.comm, run_store, &w, sizeof w, "w"),
                             FSDP_STATUS_OK);
            ck_assert_int_eq(fsdp_device_event_record(&d, e, d.comm), FSDP_STATUS_OK);
            if (pass == 0)
                ck_assert_int_eq(fsdp_device_stream_wait_event(&d, d.compute, e), FSDP_STATUS_OK);
            struct load r = {&x, pass == 0 ? &with[i] : &without[i]};
            ck_assert_int_eq(fsdp_device_launch_host(&d, d.compute, run_load, &r, sizeof r, "r"),
                             FSDP_STATUS_OK);
            sync_ok(&d, d.compute);
            sync_ok(&d, d.comm);
        }
    int stale = 0;
    for (int i = 0; i < ROUNDS; i++) {
        ck_assert_int_eq(with[i], i + 1);
        stale += without[i] != ROUNDS + i + 1;
    }
    ck_assert_msg(stale > 0, "without a wait every read still saw the write: the streams did "
                             "not run side by side");
    /* the host waits for an event */
    struct store w = {&x, 99, 20};
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.copy, run_store, &w, sizeof w, "w"),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_event_record(&d, e, d.copy), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_event_sync(&d, e), FSDP_STATUS_OK);
    ck_assert_int_eq(atomic_load(&x), 99);
    fsdp_device_event_destroy(&d, e);
    fsdp_device_fini(&d);
}
END_TEST

/* Closing a device whose streams still hold work that waits across them:
 * the copy stream is busy for 50 ms, then waits for an event of the compute
 * stream, which is closed first. fini runs everything queued, and no wait
 * reads a stream that is gone (make asan: heap-use-after-free in wait_for
 * on the old code). */
START_TEST(test_fini_runs_cross_stream_waits)
{
    for (int round = 0; round < 20; round++) {
        fsdp_device d;
        dev_async(&d, 0);
        fsdp_event_t e;
        ck_assert_int_eq(fsdp_device_event_create(&d, &e), FSDP_STATUS_OK);
        atomic_int x = 0, n = 0;
        atomic_int *pn = &n;
        struct store slow = {&x, 1, 50};
        ck_assert_int_eq(fsdp_device_launch_host(&d, d.copy, run_store, &slow, sizeof slow, "s"),
                         FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_launch_host(&d, d.compute, run_count, &pn, sizeof pn, "c"),
                         FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_event_record(&d, e, d.compute), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_wait_event(&d, d.copy, e), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_stream_wait_event(&d, d.comm, e), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_device_launch_host(&d, d.copy, run_count, &pn, sizeof pn, "c"),
                         FSDP_STATUS_OK);
        fsdp_device_event_destroy(&d, e);
        fsdp_device_fini(&d); /* no sync before it */
        ck_assert_int_eq(atomic_load(&n), 2);
        ck_assert_int_eq(atomic_load(&x), 1);
    }
}
END_TEST

/* A failure stays with the device: later work on every stream is skipped
 * (waits still complete: nothing hangs), and each sync returns it with a
 * message that says where it ran. */
START_TEST(test_failure_is_sticky)
{
    fsdp_device d;
    dev_async(&d, 3);
    atomic_int count = 0;
    atomic_int *cp = &count;
    fsdp_event_t e;
    ck_assert_int_eq(fsdp_device_event_create(&d, &e), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.compute, run_failing, NULL, 0, "unit 'h.1' op"),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.compute, run_count, &cp, sizeof cp, "count"),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_event_record(&d, e, d.compute), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_wait_event(&d, d.comm, e), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.comm, run_count, &cp, sizeof cp, "count"),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&d, d.comm), FSDP_STATUS_IO);
    ck_assert_msg(strstr(fsdp_error_msg(), "the disk is on fire") &&
                      strstr(fsdp_error_msg(), "rank 0's compute stream") &&
                      strstr(fsdp_error_msg(), "unit 'h.1' op"),
                  "message: %s", fsdp_error_msg());
    ck_assert_int_eq(fsdp_device_stream_sync(&d, d.compute), FSDP_STATUS_IO);
    ck_assert_int_eq(fsdp_device_event_sync(&d, e), FSDP_STATUS_IO);
    ck_assert_int_eq(atomic_load(&count), 0);
    fsdp_error_clear();
    fsdp_device_event_destroy(&d, e);
    fsdp_device_fini(&d);
}
END_TEST

/* Copies behave as cudaMemcpyAsync through the device layer: a pageable
 * source is read before the call returns, a pageable destination is
 * written when it returns, pinned memory is read when the stream gets
 * there. Each copy is queued behind slow work. */
START_TEST(test_copies_pageable_and_pinned)
{
    enum { N = 256 };
    fsdp_device d;
    dev_async(&d, 0);
    float *dev = NULL, *pinned = NULL, page[N], out[N];
    ck_assert_int_eq(fsdp_device_alloc(&d, N * sizeof(float), FSDP_MEM_OTHER, "t", (void **)&dev),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_host_alloc(&d, N * sizeof(float), FSDP_MEM_OTHER, "t",
                                            (void **)&pinned),
                     FSDP_STATUS_OK);
    struct fill slow = {dev, N, -1.0f, 30};
    /* pageable -> device: the source as it was at the call */
    for (int i = 0; i < N; i++)
        page[i] = 1.0f;
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.copy, run_fill, &slow, sizeof slow, "slow"),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_memcpy(&d, dev, page, sizeof page, d.copy), FSDP_STATUS_OK);
    for (int i = 0; i < N; i++)
        page[i] = 2.0f;
    sync_ok(&d, d.copy);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(dev[i], 1.0f);
    /* device -> pageable: written when the call returns, after the slow work */
    slow.value = 3.0f;
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.copy, run_fill, &slow, sizeof slow, "slow"),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_memcpy(&d, out, dev, sizeof out, d.copy), FSDP_STATUS_OK);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(out[i], 3.0f);
    /* pinned -> device: read when the stream reaches the copy */
    for (int i = 0; i < N; i++)
        pinned[i] = 5.0f;
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.copy, run_fill, &slow, sizeof slow, "slow"),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_memcpy(&d, dev, pinned, N * sizeof(float), d.copy),
                     FSDP_STATUS_OK);
    sync_ok(&d, d.copy);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(dev[i], 5.0f);
    fsdp_device_host_free(&d, pinned);
    fsdp_device_free(&d, dev);
    fsdp_device_fini(&d);
}
END_TEST

/* A block freed while the comm stream's slow work still writes it goes
 * to the next allocation of its size, but the compute stream's use of
 * the new allocation waits for that work (the block cache's fences): the
 * compute stream's value is the one that stays. */
START_TEST(test_free_is_stream_ordered)
{
    enum { N = 1024 };
    fsdp_device d;
    dev_async(&d, 0);
    float *a = NULL, *b = NULL;
    ck_assert_int_eq(fsdp_device_alloc(&d, N * sizeof(float), FSDP_MEM_OTHER, "a", (void **)&a),
                     FSDP_STATUS_OK);
    struct fill late = {a, N, 1.0f, 40};
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.comm, run_fill, &late, sizeof late, "late"),
                     FSDP_STATUS_OK);
    fsdp_device_free(&d, a);
    ck_assert_int_eq(fsdp_device_alloc(&d, N * sizeof(float), FSDP_MEM_OTHER, "b", (void **)&b),
                     FSDP_STATUS_OK);
    ck_assert_ptr_eq(a, b); /* the cache reuses the block at once, in stream order */
    struct fill now = {b, N, 2.0f, 0};
    ck_assert_int_eq(fsdp_device_launch_host(&d, d.compute, run_fill, &now, sizeof now, "now"),
                     FSDP_STATUS_OK);
    sync_ok(&d, d.compute);
    sync_ok(&d, d.comm);
    for (int i = 0; i < N; i++)
        ck_assert_float_eq(b[i], 2.0f);
    ck_assert_uint_eq(d.mem.in_use_bytes, N * sizeof(float)); /* counted as asked, as on cpu */
    fsdp_device_free(&d, b);
    fsdp_device_fini(&d);
}
END_TEST

/* The setting: an explicit mode wins, DEFAULT reads the environment (the
 * suite may run under FSDP_CPU_STREAMS=async). */
START_TEST(test_mode_setting)
{
    fsdp_cpu_streams m;
    uint64_t seed;
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_ASYNC, 17);
    ck_assert_int_eq(fsdp_device_cpu_get_streams(&m, &seed), FSDP_STATUS_OK);
    ck_assert_int_eq(m, FSDP_CPU_STREAMS_ASYNC);
    ck_assert_uint_eq(seed, 17);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_INLINE, 0);
    ck_assert_int_eq(fsdp_device_cpu_get_streams(&m, &seed), FSDP_STATUS_OK);
    ck_assert_int_eq(m, FSDP_CPU_STREAMS_INLINE);
    fsdp_device d;
    ck_assert_int_eq(fsdp_device_init(&d, FSDP_BACKEND_CPU, NULL, 0, 0, 0), FSDP_STATUS_OK);
    ck_assert(!fsdp_device_cpu_async(&d));
    ck_assert_ptr_null(d.compute); /* inline: no streams */
    fsdp_device_fini(&d);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_DEFAULT, 0);
    const char *env = getenv("FSDP_CPU_STREAMS");
    ck_assert_int_eq(fsdp_device_cpu_get_streams(&m, &seed), FSDP_STATUS_OK);
    ck_assert_int_eq(m, env && !strcmp(env, "async") ? FSDP_CPU_STREAMS_ASYNC
                                                     : FSDP_CPU_STREAMS_INLINE);
}
END_TEST

/* The command: --cpu-streams async trains and says so; bad values of the
 * flag or of the variables are usage errors naming them. */
START_TEST(test_cli_flag)
{
    static const fsdp_test_cli_case cases[] = {
        {"train --cpu-streams async --steps 2 --eval 0", 0, "cpu streams: async"},
        {"train --cpu-streams sideways --steps 1", 2, "--cpu-streams"},
        {"train --cpu-streams async --backend meta --steps 1", 2, "cpu backend's streams"},
        {"eval --cpu-streams sideways --model x", 2, "--cpu-streams"},
    };
    fsdp_test_cli_cases(cases, FSDP_TEST_LEN(cases));
    /* the environment's settings, checked before anything runs */
    static const struct {
        const char *var, *value, *args;
        int rc;
        const char *expect;
    } env_cases[] = {
        {"FSDP_CPU_STREAMS", "sideways", "train --steps 1", 2, "FSDP_CPU_STREAMS='sideways'"},
        {"FSDP_CPU_STREAM_JITTER", "x", "train --steps 1", 2, "FSDP_CPU_STREAM_JITTER='x'"},
        {"FSDP_CPU_STREAM_JITTER", "9", "train --cpu-streams async --steps 1 --eval 0", 0,
         "random delays from seed 9"},
        {"FSDP_CPU_STREAMS", "async", "train --steps 1 --eval 0", 0, "cpu streams: async"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(env_cases); i++) {
        char out[8192];
        ck_assert_int_eq(setenv(env_cases[i].var, env_cases[i].value, 1), 0);
        int rc = fsdp_test_cli(out, sizeof out, "%s", env_cases[i].args);
        unsetenv(env_cases[i].var);
        ck_assert_msg(rc == env_cases[i].rc && strstr(out, env_cases[i].expect),
                      "%s=%s fsdp %s: exit %d (want %d), output:\n%s", env_cases[i].var,
                      env_cases[i].value, env_cases[i].args, rc, env_cases[i].rc, out);
    }
}
END_TEST

/* ---- the engine --------------------------------------------------------------- */

/* Settings whose async run must equal the inline run bit for bit. */
static const struct async_row {
    const char *what, *model;
    int devices, accum, nodes;
    fsdp_shard_strategy shard;
    bool offload, bf16, prefetch;
    fsdp_recompute recompute;
    float clip;
} async_rows[] = {
    {"2 devices x 2 micro-steps", "tiny", 2, 2, 0, FSDP_SHARD_FULL, false, false, true,
     FSDP_RECOMPUTE_NONE, 1.0f},
    {"4 devices x 2 micro-steps, offload", "tiny", 4, 2, 0, FSDP_SHARD_FULL, true, false, true,
     FSDP_RECOMPUTE_NONE, 1.0f},
    {"shard none, 2 micro-steps", "tiny", 2, 2, 0, FSDP_SHARD_NONE, false, false, true,
     FSDP_RECOMPUTE_NONE, 1.0f},
    {"offload, bf16", "tiny", 2, 1, 0, FSDP_SHARD_FULL, true, true, true, FSDP_RECOMPUTE_NONE,
     1.0f},
    {"hybrid 2 x 2, 2 micro-steps", "tiny", 4, 2, 2, FSDP_SHARD_HYBRID, false, false, true,
     FSDP_RECOMPUTE_NONE, 1.0f},
    {"grad-op, no prefetch, 4 micro-steps", "tiny", 2, 4, 0, FSDP_SHARD_GRAD_OP, false, false,
     false, FSDP_RECOMPUTE_NONE, 1.0f},
    {"offload without clipping, 4 micro-steps", "tiny", 1, 4, 0, FSDP_SHARD_FULL, true, false,
     true, FSDP_RECOMPUTE_NONE, 0.0f},
    {"llama, offload, bf16, recompute block, 2 micro-steps", "llama-tiny", 2, 2, 0,
     FSDP_SHARD_FULL, true, true, true, FSDP_RECOMPUTE_BLOCK, 1.0f},
    {"8 devices", "tiny", 8, 1, 0, FSDP_SHARD_FULL, false, false, true, FSDP_RECOMPUTE_NONE,
     1.0f},
};

/* The same with --accum flat (engine/accum.h): its scratch is reused by
 * each unit's reduction in stream order. */
static const struct async_row flat_rows[] = {
    {"accum flat, grad-op, 4 micro-steps", "tiny", 2, 4, 0, FSDP_SHARD_GRAD_OP, false, false,
     true, FSDP_RECOMPUTE_NONE, 1.0f},
    {"accum flat, llama, offload, bf16, recompute block, 4 micro-steps", "llama-tiny", 2, 4, 0,
     FSDP_SHARD_FULL, true, true, true, FSDP_RECOMPUTE_BLOCK, 0.0f},
    {"accum flat, hybrid 2 x 2, 2 micro-steps", "tiny", 4, 2, 2, FSDP_SHARD_HYBRID, false, false,
     true, FSDP_RECOMPUTE_NONE, 1.0f},
};

static void row_config(fsdp_train_config *c, const struct async_row *row)
{
    bool flat = row >= flat_rows && row < flat_rows + FSDP_TEST_LEN(flat_rows);
    train_config_tiny(c, row->devices, row->accum);
    c->model = row->model;
    c->eng.n_nodes = row->nodes; /* of devices / nodes ranks each */
    c->eng.shard = row->shard;
    c->eng.offload = row->offload;
    c->eng.compute_dtype = row->bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    c->eng.prefetch = row->prefetch;
    c->eng.recompute = row->recompute;
    c->eng.clip = row->clip;
    c->eng.accum = flat ? FSDP_ACCUM_FLAT : FSDP_ACCUM_TREE;
}

/* Row i's async runs (two jitter seeds) against its inline run. */
static void expect_async_matches_inline(const struct async_row *row, int i)
{
    fsdp_train_config c;
    fsdp_train_result ref, r;
    row_config(&c, row);
    c.eng.cpu_streams = FSDP_CPU_STREAMS_INLINE;
    run_ok_as(&c, &ref, row->what);
    ck_assert_msg(ref.losses[2] < ref.losses[0], "%s does not train", row->what);
    for (uint64_t seed = 1; seed <= 2; seed++) {
        row_config(&c, row);
        c.eng.cpu_streams = FSDP_CPU_STREAMS_ASYNC;
        c.eng.cpu_stream_jitter = seed + 100 * (uint64_t)i;
        char what[160];
        snprintf(what, sizeof what, "%s: async (jitter seed %llu) vs inline", row->what,
                 (unsigned long long)c.eng.cpu_stream_jitter);
        run_ok_as(&c, &r, what);
        expect_identical_runs(&ref, &r, row->model, what);
        fsdp_train_result_free(&r);
    }
    fsdp_train_result_free(&ref);
}

START_TEST(test_async_matches_inline) { expect_async_matches_inline(&async_rows[_i], _i); }
END_TEST

START_TEST(test_async_matches_inline_flat)
{
    expect_async_matches_inline(&flat_rows[_i], 50 + _i);
}
END_TEST

/* Events of one rank and track in a trace: [t0, t1) in microseconds. */
typedef struct span {
    double t0, t1;
} span;

/* The duration events of rank `pid` on track `cat`, named `name` and of
 * unit `unit` (NULL: any), in file order. */
static int trace_spans(const fsdp_json *events, int pid, const char *cat, const char *name,
                       const char *unit, span *out, int max)
{
    int n = 0;
    for (const fsdp_json *ev = events->child; ev && n < max; ev = ev->next) {
        const fsdp_json *ph = fsdp_json_get(ev, "ph"), *p = fsdp_json_get(ev, "pid"),
                        *c = fsdp_json_get(ev, "cat"), *nm = fsdp_json_get(ev, "name"),
                        *args = fsdp_json_get(ev, "args");
        const fsdp_json *u = args ? fsdp_json_get(args, "unit") : NULL;
        if (!ph || strcmp(ph->str, "X") || !p || (int)p->number != pid || !c ||
            strcmp(c->str, cat) || !nm || (name && strcmp(nm->str, name)) ||
            (unit && (!u || strcmp(u->str, unit))))
            continue;
        double ts = fsdp_json_get(ev, "ts")->number, dur = fsdp_json_get(ev, "dur")->number;
        out[n++] = (span){ts, ts + dur};
    }
    return n;
}

/* The earliest of n spans. */
static span earliest(const span *s, int n)
{
    span e = s[0];
    for (int i = 1; i < n; i++)
        if (s[i].t0 < e.t0)
            e = s[i];
    return e;
}

/* How many of a's spans overlap one of b's in time. */
static int overlaps(const span *a, int n_a, const span *b, int n_b)
{
    int n = 0;
    for (int i = 0; i < n_a; i++)
        for (int k = 0; k < n_b; k++)
            if (a[i].t0 < b[k].t1 && b[k].t0 < a[i].t1) {
                n++;
                break;
            }
    return n;
}

/* A traced async run of a 4-block GPT-2 on 2 devices, its events. */
static fsdp_json *traced_run(const char *name, bool offload)
{
    char path[512];
    fsdp_test_path(path, sizeof path, name);
    fsdp_train_config c;
    fsdp_train_result r;
    train_config_tiny(&c, 2, 1);
    c.model = "custom:layers=4,heads=4,channels=128,vocab=256,context=64";
    c.eng.batch = 4;
    c.eng.seq = 64;
    c.eng.cpu_streams = FSDP_CPU_STREAMS_ASYNC;
    c.eng.offload = offload;
    c.eng.clip = offload ? 0.0f : c.eng.clip; /* updates may start in backward */
    c.steps = 2;
    c.keep_params = false;
    c.trace_path = path;
    run_ok(&c, &r);
    fsdp_train_result_free(&r);
    fsdp_json *t = NULL;
    ck_assert_int_eq(fsdp_json_parse_file(path, &t), FSDP_STATUS_OK);
    return t;
}

/* With async streams the trace's tracks hold what each stream ran when:
 * with prefetch a unit's gather (comm) runs while the compute stream
 * works; with offload the backward goes on while the gradients' copies to
 * the host (copy) wait for their reduce-scatters, and the host step of
 * the last block starts before the backward of the first block ends:
 * nothing waits on the host in backward. */
START_TEST(test_trace_shows_overlap)
{
    enum { MAX = 1024 };
    span *comm = calloc(MAX, sizeof *comm), *comp = calloc(MAX, sizeof *comp);
    span *copy = calloc(MAX, sizeof *copy), *upd = calloc(MAX, sizeof *upd);
    fsdp_json *t = traced_run("trace.json", false);
    const fsdp_json *events = fsdp_json_get(t, "traceEvents");
    ck_assert_ptr_nonnull(events);
    int n_comm = trace_spans(events, 0, "comm", "all_gather", NULL, comm, MAX);
    int n_comp = trace_spans(events, 0, "compute", NULL, NULL, comp, MAX);
    ck_assert_int_gt(n_comm, 0);
    ck_assert_int_gt(n_comp, 0);
    ck_assert_msg(overlaps(comm, n_comm, comp, n_comp) > 0,
                  "no all_gather of %d overlapped any of %d compute events", n_comm, n_comp);
    fsdp_json_free(t);

    t = traced_run("trace_offload.json", true);
    events = fsdp_json_get(t, "traceEvents");
    /* step 1: the backward of a block begins before the gradient copy of
     * the block after it does (the copy waits for the reduce-scatter, on
     * the device); a host that waited for each copy inside backward would
     * queue the next backward only once the copy had ended */
    int ahead = 0;
    for (int k = 3; k >= 1; k--) {
        char unit[8], prev[8];
        snprintf(unit, sizeof unit, "h.%d", k);
        snprintf(prev, sizeof prev, "h.%d", k - 1);
        int n_copy = trace_spans(events, 0, "copy", "grad d2h", unit, copy, MAX);
        int n_comp = trace_spans(events, 0, "compute", "backward", prev, comp, MAX);
        ck_assert_int_gt(n_copy, 0);
        ck_assert_int_gt(n_comp, 0);
        ahead += earliest(comp, n_comp).t0 < earliest(copy, n_copy).t0;
    }
    ck_assert_msg(ahead > 0, "every gradient copy began before the next block's backward: the "
                             "backward waited for the copies");
    /* step 1: the host update of h.3, whose gradient is final first, starts
     * before the backward of h.0 ends */
    int n_upd = trace_spans(events, 0, "cpu optimizer", NULL, "h.3", upd, MAX);
    int n_b0 = trace_spans(events, 0, "compute", "backward", "h.0", comp, MAX);
    ck_assert_int_gt(n_upd, 0);
    ck_assert_int_gt(n_b0, 0);
    span u3 = earliest(upd, n_upd), b0 = earliest(comp, n_b0);
    ck_assert_msg(u3.t0 < b0.t1, "the host update of h.3 started at %.1f us, after the backward "
                  "of h.0 ended (%.1f us)", u3.t0, b0.t1);
    fsdp_json_free(t);
    free(comm);
    free(comp);
    free(copy);
    free(upd);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"device", 60,
         FSDP_TESTS(test_launch_returns_first, test_stream_in_order, test_events_order_streams,
                    test_failure_is_sticky, test_copies_pageable_and_pinned,
                    test_free_is_stream_ordered, test_mode_setting,
                    test_fini_runs_cross_stream_waits)},
        {"cli", 120, FSDP_TESTS(test_cli_flag)},
        {"engine", 600, .tmpdir = true,
         FSDP_TESTS(FSDP_TEST_LOOP(test_async_matches_inline, (int)FSDP_TEST_LEN(async_rows)),
                    FSDP_TEST_LOOP(test_async_matches_inline_flat, (int)FSDP_TEST_LEN(flat_rows)),
                    test_trace_shows_overlap)},
    };
    return fsdp_test_main("streams", tcases, FSDP_TEST_LEN(tcases));
}
