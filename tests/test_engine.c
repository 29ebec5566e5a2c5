/*
 * test_engine.c - the FSDP engine through the trainer: the determinism
 * contract (bit-identical losses and parameters for 1, 2, 4, 8 devices,
 * every strategy, prefetch on/off, offload), sharded vs unsharded training,
 * communication bytes and memory against their formulas, and the error
 * paths (OOM under a cap, bad configurations).
 */
#include <check.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>

#include "device/cpu.h"
#include "fsdp/shardmap.h"
#include "models/gpt2.h"
#include "train/train.h"

/* A tiny run. The global batch is 8 micro-batches of one sequence of 16
 * tokens for every device count: N devices run 8/N micro-steps each. The
 * determinism contract holds for the same micro-batches, so the micro-batch
 * size stays fixed. */
static void tiny_config(fsdp_train_config *c, int devices, int accum)
{
    fsdp_train_config_default(c);
    c->eng.backend = FSDP_BACKEND_CPU;
    c->eng.n_ranks = devices;
    c->eng.grad_accum = accum ? accum : 8 / devices;
    c->eng.batch = 8 / (devices * c->eng.grad_accum);
    c->eng.seq = 16;
    c->eng.deterministic = true;
    c->model = "tiny";
    c->data = "synthetic";
    c->steps = 3;
    c->warmup = 1;
    c->lr = 1e-2f;
    c->eval_problems = 0;
    c->keep_params = true;
    c->out = NULL;
}

static void run_ok(const fsdp_train_config *c, fsdp_train_result *r)
{
    fsdp_status st = fsdp_train_run(c, r);
    ck_assert_msg(st == FSDP_STATUS_OK, "train failed: %s", fsdp_error_msg());
}

/* Same losses and same final parameters, bit for bit. */
static void assert_identical(const fsdp_train_result *a, const fsdp_train_result *b,
                             const char *what)
{
    ck_assert_int_eq(a->steps, b->steps);
    for (int s = 0; s < a->steps; s++) {
        char x[32], y[32];
        snprintf(x, sizeof x, "%.9g", a->losses[s]);
        snprintf(y, sizeof y, "%.9g", b->losses[s]);
        ck_assert_msg(!strcmp(x, y), "%s: step %d loss %s vs %s", what, s + 1, x, y);
        ck_assert_msg(!memcmp(&a->grad_norms[s], &b->grad_norms[s], sizeof(float)),
                      "%s: step %d grad norm %.9g vs %.9g", what, s + 1, a->grad_norms[s],
                      b->grad_norms[s]);
    }
    fsdp_gpt2_config gc;
    fsdp_model m;
    ck_assert_int_eq(fsdp_gpt2_config_parse("tiny", &gc), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_gpt2_init(&m, &gc), FSDP_STATUS_OK);
    ck_assert_int_eq(a->n_units, m.n_units);
    for (int u = 0; u < m.n_units; u++) {
        ck_assert_ptr_nonnull(a->params[u]);
        ck_assert_ptr_nonnull(b->params[u]);
        ck_assert_msg(!memcmp(a->params[u], b->params[u], m.units[u].numel * sizeof(float)),
                      "%s: final parameters of unit %s differ", what, m.units[u].name);
    }
    fsdp_model_free(&m);
}

START_TEST(test_determinism_matrix)
{
    fsdp_train_config c;
    fsdp_train_result ref;
    tiny_config(&c, 1, 0);
    run_ok(&c, &ref);
    ck_assert(ref.losses[2] < ref.losses[0]); /* it trains */
    static const int devs[] = {1, 2, 4, 8};
    for (int d = 0; d < 4; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int p = 0; p < 2; p++) {
                if (d == 0 && s == 0 && p == 1)
                    continue; /* the reference itself */
                tiny_config(&c, devs[d], 0);
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.prefetch = p == 1;
                fsdp_train_result r;
                run_ok(&c, &r);
                char what[96];
                snprintf(what, sizeof what, "%d devices, shard %s, prefetch %s", devs[d],
                         fsdp_shard_strategy_name((fsdp_shard_strategy)s), p ? "on" : "off");
                assert_identical(&ref, &r, what);
                fsdp_train_result_free(&r);
            }
    fsdp_train_result_free(&ref);
}
END_TEST

/* Two micro-steps of batch 1 on 2 devices equal one micro-step of batch 1
 * on 4: the accumulation tree over micro-steps is the rank tree's twin. */
START_TEST(test_grad_accum_matches)
{
    fsdp_train_config c;
    fsdp_train_result a, b;
    tiny_config(&c, 4, 1);
    c.eng.batch = 1;
    run_ok(&c, &a);
    tiny_config(&c, 2, 2);
    c.eng.batch = 1;
    run_ok(&c, &b);
    assert_identical(&a, &b, "2 devices x 2 micro-steps vs 4 devices");
    fsdp_train_result_free(&b);
    /* three micro-steps (not a power of two) still train and stay finite */
    tiny_config(&c, 1, 3);
    c.eng.batch = 2;
    run_ok(&c, &b);
    ck_assert(isfinite(b.losses[2]) && b.losses[2] < b.losses[0]);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
}
END_TEST

/* 10 steps of FULL_SHARD on 4 devices equal NO_SHARD on 1 device. */
START_TEST(test_sharded_matches_unsharded)
{
    fsdp_train_config c;
    fsdp_train_result a, b;
    tiny_config(&c, 4, 0);
    c.steps = 10;
    c.eng.shard = FSDP_SHARD_FULL;
    run_ok(&c, &a);
    tiny_config(&c, 1, 0);
    c.steps = 10;
    c.eng.shard = FSDP_SHARD_NONE;
    run_ok(&c, &b);
    assert_identical(&a, &b, "full x4 vs none x1");
    ck_assert(a.losses[9] < a.losses[0] - 0.05f);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
}
END_TEST

START_TEST(test_offload_identical)
{
    static const int devs[] = {1, 2, 4};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < 2; s++)
            for (int clip = 0; clip < 2; clip++) {
                fsdp_train_config c;
                fsdp_train_result a, b;
                tiny_config(&c, devs[d], 0);
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.clip = clip ? 0.5f : 0.0f;
                run_ok(&c, &a);
                c.eng.offload = true;
                run_ok(&c, &b);
                char what[96];
                snprintf(what, sizeof what, "offload, %d devices, shard %s, clip %s", devs[d],
                         fsdp_shard_strategy_name((fsdp_shard_strategy)s), clip ? "on" : "off");
                assert_identical(&a, &b, what);
                /* master, m, v and the gradient shard moved to pinned host
                 * memory (16 bytes per shard element); the device keeps an
                 * fp32 parameter shard (4) and gradient buffers in flight,
                 * at most one unit's accumulation slot at a time */
                fsdp_gpt2_config gc;
                fsdp_model m;
                ck_assert_int_eq(fsdp_gpt2_config_parse("tiny", &gc), FSDP_STATUS_OK);
                ck_assert_int_eq(fsdp_gpt2_init(&m, &gc), FSDP_STATUS_OK);
                fsdp_shardmap sm;
                ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, devs[d], c.eng.shard),
                                 FSDP_STATUS_OK);
                size_t shard = 0, max_unit = 0;
                for (int u = 0; u < sm.n_units; u++) {
                    shard += sm.units[u].shard_numel;
                    if (sm.units[u].shard_numel > max_unit)
                        max_unit = sm.units[u].shard_numel;
                }
                ck_assert_uint_eq(b.stats[0].host_peak_bytes - a.stats[0].host_peak_bytes,
                                  16 * shard); /* both hold the model's pinned loss copy */
                size_t saved = a.stats[0].peak_bytes - b.stats[0].peak_bytes;
                ck_assert_msg(saved <= 12 * shard && saved + 4 * max_unit >= 12 * shard,
                              "%s: offload saved %zu device bytes; optimizer state is %zu",
                              what, saved, 12 * shard);
                fsdp_shardmap_free(&sm);
                fsdp_model_free(&m);
                fsdp_train_result_free(&a);
                fsdp_train_result_free(&b);
            }
}
END_TEST

START_TEST(test_bf16_trains_close)
{
    fsdp_train_config c;
    fsdp_train_result a, b, d;
    tiny_config(&c, 2, 0);
    c.steps = 5;
    run_ok(&c, &a);
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    run_ok(&c, &b);
    for (int s = 0; s < 5; s++)
        ck_assert_msg(fabsf(a.losses[s] - b.losses[s]) < 0.02f * a.losses[s],
                      "bf16 loss %g vs fp32 %g at step %d", b.losses[s], a.losses[s], s + 1);
    /* bf16 is also deterministic across device counts */
    tiny_config(&c, 4, 0);
    c.steps = 5;
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    run_ok(&c, &d);
    assert_identical(&b, &d, "bf16 2 vs 4 devices");
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
    fsdp_train_result_free(&d);
}
END_TEST

/* Bytes received per rank per step: FULL_SHARD gathers each non-root unit
 * twice per micro-step and the root once per step; every unit's gradient is
 * reduce-scattered once per micro-step (DESIGN: 2 P b (N-1)/N + P g (N-1)/N). */
START_TEST(test_comm_bytes_formula)
{
    fsdp_gpt2_config gc;
    fsdp_model m;
    ck_assert_int_eq(fsdp_gpt2_config_parse("tiny", &gc), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_gpt2_init(&m, &gc), FSDP_STATUS_OK);
    static const int devs[] = {2, 4, 8};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int prec = 0; prec < 2; prec++) {
                int N = devs[d], A = 1;
                fsdp_train_config c;
                tiny_config(&c, N, A);
                c.steps = 2;
                c.keep_params = false;
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.compute_dtype = (fsdp_dtype)prec;
                fsdp_shardmap sm;
                ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, N, c.eng.shard), FSDP_STATUS_OK);
                size_t b = fsdp_dtype_size(c.eng.compute_dtype), expect = 0;
                for (int u = 0; u < sm.n_units; u++) {
                    size_t pad = sm.units[u].padded_numel;
                    size_t gathers = u == 0 ? 1 : (s == FSDP_SHARD_FULL ? 2 * A : A);
                    if (s != FSDP_SHARD_NONE)
                        expect += gathers * pad * b * (N - 1) / N + A * pad * 4 * (N - 1) / N;
                    else
                        expect += A * 2 * (pad * 4 * (N - 1) / N);
                }
                fsdp_shardmap_free(&sm);
                fsdp_train_result r;
                run_ok(&c, &r);
                for (int k = 0; k < N; k++)
                    ck_assert_msg(r.stats[k].comm_recv_bytes == expect,
                                  "N=%d shard %d prec %d rank %d: %zu bytes received, formula %zu",
                                  N, s, prec, k, r.stats[k].comm_recv_bytes, expect);
                fsdp_train_result_free(&r);
            }
    fsdp_model_free(&m);
}
END_TEST

/* Sharded state per device is 16 P/N bytes (fp32 master 4 + grad 4 + Adam
 * 8), so the peak falls as devices are added, by that amount. */
START_TEST(test_peak_memory_falls)
{
    fsdp_gpt2_config gc;
    fsdp_model m;
    ck_assert_int_eq(fsdp_gpt2_config_parse("small", &gc), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_gpt2_init(&m, &gc), FSDP_STATUS_OK);
    size_t prev = 0;
    static const int devs[] = {1, 2, 4, 8};
    for (int d = 0; d < 4; d++) {
        int N = devs[d];
        fsdp_train_config c;
        fsdp_train_result r;
        tiny_config(&c, N, 1);
        c.model = "small";
        c.eng.batch = 1;
        c.steps = 1;
        c.keep_params = false;
        run_ok(&c, &r);
        fsdp_shardmap sm;
        ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, N, FSDP_SHARD_FULL), FSDP_STATUS_OK);
        size_t shard_state = 0;
        for (int u = 0; u < sm.n_units; u++)
            shard_state += 16 * sm.units[u].shard_numel;
        const fsdp_mem_stats *ms = &r.stats[0].mem;
        size_t at_peak = ms->peak_kind_bytes[FSDP_MEM_PARAM] + ms->peak_kind_bytes[FSDP_MEM_OPTIM];
        /* master (4) + m, v (8) exactly; gradient shard (4) also resident */
        ck_assert_uint_eq(at_peak, 12 * shard_state / 16);
        ck_assert_uint_ge(r.stats[0].peak_bytes, shard_state);
        if (prev)
            ck_assert_msg(r.stats[0].peak_bytes < prev, "peak %zu with %d devices, %zu before",
                          r.stats[0].peak_bytes, N, prev);
        prev = r.stats[0].peak_bytes;
        fsdp_shardmap_free(&sm);
        fsdp_train_result_free(&r);
    }
    fsdp_model_free(&m);
}
END_TEST

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

START_TEST(test_oom_under_cap)
{
    fsdp_train_config c;
    fsdp_train_result r;
    tiny_config(&c, 4, 1);
    c.model = "small";
    c.eng.device_mem = 2u << 20; /* 2 MiB: params fit, a gathered unit + activations don't */
    double t0 = now_s();
    fsdp_status st = fsdp_train_run(&c, &r);
    double dt = now_s() - t0;
    ck_assert_int_eq(st, FSDP_STATUS_OOM);
    const char *msg = fsdp_error_msg();
    ck_assert_msg(strstr(msg, "out of memory") && strstr(msg, "device ") && strstr(msg, "cap 2.00 MiB"),
                  "message: %s", msg);
    ck_assert_msg(strstr(msg, "unit '") || strstr(msg, "activations"), "message: %s", msg);
    ck_assert_msg(dt < 1.0, "took %.2f s to fail", dt);
    fsdp_train_result_free(&r);
}
END_TEST

START_TEST(test_bad_configs)
{
    fsdp_train_config c;
    fsdp_train_result r;
    tiny_config(&c, 2, 1);
    c.eng.seq = 100000;
    ck_assert_int_eq(fsdp_train_run(&c, &r), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "context"));
    fsdp_train_result_free(&r);
    tiny_config(&c, 2, 1);
    c.model = "no-such-model";
    ck_assert_int_eq(fsdp_train_run(&c, &r), FSDP_STATUS_INVALID_ARG);
    fsdp_train_result_free(&r);
    tiny_config(&c, 2, 1);
    c.data = "/nonexistent/file.bin";
    ck_assert_int_ne(fsdp_train_run(&c, &r), FSDP_STATUS_OK);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "/nonexistent/file.bin"));
    fsdp_train_result_free(&r);
}
END_TEST

/* First event on rank 0 named `name` for unit `unit` in a trace file:
 * its start and end in microseconds. */
static int trace_find(const char *path, const char *name, const char *unit, double *ts,
                      double *end)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[512], want_name[64], want_unit[64];
    snprintf(want_name, sizeof want_name, "\"name\":\"%s\"", name);
    snprintf(want_unit, sizeof want_unit, "\"unit\":\"%s\"", unit);
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, want_name) || !strstr(line, want_unit) || !strstr(line, "\"pid\":0,"))
            continue;
        double t = 0, d = 0;
        const char *p = strstr(line, "\"ts\":"), *q = strstr(line, "\"dur\":");
        if (p && q && sscanf(p, "\"ts\":%lf", &t) == 1 && sscanf(q, "\"dur\":%lf", &d) == 1) {
            *ts = t;
            *end = t + d;
            found = 1;
            break;
        }
    }
    fclose(f);
    return found;
}

/* Offload overlaps: without clipping, the CPU update of the last block
 * (whose gradient is final first) starts before the backward of the first
 * block ends. */
START_TEST(test_offload_overlap)
{
    char path[] = "/tmp/fsdp_trace_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    fsdp_train_config c;
    fsdp_train_result r;
    tiny_config(&c, 1, 1);
    c.model = "custom:layers=4,heads=4,channels=128,vocab=256,context=64";
    c.eng.batch = 8;
    c.eng.seq = 64;
    c.eng.offload = true;
    c.eng.clip = 0.0f;
    c.steps = 1;
    c.keep_params = false;
    c.trace_path = path;
    run_ok(&c, &r);
    double a0, a1, b0, b1;
    ck_assert(trace_find(path, "adamw", "h.3", &a0, &a1));
    ck_assert(trace_find(path, "backward", "h.0", &b0, &b1));
    ck_assert_msg(a0 < b1, "CPU update of h.3 started at %.1f us, backward of h.0 ended at %.1f us",
                  a0, b1);
    unlink(path);
    fsdp_train_result_free(&r);
}
END_TEST

/* More micro-batches per step than norm blocks in the model: the loss
 * exchange has its own buffer (it once borrowed the norm scratch). */
START_TEST(test_many_micro_batches)
{
    fsdp_train_config c;
    fsdp_train_result r;
    tiny_config(&c, 4, 1);
    c.eng.grad_accum = 260; /* M = 1040 micro-batches, tiny has 35 norm blocks */
    c.eng.batch = 1;
    c.eng.seq = 4;
    c.steps = 1;
    c.keep_params = false;
    run_ok(&c, &r);
    ck_assert(isfinite(r.losses[0]) && r.losses[0] > 0.0f);
    fsdp_train_result_free(&r);
}
END_TEST

/* 8 ranks training together (the ThreadSanitizer build runs this too). */
START_TEST(test_eight_ranks_prefetch_offload)
{
    fsdp_train_config c;
    fsdp_train_result r;
    tiny_config(&c, 8, 1);
    c.eng.offload = true;
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    c.steps = 2;
    run_ok(&c, &r);
    ck_assert(isfinite(r.losses[1]));
    fsdp_train_result_free(&r);
}
END_TEST

/* Threads per device never change the math: 1, 2 and 3 threads per device
 * (2 devices; the test hook lifts the cap at the machine's cores) give the
 * same losses, gradient norms and parameters, in fp32 and bf16. "small"
 * with 8 x 64 tokens per micro-batch is big enough that GEMMs are tiled and
 * element-wise ops split into several chunks. */
START_TEST(test_threads_per_device_bit_identical)
{
    fsdp_device_cpu_test_cores(64);
    fsdp_gpt2_config gc;
    fsdp_model m;
    ck_assert_int_eq(fsdp_gpt2_config_parse("small", &gc), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_gpt2_init(&m, &gc), FSDP_STATUS_OK);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        fsdp_train_result ref;
        for (int t = 1; t <= 3; t++) {
            fsdp_train_config c;
            tiny_config(&c, 2, 1);
            c.model = "small";
            c.eng.batch = 8;
            c.eng.seq = 64;
            c.steps = 2;
            c.eng.threads_per_device = t;
            c.eng.compute_dtype = bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            fsdp_train_result r;
            run_ok(&c, t == 1 ? &ref : &r);
            if (t == 1)
                continue;
            for (int s = 0; s < 2; s++)
                ck_assert_msg(!memcmp(&ref.losses[s], &r.losses[s], sizeof(float)) &&
                                  !memcmp(&ref.grad_norms[s], &r.grad_norms[s], sizeof(float)),
                              "%s, %d threads: step %d loss %.9g norm %.9g vs %.9g %.9g on 1",
                              bf16 ? "bf16" : "fp32", t, s + 1, r.losses[s], r.grad_norms[s],
                              ref.losses[s], ref.grad_norms[s]);
            for (int u = 0; u < m.n_units; u++)
                ck_assert_msg(!memcmp(ref.params[u], r.params[u],
                                      m.units[u].numel * sizeof(float)),
                              "%s, %d threads: parameters of unit %s differ from 1 thread's",
                              bf16 ? "bf16" : "fp32", t, m.units[u].name);
            fsdp_train_result_free(&r);
        }
        ck_assert(isfinite(ref.losses[1]) && ref.losses[1] < ref.losses[0]);
        fsdp_train_result_free(&ref);
    }
    fsdp_model_free(&m);
    fsdp_device_cpu_test_cores(0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("engine");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_determinism_matrix);
    tcase_add_test(tc, test_grad_accum_matches);
    tcase_add_test(tc, test_sharded_matches_unsharded);
    tcase_add_test(tc, test_offload_identical);
    tcase_add_test(tc, test_bf16_trains_close);
    tcase_add_test(tc, test_comm_bytes_formula);
    tcase_add_test(tc, test_peak_memory_falls);
    tcase_add_test(tc, test_oom_under_cap);
    tcase_add_test(tc, test_bad_configs);
    tcase_add_test(tc, test_offload_overlap);
    tcase_add_test(tc, test_many_micro_batches);
    tcase_add_test(tc, test_eight_ranks_prefetch_offload);
    tcase_add_test(tc, test_threads_per_device_bit_identical);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
