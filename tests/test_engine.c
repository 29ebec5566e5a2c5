/*
 * test_engine.c - the FSDP engine through the trainer: the determinism
 * contract (bit-identical losses and parameters for 1, 2, 4, 8 devices,
 * every strategy, prefetch on/off, offload), sharded vs unsharded training,
 * communication bytes and memory against their formulas, the error paths
 * (OOM under a cap, bad configurations; the trainer's stops and non-finite
 * steps: test_train_errors.c), activation recompute, and loss masks
 * (example rows: the mean over the global batch's trained targets).
 */
#include <check.h>
#include <math.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stdlib.h>

#include "ckpt/modelfile.h"
#include "device/cpu.h"
#include "data/data.h"
#include "engine/accum.h"
#include "engine/engine.h"
#include "engine/shardmap.h"
#include "model_rig.h"
#include "models/family.h"
#include "models/registry.h"
#include "testutil.h"
#include "train/infer.h"
#include "train/train.h"
#include "train_util.h"

/* Runs are train_config_tiny's (train_util.h): the global batch is 8
 * micro-batches of one sequence of 16 tokens for every device count, N
 * devices running 8/N micro-steps each. The determinism contract holds for
 * the same micro-batches, so the micro-batch size stays fixed. */

/* Same losses and same final parameters of the tiny model, bit for bit. */
static void assert_identical(const fsdp_train_result *a, const fsdp_train_result *b,
                             const char *what)
{
    expect_identical_runs(a, b, "tiny", what);
}

START_TEST(test_determinism_matrix)
{
    fsdp_train_config c;
    fsdp_train_result ref;
    train_config_tiny(&c, 1, 0);
    run_ok(&c, &ref);
    ck_assert(ref.losses[2] < ref.losses[0]); /* it trains */
    static const int devs[] = {1, 2, 4, 8};
    for (int d = 0; d < 4; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int p = 0; p < 2; p++) {
                if (d == 0 && s == 0 && p == 1)
                    continue; /* the reference itself */
                train_config_tiny(&c, devs[d], 0);
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.prefetch = p == 1;
                /* every other run gathers and reduces every parameter on its own, straight
                 * in its place (shardmap.h's direct groups), the others packed */
                c.eng.direct_numel = (d + s + p) % 2 ? 1 : 0;
                fsdp_train_result r;
                run_ok(&c, &r);
                char what[128];
                snprintf(what, sizeof what, "%d devices, shard %s, prefetch %s, %s groups",
                         devs[d], fsdp_shard_strategy_name((fsdp_shard_strategy)s),
                         p ? "on" : "off", c.eng.direct_numel ? "direct" : "packed");
                assert_identical(&ref, &r, what);
                fsdp_train_result_free(&r);
            }
    fsdp_train_result_free(&ref);
}
END_TEST

/* The synthetic task's held-out evaluation decodes rows of one problem
 * (FSDP_SYNTH_ROW) whatever --seq: a run at --seq 32 decodes the same text
 * for each of 48 problems and has the same accuracy on 1 and 4 devices of
 * the same micro-batch, whose ranks decode different problems. */
START_TEST(test_synthetic_eval_same_across_devices)
{
    static char text[2][1 << 16];
    float acc[2];
    const int devs[] = {1, 4};
    for (int k = 0; k < 2; k++) {
        fsdp_train_config c;
        fsdp_train_result r;
        train_config_tiny(&c, devs[k], 0); /* micro-batches of 1 either way */
        c.eng.seq = 32;
        c.steps = 2;
        c.lr = 1e-6f; /* near its init, whose greedy text varies with the prompt */
        c.eval_problems = 48;
        c.n_samples = 48;
        c.out = tmpfile();
        ck_assert_ptr_nonnull(c.out);
        run_ok(&c, &r);
        acc[k] = r.accuracy;
        rewind(c.out);
        size_t n = fread(text[k], 1, sizeof text[k] - 1, c.out);
        text[k][n] = '\0';
        fclose(c.out);
        fsdp_train_result_free(&r);
        /* only the sample lines: the step lines carry timings */
        char *keep = text[k], *w = text[k];
        for (char *line = strtok(keep, "\n"); line; line = strtok(NULL, "\n"))
            if (strstr(line, "sample: ")) { /* compacted in place: w <= line */
                size_t len = strlen(line);
                memmove(w, line, len);
                w += len;
                *w++ = '\n';
            }
        *w = '\0';
    }
    /* rank 0 prints its own rows: all 48 problems on one device, every fourth on four */
    int lines[2] = {0, 0};
    for (int k = 0; k < 2; k++)
        for (const char *p = text[k]; (p = strstr(p, "sample: ")); p++)
            lines[k]++;
    ck_assert_int_eq(lines[0], 48);
    ck_assert_int_eq(lines[1], 12);
    for (char *line = strtok(text[1], "\n"); line; line = strtok(NULL, "\n"))
        ck_assert_msg(strstr(text[0], line), "4 devices decoded '%s'; one device:\n%s", line,
                      text[0]);
    ck_assert_msg(acc[0] >= 0.0f && acc[0] == acc[1], "accuracy %g against %g", acc[0], acc[1]);
}
END_TEST

/* Two micro-steps of batch 1 on 2 devices equal one micro-step of batch 1
 * on 4: the accumulation tree over micro-steps is the rank tree's twin. */
START_TEST(test_grad_accum_matches)
{
    fsdp_train_config c;
    fsdp_train_result a, b;
    train_config_tiny(&c, 4, 1);
    c.eng.batch = 1;
    run_ok(&c, &a);
    train_config_tiny(&c, 2, 2);
    c.eng.batch = 1;
    run_ok(&c, &b);
    assert_identical(&a, &b, "2 devices x 2 micro-steps vs 4 devices");
    fsdp_train_result_free(&b);
    /* three micro-steps (not a power of two) still train and stay finite */
    train_config_tiny(&c, 1, 3);
    c.eng.batch = 2;
    run_ok(&c, &b);
    ck_assert(isfinite(b.losses[2]) && b.losses[2] < b.losses[0]);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
}
END_TEST

/* ---- --accum flat (engine/accum.h) ------------------------------------------- */

/* Flat sums the micro-steps in order, so its bits depend on A and on the
 * micro-steps' contents, nothing else: with 4 micro-steps of batch 1 on 1, 2
 * and 4 devices, every strategy, prefetch and offload give the run's bits;
 * 2 devices x 2 micro-steps equal 4 devices x 1 (below 4 micro-steps flat adds
 * as the tree does); and 4 micro-steps differ from the tree's ((g0 + g1) +
 * (g2 + g3) against ((g0 + g1) + g2) + g3), so the flat path really ran. */
START_TEST(test_accum_flat_devices)
{
    static const int devs[] = {1, 2, 4};
    for (int d = 0; d < 3; d++) {
        fsdp_train_config c;
        fsdp_train_result ref, r;
        train_config_tiny(&c, devs[d], 4);
        c.eng.batch = 1;
        c.eng.accum = FSDP_ACCUM_FLAT;
        run_ok(&c, &ref);
        ck_assert(ref.losses[2] < ref.losses[0]);
        for (int k = 0; k < 3; k++) {
            c.eng.shard = k == 1 ? FSDP_SHARD_GRAD_OP : k == 2 ? FSDP_SHARD_NONE : FSDP_SHARD_FULL;
            c.eng.prefetch = k != 1;
            c.eng.offload = k != 2;
            run_ok(&c, &r);
            char what[96];
            snprintf(what, sizeof what, "flat, %d device(s) x 4 micro-steps, setting %d",
                     devs[d], k);
            assert_identical(&ref, &r, what);
            fsdp_train_result_free(&r);
        }
        train_config_tiny(&c, devs[d], 4);
        c.eng.batch = 1;
        run_ok(&c, &r); /* the tree */
        fsdp_model m;
        ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
        bool same = true;
        for (int u = 0; u < m.n_units && same; u++)
            same = !memcmp(r.params[u], ref.params[u], m.units[u].numel * sizeof(float));
        fsdp_model_free(&m);
        ck_assert_msg(!same, "%d device(s): flat and tree gave the same parameters after 4 "
                      "micro-steps: the flat run did not sum in micro-step order", devs[d]);
        fsdp_train_result_free(&r);
        fsdp_train_result_free(&ref);
    }
    fsdp_train_config c;
    fsdp_train_result a, b;
    train_config_tiny(&c, 4, 1);
    c.eng.batch = 1;
    c.eng.accum = FSDP_ACCUM_FLAT;
    run_ok(&c, &a);
    train_config_tiny(&c, 2, 2);
    c.eng.batch = 1;
    c.eng.accum = FSDP_ACCUM_FLAT;
    run_ok(&c, &b);
    assert_identical(&a, &b, "flat, 2 devices x 2 micro-steps vs 4 devices");
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
}
END_TEST

/* second, resumed from the checkpoint after step 2 of a 4-step run, ends as the uninterrupted
 * run straight does: steps 3 and 4 and the final parameters, bit for bit (second's first two
 * steps are filled in from straight's). */
static void expect_resumed_identical(const fsdp_train_result *straight, fsdp_train_result *second,
                                     const char *what)
{
    ck_assert_int_eq(second->first_step, 2);
    ck_assert_int_eq(second->steps, 4);
    for (int s = 2; s < 4; s++)
        ck_assert_msg(!memcmp(&straight->losses[s], &second->losses[s], sizeof(float)),
                      "%s: step %d: loss %.9g resumed, %.9g straight", what, s + 1,
                      second->losses[s], straight->losses[s]);
    second->first_step = 0; /* the parameters: every unit, as expect_identical_runs reads them */
    memcpy(second->losses, straight->losses, 2 * sizeof(float));
    memcpy(second->grad_norms, straight->grad_norms, 2 * sizeof(float));
    assert_identical(straight, second, what);
}

/* A checkpoint holds no accumulation state: a flat run (offload, 4
 * micro-steps) stopped after step 2 and resumed equals the uninterrupted
 * one, losses and parameters. */
START_TEST(test_accum_flat_resume)
{
    char ck[256];
    fsdp_test_path(ck, sizeof ck, "ck");
    fsdp_train_config c;
    fsdp_train_result straight, first, second;
    train_config_tiny(&c, 2, 4);
    c.eng.batch = 1;
    c.eng.accum = FSDP_ACCUM_FLAT;
    c.eng.offload = true;
    c.steps = 4;
    run_ok(&c, &straight);
    c.ckpt_dir = ck;
    c.ckpt_every = 2;
    c.stop_after = 2;
    run_ok(&c, &first);
    c.stop_after = 0;
    c.resume = true;
    run_ok(&c, &second);
    expect_resumed_identical(&straight, &second, "flat, resumed after step 2");
    fsdp_train_result_free(&straight);
    fsdp_train_result_free(&first);
    fsdp_train_result_free(&second);
}
END_TEST

/* With 1, 2 or 3 micro-steps both modes add in the same order: flat is the
 * tree bit for bit (sharded, unsharded, offload, bf16). */
START_TEST(test_accum_flat_is_tree_below_4)
{
    static const int accums[] = {1, 2, 3};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 3; k++) {
            fsdp_train_config c;
            fsdp_train_result a, b;
            train_config_tiny(&c, 2, accums[i]);
            c.eng.batch = 1;
            c.eng.shard = k == 1 ? FSDP_SHARD_NONE : FSDP_SHARD_FULL;
            c.eng.offload = k == 2;
            c.eng.compute_dtype = k == 2 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            run_ok(&c, &a);
            c.eng.accum = FSDP_ACCUM_FLAT;
            run_ok(&c, &b);
            char what[96];
            snprintf(what, sizeof what, "flat vs tree, %d micro-step(s), setting %d", accums[i],
                     k);
            assert_identical(&a, &b, what);
            fsdp_train_result_free(&a);
            fsdp_train_result_free(&b);
        }
}
END_TEST

/* 10 steps of FULL_SHARD on 4 devices equal NO_SHARD on 1 device. */
START_TEST(test_sharded_matches_unsharded)
{
    fsdp_train_config c;
    fsdp_train_result a, b;
    train_config_tiny(&c, 4, 0);
    c.steps = 10;
    c.eng.shard = FSDP_SHARD_FULL;
    run_ok(&c, &a);
    train_config_tiny(&c, 1, 0);
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
                train_config_tiny(&c, devs[d], 0);
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.clip = clip ? 0.5f : 0.0f;
                run_ok(&c, &a);
                c.eng.offload = true;
                run_ok(&c, &b);
                char what[96];
                snprintf(what, sizeof what, "offload, %d devices, shard %s, clip %s", devs[d],
                         fsdp_shard_strategy_name((fsdp_shard_strategy)s), clip ? "on" : "off");
                assert_identical(&a, &b, what);
                /* master, m, v, the gradient shard and the accumulation
                 * counter's other shards (depth - 1 of them for A micro-
                 * steps) moved to pinned host memory; the device keeps an
                 * fp32 parameter shard (4 bytes per element) and gradient
                 * buffers in flight, at most one unit's reduced shard at a
                 * time */
                fsdp_model m;
                ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
                fsdp_shardmap sm;
                ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, devs[d], c.eng.shard),
                                 FSDP_STATUS_OK);
                size_t shard = 0, max_unit = 0;
                for (int u = 0; u < sm.n_units; u++) {
                    shard += sm.units[u].shard_numel;
                    if (sm.units[u].shard_numel > max_unit)
                        max_unit = sm.units[u].shard_numel;
                }
                size_t partials = 4 * (size_t)(fsdp_accum_depth(c.eng.grad_accum) - 1);
                ck_assert_uint_eq(b.stats[0].host_peak_bytes - a.stats[0].host_peak_bytes,
                                  (16 + partials) * shard); /* both hold the pinned loss copy */
                size_t saved = a.stats[0].peak_bytes - b.stats[0].peak_bytes;
                ck_assert_msg(saved <= (12 + partials) * shard &&
                                  saved + 4 * max_unit >= (12 + partials) * shard,
                              "%s: offload saved %zu device bytes; optimizer state and "
                              "gradient partial sums are %zu", what, saved,
                              (12 + partials) * shard);
                fsdp_shardmap_free(&sm);
                fsdp_model_free(&m);
                fsdp_train_result_free(&a);
                fsdp_train_result_free(&b);
            }
}
END_TEST

/* --offload optimizer,params: the trainable compute-dtype shards live in pinned host memory
 * (the host step writes them, each gather uploads them), so the run gives the bits of one
 * without offload on 1, 2 and 4 devices, every strategy, fp32 and bf16, with the recompute
 * mode, accumulation, prefetch and clipping cycling along the matrix. Against --offload
 * optimizer, the device holds no parameter shard at all and the host no more than before (the
 * shard is the host step's bf16 staging buffer, or in fp32 the master itself); sharded, the
 * device peak falls by the compute-dtype shards, less at most one shard upload in flight. */
START_TEST(test_offload_params_identical)
{
    static const int devs[] = {1, 2, 4};
    int i = 0;
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int bf16 = 0; bf16 < 2; bf16++, i++) {
                if (s == FSDP_SHARD_HYBRID && devs[d] == 1)
                    continue;
                /* sanitizer builds: one precision per device count and strategy, alternating */
                if ((FSDP_TEST_TSAN || FSDP_TEST_ASAN) && bf16 != (d + s) % 2)
                    continue;
                fsdp_train_config c;
                fsdp_train_result ref, opt, r;
                train_config_tiny(&c, devs[d], i % 2 ? 1 : 0);
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.n_nodes = s == FSDP_SHARD_HYBRID ? 2 : 1;
                c.eng.compute_dtype = bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
                c.eng.recompute = (fsdp_recompute)(i % FSDP_RECOMPUTE_COUNT);
                c.eng.prefetch = i % 4 != 3;
                c.eng.clip = i % 3 ? 0.5f : 0.0f;
                run_ok(&c, &ref);
                c.eng.direct_numel = i % 2 ? 1 : 0; /* shardmap.h's groups: direct or packed */
                c.eng.offload = true;
                run_ok(&c, &opt);
                c.eng.offload_params = true;
                run_ok(&c, &r);
                char what[160];
                snprintf(what, sizeof what,
                         "offload optimizer,params, %d devices, shard %s, %s, recompute %s, "
                         "grad-accum %d, clip %g",
                         devs[d], fsdp_shard_strategy_name(c.eng.shard),
                         fsdp_dtype_name(c.eng.compute_dtype),
                         fsdp_names_name(&fsdp_recompute_names, (int)c.eng.recompute),
                         c.eng.grad_accum, (double)c.eng.clip);
                assert_identical(&ref, &r, what);
                fsdp_model m;
                ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
                fsdp_shardmap sm;
                ck_assert_int_eq(fsdp_shardmap_init_nodes(&sm, &m, devs[d], c.eng.n_nodes,
                                                          c.eng.shard),
                                 FSDP_STATUS_OK);
                size_t dt = fsdp_dtype_size(c.eng.compute_dtype), shard = 0, max_unit = 0;
                for (int u = 0; u < sm.n_units; u++) {
                    shard += sm.units[u].shard_numel * dt;
                    if (sm.units[u].shard_numel * dt > max_unit)
                        max_unit = sm.units[u].shard_numel * dt;
                }
                for (int k = 0; k < r.n_ranks; k++) {
                    ck_assert_msg(r.stats[k].mem.peak_kind_bytes[FSDP_MEM_PARAM] == 0,
                                  "%s: device %d holds %zu parameter bytes", what, k,
                                  r.stats[k].mem.peak_kind_bytes[FSDP_MEM_PARAM]);
                    ck_assert_msg(r.stats[k].host_peak_bytes == opt.stats[k].host_peak_bytes,
                                  "%s: device %d pinned host %zu bytes, %zu with the optimizer "
                                  "alone", what, k, r.stats[k].host_peak_bytes,
                                  opt.stats[k].host_peak_bytes);
                    if (s == FSDP_SHARD_NONE) /* every unit gathered at once: no saving */
                        continue;
                    size_t saved = opt.stats[k].peak_bytes - r.stats[k].peak_bytes;
                    ck_assert_msg(opt.stats[k].peak_bytes > r.stats[k].peak_bytes &&
                                      saved <= shard && saved + max_unit >= shard,
                                  "%s: device %d: peak %zu, %zu with the optimizer alone; the "
                                  "compute-dtype shards are %zu bytes", what, k,
                                  r.stats[k].peak_bytes, opt.stats[k].peak_bytes, shard);
                }
                fsdp_shardmap_free(&sm);
                fsdp_model_free(&m);
                fsdp_train_result_free(&ref);
                fsdp_train_result_free(&opt);
                fsdp_train_result_free(&r);
            }
}
END_TEST

/* A checkpoint of a run whose parameter shards live on the host (bf16, 2 devices, stopped
 * after step 2) resumes on 4 devices, the shards rewritten on the host from the masters read,
 * and ends bit for bit where an uninterrupted run without offload does. */
START_TEST(test_offload_params_resume)
{
    char ck[256];
    fsdp_test_path(ck, sizeof ck, "ck");
    fsdp_train_config c;
    fsdp_train_result straight, first, second;
    train_config_tiny(&c, 2, 2); /* micro-batches of 2 sequences, as on 4 devices below */
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    c.steps = 4;
    run_ok(&c, &straight);
    c.eng.offload = c.eng.offload_params = true;
    c.ckpt_dir = ck;
    c.ckpt_every = 2;
    c.stop_after = 2;
    run_ok(&c, &first);
    train_config_tiny(&c, 4, 1);
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    c.eng.offload = c.eng.offload_params = true;
    c.steps = 4;
    c.ckpt_dir = ck;
    c.resume = true;
    run_ok(&c, &second);
    expect_resumed_identical(&straight, &second, "offload optimizer,params, resumed on 4 devices");
    fsdp_train_result_free(&straight);
    fsdp_train_result_free(&first);
    fsdp_train_result_free(&second);
}
END_TEST

START_TEST(test_bf16_trains_close)
{
    fsdp_train_config c;
    fsdp_train_result a, b, d;
    train_config_tiny(&c, 2, 0);
    c.steps = 5;
    run_ok(&c, &a);
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    run_ok(&c, &b);
    for (int s = 0; s < 5; s++)
        ck_assert_msg(fabsf(a.losses[s] - b.losses[s]) < 0.02f * a.losses[s],
                      "bf16 loss %g vs fp32 %g at step %d", b.losses[s], a.losses[s], s + 1);
    /* bf16 is also deterministic across device counts */
    train_config_tiny(&c, 4, 0);
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
 * reduce-scattered once per micro-step (docs/step.md: 2 P b (N-1)/N + P g (N-1)/N). */
START_TEST(test_comm_bytes_formula)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    static const int devs[] = {2, 4, 8};
    for (int d = 0; d < 3; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int prec = 0; prec < 2; prec++) {
                int N = devs[d], A = 1;
                fsdp_train_config c;
                train_config_tiny(&c, N, A);
                c.steps = 2;
                c.keep_params = false;
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.compute_dtype = (fsdp_dtype)prec;
                fsdp_shardmap sm;
                ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, N, c.eng.shard), FSDP_STATUS_OK);
                size_t b = fsdp_dtype_size(c.eng.compute_dtype), expect = 0;
                for (int u = 0; u < sm.n_units; u++) {
                    size_t pad = sm.units[u].padded_numel;
                    bool reshards = s == FSDP_SHARD_FULL || s == FSDP_SHARD_HYBRID;
                    size_t gathers = u == 0 ? 1 : (reshards ? 2 * A : A);
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
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("small", &m), FSDP_STATUS_OK);
    size_t prev = 0;
    static const int devs[] = {1, 2, 4, 8};
    for (int d = 0; d < 4; d++) {
        int N = devs[d];
        fsdp_train_config c;
        fsdp_train_result r;
        train_config_tiny(&c, N, 1);
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
    train_config_tiny(&c, 4, 1);
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
    train_config_tiny(&c, 2, 1);
    c.eng.seq = 100000;
    ck_assert_int_eq(fsdp_train_run(&c, &r), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "context"));
    fsdp_train_result_free(&r);
    train_config_tiny(&c, 2, 1);
    c.model = "no-such-model";
    ck_assert_int_eq(fsdp_train_run(&c, &r), FSDP_STATUS_INVALID_ARG);
    fsdp_train_result_free(&r);
    train_config_tiny(&c, 2, 1);
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
    train_config_tiny(&c, 1, 1);
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
    train_config_tiny(&c, 4, 1);
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
    train_config_tiny(&c, 8, 1);
    c.eng.offload = true;
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    c.steps = 2;
    run_ok(&c, &r);
    ck_assert(isfinite(r.losses[1]));
    fsdp_train_result_free(&r);
}
END_TEST

/* ---- activation recompute ------------------------------------------------------- */

/* Four blocks, so that several blocks share the recompute work buffers;
 * every family: a GPT-2, an untied GQA Llama with llama3 rope scaling and
 * head_dim * heads != hidden, and a tied Qwen2 with q/k/v biases. The
 * tests below loop over them (_i). */
static const char *const recompute_models[] = {
    "custom:layers=4,heads=4,channels=32,vocab=256,context=64",
    "llama:layers=4,heads=4,kv_heads=2,hidden=32,intermediate=64,head_dim=16,rope=llama3,"
    "rope_factor=8",
    "llama:layers=4,heads=4,kv_heads=1,hidden=32,intermediate=80,head_dim=8,rope_theta=1000000,"
    "qkv_bias=1,tied=1,norm_eps=1e-06",
};
#define N_RECOMPUTE_MODELS ((int)(sizeof recompute_models / sizeof recompute_models[0]))

static const char *recompute_name(fsdp_recompute r)
{
    return fsdp_names_name(&fsdp_recompute_names, (int)r);
}

/* Every recompute mode gives none's losses, gradient norms and parameters,
 * bit for bit: 1, 2, 4 and 8 devices (8, 4, 2, 1 micro-steps each), every
 * strategy (sanitizer builds: one per device count, cycling), prefetch on
 * and off, offload, clipping and bf16; and keeps fewer activation bytes (so
 * the recompute path really ran). */
START_TEST(test_recompute_identical)
{
    const char *model = recompute_models[_i];
    fsdp_train_config c;
    fsdp_train_result ref, ref_bf16;
    train_config_tiny(&c, 1, 0);
    c.model = model;
    run_ok(&c, &ref);
    ck_assert(ref.losses[2] < ref.losses[0]);
    size_t ref_act = ref.stats[0].mem.peak_kind_bytes[FSDP_MEM_ACT];
    train_config_tiny(&c, 2, 0);
    c.model = model;
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    run_ok(&c, &ref_bf16);
    static const int devs[] = {1, 2, 4, 8};
    for (int mode = FSDP_RECOMPUTE_BLOCK; mode < FSDP_RECOMPUTE_COUNT; mode++) {
        for (int d = 0; d < 4; d++)
            for (int s = 0; s < FSDP_SHARD_COUNT; s++) {
                /* sanitizer builds: one strategy per mode and device count, cycling */
                if ((FSDP_TEST_TSAN || FSDP_TEST_ASAN) && s != (d + mode) % FSDP_SHARD_COUNT)
                    continue;
                train_config_tiny(&c, devs[d], 0);
                c.model = model;
                c.eng.recompute = (fsdp_recompute)mode;
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.prefetch = (d + s) % 2 == 0;
                fsdp_train_result r;
                run_ok(&c, &r);
                char what[256];
                snprintf(what, sizeof what, "%s: recompute %s, %d devices, shard %s, prefetch %s",
                         model, recompute_name(c.eng.recompute), devs[d],
                         fsdp_shard_strategy_name(c.eng.shard), c.eng.prefetch ? "on" : "off");
                expect_identical_runs(&ref, &r, model, what);
                if (devs[d] == 1)
                    ck_assert_msg(r.stats[0].mem.peak_kind_bytes[FSDP_MEM_ACT] < ref_act,
                                  "%s: %zu activation bytes, none keeps %zu", what,
                                  r.stats[0].mem.peak_kind_bytes[FSDP_MEM_ACT], ref_act);
                fsdp_train_result_free(&r);
            }
        /* offload (with and without clipping), against the same run without recompute */
        for (int k = 0; k < 2; k++) {
            fsdp_train_result a, b;
            train_config_tiny(&c, 2 * (k + 1), 0);
            c.model = model;
            c.eng.offload = true;
            c.eng.clip = k ? 0.5f : 0.0f;
            c.eng.shard = k ? FSDP_SHARD_GRAD_OP : FSDP_SHARD_FULL;
            run_ok(&c, &a);
            c.eng.recompute = (fsdp_recompute)mode;
            run_ok(&c, &b);
            char what[256];
            snprintf(what, sizeof what, "%s: recompute %s, offload, %d devices, shard %s, clip %s",
                     model, recompute_name(c.eng.recompute), 2 * (k + 1),
                     fsdp_shard_strategy_name(c.eng.shard), k ? "on" : "off");
            expect_identical_runs(&a, &b, model, what);
            fsdp_train_result_free(&a);
            fsdp_train_result_free(&b);
        }
        /* bf16: the recomputed bf16 activations are the forward's */
        for (int d = 1; d < 3; d++) {
            fsdp_train_result r;
            train_config_tiny(&c, devs[d], 0);
            c.model = model;
            c.eng.compute_dtype = FSDP_DTYPE_BF16;
            c.eng.recompute = (fsdp_recompute)mode;
            run_ok(&c, &r);
            char what[256];
            snprintf(what, sizeof what, "%s: recompute %s, bf16, %d devices",
                     model, recompute_name(c.eng.recompute), devs[d]);
            expect_identical_runs(&ref_bf16, &r, model, what);
            fsdp_train_result_free(&r);
        }
    }
    fsdp_train_result_free(&ref);
    fsdp_train_result_free(&ref_bf16);
}
END_TEST

static size_t align_up(size_t n)
{
    return (n + FSDP_DEVICE_ALIGN - 1) / FSDP_DEVICE_ALIGN * FSDP_DEVICE_ALIGN;
}

/* Activation memory drops by what a mode does not keep, times L - 1 (one
 * copy of it stays), and the peak by exactly as much: from GPT-2's saved
 * activations per block (ln1 C, its mean and rstd, qkv 3C, atty C, the
 * softmax NH*T, residual2 C, ln2 C + stats, fch 4C, fch_gelu 4C,
 * residual3 C per token), written out here from the architecture. */
START_TEST(test_recompute_memory_formula)
{
    const int L = 5, NH = 2, C = 64, T = 32, B = 2;
    const size_t N = (size_t)B * T;
    for (int prec = 0; prec < 2; prec++) {
        const size_t dts = prec ? 2 : 4;
        size_t c1 = align_up(N * C * dts), stat = align_up(N * 4);
        size_t att = align_up(N * NH * T * dts), c3 = align_up(N * 3 * C * dts);
        size_t c4 = align_up(N * 4 * C * dts);
        /* block keeps residual3: everything else is one copy */
        size_t block_drop = c1 + 2 * stat + c3 + c1 + att + c1 + c1 + 2 * stat + c4 + c4;
        /* elementwise drops ln1, ln2 (with their statistics) and fch_gelu */
        size_t elem_drop = c1 + 2 * stat + c1 + 2 * stat + c4;
        fsdp_train_config c;
        train_config_tiny(&c, 2, 1);
        c.model = "custom:layers=5,heads=2,channels=64,vocab=256,context=32";
        c.eng.batch = B;
        c.eng.seq = T;
        c.eng.compute_dtype = (fsdp_dtype)prec;
        expect_recompute_savings(&c, L, block_drop, elem_drop);
    }
}
END_TEST

/* Recompute adds no traffic (the block's one gather in backward serves the
 * re-forward too) and one "recompute" compute span per block, micro-step
 * and step, before the block's backward, in the trace. */
START_TEST(test_recompute_schedule)
{
    const char *model = recompute_models[_i];
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(model, &m), FSDP_STATUS_OK);
    const char *unit = m.units[3].name; /* the third block */
    char path[] = "/tmp/fsdp_trace_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    size_t recv[FSDP_RECOMPUTE_COUNT];
    for (int mode = 0; mode < FSDP_RECOMPUTE_COUNT; mode++) {
        fsdp_train_config c;
        fsdp_train_result r;
        train_config_tiny(&c, 2, 2);
        c.model = model;
        c.eng.recompute = (fsdp_recompute)mode;
        c.steps = 2;
        c.keep_params = false;
        c.trace_path = path;
        run_ok(&c, &r);
        recv[mode] = r.stats[0].comm_recv_bytes;
        fsdp_train_result_free(&r);
        FILE *f = fopen(path, "r");
        ck_assert_ptr_nonnull(f);
        char line[512];
        int n_recompute = 0;
        while (fgets(line, sizeof line, f))
            n_recompute += strstr(line, "\"name\":\"recompute\"") && strstr(line, "\"pid\":0,");
        fclose(f);
        int want = mode == FSDP_RECOMPUTE_NONE ? 0 : 4 * 2 * 2; /* blocks x micro-steps x steps */
        ck_assert_msg(n_recompute == want, "%s: recompute %s: %d recompute spans, want %d",
                      model, recompute_name((fsdp_recompute)mode), n_recompute, want);
        if (want) {
            double r0, r1, b0, b1;
            ck_assert(trace_find(path, "recompute", unit, &r0, &r1));
            ck_assert(trace_find(path, "backward", unit, &b0, &b1));
            ck_assert_msg(r1 <= b0, "%s: recompute of %s ends at %.1f us, its backward "
                          "starts at %.1f us", model, unit, r1, b0);
        }
    }
    unlink(path);
    for (int mode = 1; mode < FSDP_RECOMPUTE_COUNT; mode++)
        ck_assert_uint_eq(recv[mode], recv[FSDP_RECOMPUTE_NONE]);
    fsdp_model_free(&m);
}
END_TEST

/* A model without the recompute slots, and a mode out of range, are
 * refused before anything is allocated, naming the option. */
START_TEST(test_recompute_refused)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    struct fsdp_model_i no_recompute;
    const struct fsdp_model_i *gpt2_iface = model_drop_recompute(&m, &no_recompute);
    fsdp_train_config c;
    train_config_tiny(&c, 2, 1);
    fsdp_engine_shared sh;
    c.eng.recompute = FSDP_RECOMPUTE_NONE;
    ck_assert_int_eq(fsdp_engine_shared_init(&sh, &c.eng, &m, NULL, NULL), FSDP_STATUS_OK);
    fsdp_engine_shared_free(&sh);
    c.eng.recompute = FSDP_RECOMPUTE_ELEMENTWISE;
    ck_assert_int_eq(fsdp_engine_shared_init(&sh, &c.eng, &m, NULL, NULL),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_msg(strstr(fsdp_error_msg(), "--recompute elementwise") &&
                      strstr(fsdp_error_msg(), "tiny") &&
                      strstr(fsdp_error_msg(), "use --recompute none"),
                  "%s", fsdp_error_msg());
    m.iface = gpt2_iface;
    c.eng.recompute = (fsdp_recompute)7;
    ck_assert_int_eq(fsdp_engine_shared_init(&sh, &c.eng, &m, NULL, NULL),
                     FSDP_STATUS_INVALID_ARG);
    fsdp_model_free(&m);
}
END_TEST

/* On cuda too, every mode reruns the forward's kernels on the same inputs:
 * the same bits as none (fp32 and bf16, one GPU). Skips without a GPU. */
START_TEST(test_recompute_identical_cuda)
{
    if (fsdp_cuda_device_count() == 0) {
        printf("SKIP: test_recompute_identical_cuda: no CUDA device\n");
        fflush(stdout);
        return;
    }
    const char *model = recompute_models[_i];
    for (int prec = 0; prec < 2; prec++) {
        fsdp_train_result ref;
        fsdp_train_config c;
        for (int mode = 0; mode < FSDP_RECOMPUTE_COUNT; mode++) {
            train_config_tiny(&c, 1, 2);
            c.model = model;
            c.eng.backend = FSDP_BACKEND_CUDA;
            c.eng.batch = 4;
            c.eng.compute_dtype = (fsdp_dtype)prec;
            c.eng.recompute = (fsdp_recompute)mode;
            fsdp_train_result r;
            run_ok(&c, mode ? &r : &ref);
            if (!mode)
                continue;
            char what[256];
            snprintf(what, sizeof what, "%s: cuda, %s, recompute %s", model,
                     fsdp_dtype_name(c.eng.compute_dtype),
                     recompute_name(c.eng.recompute));
            expect_identical_runs(&ref, &r, model, what);
            fsdp_train_result_free(&r);
        }
        fsdp_train_result_free(&ref);
    }
}
END_TEST

/* GPT-2's recompute FLOPs: block reruns a block's forward up to the GELU
 * (16 C^2 + 4 C T per layer and token), elementwise no matmul. */
START_TEST(test_recompute_flops)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("gpt2", &m), FSDP_STATUS_OK);
    const struct fsdp_model_i *mi = m.iface;
    double C = 768, T = 1024, L = 12;
    ck_assert(mi->recompute_flops_per_token(&m, 1024, FSDP_RECOMPUTE_NONE) == 0.0);
    ck_assert(mi->recompute_flops_per_token(&m, 1024, FSDP_RECOMPUTE_ELEMENTWISE) == 0.0);
    double block = mi->recompute_flops_per_token(&m, 1024, FSDP_RECOMPUTE_BLOCK);
    ck_assert(fabs(block - L * (16 * C * C + 4 * C * T)) < 1.0);
    /* a bit more than a fifth of the training FLOPs (6 P + 12 L C T) */
    double train = m.family->flops_per_token(&m, 1024);
    ck_assert(block > 0.15 * train && block < 0.3 * train);
    fsdp_model_free(&m);
}
END_TEST

/* ---- loss masks: prompt/completion rows ------------------------------------------ */

static const char *const masked_models[] = {
    "gpt2:layers=2,heads=4,channels=32,vocab=768,context=32",
    "llama:layers=2,heads=4,kv_heads=2,hidden=32,intermediate=64,head_dim=8,vocab=768,"
    "context=32",
};

/* Example rows of different lengths, so micro-batches hold different
 * numbers of trained targets (and one prompt fills a whole row). */
static void write_examples(const char *path)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 12; i++) /* with tok_llama3.json: 14 or 42 + 3 or 17 tokens */
        fprintf(f, "{\"prompt\": \"Q%d: how many %s?\", \"completion\": \"%s\"}\n", i % 10,
                i % 5 ? "foxes" : "quick brown foxes jump over the lazy dogs today",
                i % 2 ? " seven" : " a few, and then some more");
    fclose(f);
}

static void masked_config(fsdp_train_config *c, const char *model, const char *data, int devices)
{
    train_config_tiny(c, devices, 4 / devices);
    c->eng.batch = 2; /* 4 micro-batches of 2 rows of 32 tokens per step */
    c->eng.seq = 32;
    c->eng.clip = 1.0f;
    c->model = model;
    c->data = data;
    c->tokenizer = "tests/fixtures/tok_llama3.json";
    c->pack = FSDP_TRAIN_PACK_OFF; /* one example per row: hand_losses' rows */
}

/* The step-0 loss computed by hand: the initial model (the engine's
 * counter-based init) run forward on one cpu rank, every token's
 * cross-entropy in double, and three means of it: over the unmasked targets
 * of the global batch (what the engine reports), of the micro-batches'
 * means, and of the rows' means. Returns the unmasked count. */
static uint64_t hand_losses(const fsdp_train_config *c, double *global, double *of_micro,
                            double *of_rows)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(c->model, &m), FSDP_STATUS_OK);
    fsdp_data_opts o = {.spec = c->data, .seed = c->eng.seed, .tokenizer = c->tokenizer};
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_OK);
    fsdp_device dev;
    fsdp_op_ctx ctx;
    ck_assert_int_eq(fsdp_device_init(&dev, FSDP_BACKEND_CPU, NULL, 0, 0, 0), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ops_init(&ctx, &dev, FSDP_DTYPE_F32), FSDP_STATUS_OK);
    void **params = calloc((size_t)m.n_units, sizeof *params);
    for (int u = 0; u < m.n_units; u++) {
        params[u] = malloc(m.units[u].numel * sizeof(float));
        fsdp_model_init_range(&m, u, 0, m.units[u].numel, c->eng.seed, params[u]);
    }
    const int B = c->eng.batch, T = c->eng.seq, M = c->eng.n_ranks * c->eng.grad_accum;
    const int V = m.vocab_size, Vp = m.padded_vocab_size;
    void *state = NULL;
    ck_assert_int_eq(m.iface->state_init(&m, &ctx, B, T, false, &state), FSDP_STATUS_OK);
    double sum = 0, micro_means = 0, row_means = 0;
    uint64_t count = 0, first_count = 0;
    int rows = 0;
    bool counts_differ = false;
    for (int k = 0; k < M; k++) {
        int *in = m.iface->state_tokens(state), *tg = m.iface->state_targets(state);
        ck_assert_int_eq(fsdp_data_batch(d, (uint64_t)k, B, T, in, tg), FSDP_STATUS_OK);
        ck_assert_int_eq(m.iface->root_forward(&m, &ctx, state, params[0]), FSDP_STATUS_OK);
        for (int u = 1; u < m.n_units; u++)
            ck_assert_int_eq(m.iface->unit_forward(&m, &ctx, state, u, params[u]),
                             FSDP_STATUS_OK);
        ck_assert_int_eq(m.iface->head_forward_backward(&m, &ctx, state, params[0], NULL, 1.0f,
                                                        NULL),
                         FSDP_STATUS_OK);
        const float *lg = m.iface->state_logits(state);
        double msum = 0;
        uint64_t mcount = 0;
        for (int b = 0; b < B; b++) {
            double rsum = 0;
            int rcount = 0;
            for (int t = 0; t < T; t++) {
                int i = b * T + t;
                if (tg[i] < 0)
                    continue;
                const float *row = lg + (size_t)i * Vp;
                double mx = row[0], se = 0;
                for (int j = 1; j < V; j++)
                    mx = row[j] > mx ? row[j] : mx;
                for (int j = 0; j < V; j++)
                    se += exp((double)row[j] - mx);
                rsum += log(se) + mx - row[tg[i]];
                rcount++;
            }
            msum += rsum;
            mcount += (uint64_t)rcount;
            if (rcount) {
                row_means += rsum / rcount;
                rows++;
            }
        }
        ck_assert_uint_gt(mcount, 0);
        sum += msum;
        count += mcount;
        micro_means += msum / (double)mcount;
        if (k == 0)
            first_count = mcount;
        counts_differ |= mcount != first_count;
    }
    ck_assert_msg(counts_differ, "the micro-batches should hold different numbers of targets");
    ck_assert_uint_lt(count, (uint64_t)M * B * T); /* prompts and padding are masked */
    *global = sum / (double)count;
    *of_micro = micro_means / M;
    *of_rows = row_means / rows;
    m.iface->state_free(&m, &ctx, state);
    for (int u = 0; u < m.n_units; u++)
        free(params[u]);
    free(params);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&dev);
    fsdp_data_close(d);
    fsdp_model_free(&m);
    return count;
}

/* Prompt/completion rows train; the step loss is the mean over the global
 * batch's completion targets (computed by hand), not a mean of means; the
 * run is bit-identical on 1, 2 and 4 devices; eval of the same batches
 * gives the trainer's loss bit for bit. For GPT-2 and Llama. */
START_TEST(test_masked_loss)
{
    char dir[64] = "/tmp/fsdp_masked_XXXXXX", data[128], ck[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(data, sizeof data, "%s/rows.jsonl", dir);
    write_examples(data);
    const char *model = masked_models[_i];
    fsdp_train_config c;
    fsdp_train_result ref;
    masked_config(&c, model, data, 1);
    run_ok(&c, &ref);
    ck_assert_msg(ref.losses[2] < ref.losses[0], "%s does not learn the completions: %g -> %g",
                  model, ref.losses[0], ref.losses[2]);
    double global, of_micro, of_rows;
    uint64_t count = hand_losses(&c, &global, &of_micro, &of_rows);
    double rel = fabs(ref.losses[0] - global) / global;
    printf("masked %s: step-1 loss %.7f, by hand %.7f over %llu targets (rel %.1e); mean of "
           "micro-batch means %.7f, of row means %.7f\n", model, ref.losses[0], global,
           (unsigned long long)count, rel, of_micro, of_rows);
    ck_assert_msg(rel <= 1e-5, "loss %.9g, masked mean by hand %.9g", ref.losses[0], global);
    ck_assert_msg(fabs(of_micro - global) > 1e-3 * global && fabs(of_rows - global) > 1e-3 * global,
                  "the data does not tell the means apart");
    static const int devs[] = {2, 4};
    for (int k = 0; k < 2; k++) {
        fsdp_train_result r;
        masked_config(&c, model, data, devs[k]);
        c.eng.shard = k ? FSDP_SHARD_FULL : FSDP_SHARD_GRAD_OP;
        c.eng.offload = k == 1;
        run_ok(&c, &r);
        char what[64];
        snprintf(what, sizeof what, "masked rows on %d devices", devs[k]);
        fsdp_model m;
        ck_assert_int_eq(fsdp_model_from_spec(model, &m), FSDP_STATUS_OK);
        for (int s = 0; s < r.steps; s++)
            ck_assert_msg(!memcmp(&r.losses[s], &ref.losses[s], 4) &&
                              !memcmp(&r.grad_norms[s], &ref.grad_norms[s], 4),
                          "%s: step %d loss %.9g/%.9g", what, s + 1, r.losses[s], ref.losses[s]);
        for (int u = 0; u < m.n_units; u++)
            ck_assert_msg(!memcmp(r.params[u], ref.params[u], m.units[u].numel * 4),
                          "%s: unit %s differs", what, m.units[u].name);
        fsdp_model_free(&m);
        fsdp_train_result_free(&r);
    }
    /* eval of step 0's batches with the initial weights: the trainer's loss, bit for bit */
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(model, &m), FSDP_STATUS_OK);
    float **units = units_init(&m, c.eng.seed);
    snprintf(ck, sizeof ck, "%s/ck", dir);
    ck_assert_msg(fsdp_modelfile_write(ck, fsdp_modelfile_format_find("ckpt"), &m,
                                       (const float *const *)units, FSDP_DTYPE_F32) ==
                      FSDP_STATUS_OK, "%s", fsdp_error_msg());
    fsdp_infer_config ic;
    fsdp_infer_config_default(&ic);
    ic.backend = FSDP_BACKEND_CPU;
    ic.model_path = ck;
    ic.n_ranks = 2;
    ic.batch = c.eng.batch;
    ic.seq = c.eng.seq;
    ic.pack = c.pack; /* off, as the trainer's rows */
    ic.tokenizer = c.tokenizer;
    fsdp_infer_eval_result res;
    ck_assert_msg(fsdp_infer_eval(&ic, data, c.eng.seed, 4, &res) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    ck_assert_msg(!memcmp(&res.mean, &ref.losses[0], 4), "eval %.9g vs train %.9g", res.mean,
                  ref.losses[0]);
    for (int k = 0; k < 4; k++)
        ck_assert(isfinite(res.losses[k]) && res.losses[k] > 0.0f);
    free(res.losses);
    units_free(&m, units);
    fsdp_model_free(&m);
    fsdp_train_result_free(&ref);
    char rm[96];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST

/* ---- packed example rows -------------------------------------------------------- */

/* A Llama (rope, grouped-query attention) and a GPT-2 (learned positions, one kv head
 * per query head): both take positions (models/model.h's state_positions). */
static const char *const pack_models[] = {
    "llama:layers=2,heads=4,kv_heads=2,hidden=32,intermediate=64,head_dim=8,vocab=768,"
    "context=32",
    "gpt2:layers=2,heads=4,channels=32,vocab=768,context=32",
};

/* Short prompt/completion rows, several to a row of 32 once packed. */
static void write_short_examples(const char *path)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 20; i++)
        fprintf(f, "{\"prompt\": \"Q%d: %s?\", \"completion\": \"%s\"}\n", i,
                i % 3 ? "why" : "how many foxes", i % 2 ? " 7" : " a few");
    fclose(f);
}

/* Global batch of 8 rows of 32, packed, on N devices (8 / N micro-steps of one row). */
static void pack_config(fsdp_train_config *c, const char *model, const char *data,
                        int devices)
{
    train_config_tiny(c, devices, 0);
    c->eng.seq = 32;
    c->model = model;
    c->data = data;
    c->tokenizer = "tests/fixtures/tok_llama3.json";
    c->pack = FSDP_TRAIN_PACK_ON;
}

/* Cross-entropy in double of the targets of in/tg[0..T) run alone through the model. */
static double row_loss(const fsdp_model *m, fsdp_op_ctx *ctx, void *state, float **params,
                       const int *in, const int *tg, int T, uint64_t *count)
{
    memcpy(m->iface->state_tokens(state), in, (size_t)T * sizeof(int));
    memcpy(m->iface->state_targets(state), tg, (size_t)T * sizeof(int));
    ck_assert_int_eq(m->iface->root_forward(m, ctx, state, params[0]), FSDP_STATUS_OK);
    for (int u = 1; u < m->n_units; u++)
        ck_assert_int_eq(m->iface->unit_forward(m, ctx, state, u, params[u]), FSDP_STATUS_OK);
    ck_assert_int_eq(m->iface->head_forward_backward(m, ctx, state, params[0], NULL, 1.0f, NULL),
                     FSDP_STATUS_OK);
    const float *lg = m->iface->state_logits(state);
    double sum = 0;
    for (int t = 0; t < T; t++) {
        if (tg[t] < 0)
            continue;
        const float *row = lg + (size_t)t * (size_t)m->padded_vocab_size;
        double mx = row[0], se = 0;
        for (int j = 1; j < m->vocab_size; j++)
            mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < m->vocab_size; j++)
            se += exp((double)row[j] - mx);
        sum += log(se) + mx - row[tg[t]];
        (*count)++;
    }
    return sum;
}

/* The step-1 loss of packed data by hand: every example of the global batch's rows (cut at
 * its position 0) run alone, unpacked, from the start of a row of its own, through the
 * initial model; the mean over all their targets. Packing is right only if it equals the
 * trainer's. *n_examples: how many examples the rows held. */
static double packed_hand_loss(const fsdp_train_config *c, int *n_examples)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(c->model, &m), FSDP_STATUS_OK);
    fsdp_data_opts o = {.spec = c->data, .seed = c->eng.seed, .tokenizer = c->tokenizer};
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_OK);
    const int T = c->eng.seq, rows = 8;
    ck_assert_int_eq(fsdp_data_pack(d, T), FSDP_STATUS_OK);
    fsdp_device dev;
    fsdp_op_ctx ctx;
    ck_assert_int_eq(fsdp_device_init(&dev, FSDP_BACKEND_CPU, NULL, 0, 0, 0), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ops_init(&ctx, &dev, FSDP_DTYPE_F32), FSDP_STATUS_OK);
    float **params = units_init(&m, c->eng.seed);
    void *state = NULL;
    ck_assert_int_eq(m.iface->state_init(&m, &ctx, 1, T, false, &state), FSDP_STATUS_OK);
    int in[64], tg[64], pos[64], one_in[64], one_tg[64];
    double sum = 0;
    uint64_t count = 0;
    *n_examples = 0;
    for (int k = 0; k < rows; k++) {
        ck_assert_int_eq(fsdp_data_batch_pos(d, (uint64_t)k, 1, T, in, tg, pos), FSDP_STATUS_OK);
        for (int o0 = 0; o0 < T;) {
            int n = 1;
            while (o0 + n < T && pos[o0 + n] == n)
                n++;
            for (int t = 0; t < T; t++) {
                one_in[t] = t < n ? in[o0 + t] : 0;
                one_tg[t] = t < n ? tg[o0 + t] : -1;
            }
            if (n > 1)
                (*n_examples)++;
            sum += row_loss(&m, &ctx, state, params, one_in, one_tg, T, &count);
            o0 += n;
        }
    }
    ck_assert_uint_gt(count, 0);
    m.iface->state_free(&m, &ctx, state);
    units_free(&m, params);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&dev);
    fsdp_data_close(d);
    fsdp_model_free(&m);
    return sum / (double)count;
}

/* Packed example rows: the step-1 loss is that of each example alone (attention and
 * positions restart at each example: fails when the model sees across them), more
 * examples than rows, and the run is bit-identical on 1, 2, 4 and 8 devices with
 * grad-op, full (with the optimizer offloaded) and hybrid sharding; for each model of
 * pack_models, --pack auto packing it. */
START_TEST(test_packed_rows)
{
    const char *model = pack_models[_i];
    char dir[64] = "/tmp/fsdp_packed_XXXXXX", data[128];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(data, sizeof data, "%s/rows.jsonl", dir);
    write_short_examples(data);
    fsdp_train_config c;
    fsdp_train_result ref;
    pack_config(&c, model, data, 1);
    c.pack = FSDP_TRAIN_PACK_AUTO;
    run_ok(&c, &ref);
    ck_assert_msg(ref.losses[2] < ref.losses[0], "packed rows do not train: %g -> %g",
                  ref.losses[0], ref.losses[2]);
    int n_ex = 0;
    double hand = packed_hand_loss(&c, &n_ex);
    double rel = fabs(ref.losses[0] - hand) / hand;
    printf("packed %.4s: step-1 loss %.7f, each example alone %.7f (rel %.1e), %d examples in "
           "8 rows\n", model, ref.losses[0], hand, rel, n_ex);
    ck_assert_msg(rel <= 1e-6, "packed loss %.9g, examples alone %.9g", ref.losses[0], hand);
    ck_assert_int_gt(n_ex, 12); /* 8 rows hold 1.5 examples or more each */
    static const int devs[] = {2, 4, 8};
    static const fsdp_shard_strategy shard[] = {FSDP_SHARD_GRAD_OP, FSDP_SHARD_FULL,
                                                FSDP_SHARD_HYBRID};
    for (int k = 0; k < 3; k++) {
        fsdp_train_result r;
        pack_config(&c, model, data, devs[k]);
        c.eng.shard = shard[k];
        c.eng.n_nodes = shard[k] == FSDP_SHARD_HYBRID ? 2 : 1;
        c.eng.offload = shard[k] == FSDP_SHARD_FULL;
        run_ok(&c, &r);
        char what[64];
        snprintf(what, sizeof what, "packed rows on %d devices", devs[k]);
        expect_identical_runs(&ref, &r, model, what);
        fsdp_train_result_free(&r);
    }
    fsdp_train_result_free(&ref);
    char rm[96];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST

/* ---- threads per device ------------------------------------------------------- */

/* A GPT-2 and a GQA Llama (rope, rmsnorm, swiglu, grouped attention) big
 * enough that GEMMs are tiled and element-wise ops split into several
 * chunks at 8 x 64 tokens per micro-batch. */
static const char *const thread_models[] = {
    "small",
    "llama:layers=2,heads=8,kv_heads=2,hidden=256,intermediate=688,head_dim=32,vocab=512,"
    "context=64",
};

/* Threads per device never change the math: 1, 2 and 3 threads per device
 * (2 devices; the test hook lifts the cap at the machine's cores) give the
 * same losses, gradient norms and parameters, in fp32 and bf16. */
START_TEST(test_threads_per_device_bit_identical)
{
    const char *model = thread_models[_i];
    fsdp_device_cpu_test_cores(64);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        fsdp_train_result ref;
        /* sanitizer builds: 1 and 3 threads (a team with a middle thread) */
        for (int t = 1; t <= 3; t += FSDP_TEST_TSAN || FSDP_TEST_ASAN ? 2 : 1) {
            fsdp_train_config c;
            train_config_tiny(&c, 2, 1);
            c.model = model;
            c.eng.batch = 8;
            c.eng.seq = 64;
            c.steps = 2;
            c.eng.threads_per_device = t;
            c.eng.compute_dtype = bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
            fsdp_train_result r;
            run_ok(&c, t == 1 ? &ref : &r);
            if (t == 1)
                continue;
            char what[160];
            snprintf(what, sizeof what, "%.40s, %s, %d threads vs 1", model,
                     bf16 ? "bf16" : "fp32", t);
            expect_identical_runs(&ref, &r, model, what);
            fsdp_train_result_free(&r);
        }
        ck_assert(isfinite(ref.losses[1]) && ref.losses[1] < ref.losses[0]);
        fsdp_train_result_free(&ref);
    }
    fsdp_device_cpu_test_cores(0);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"engine", 600,
         FSDP_TESTS(test_determinism_matrix, test_grad_accum_matches,
                    test_sharded_matches_unsharded, test_offload_identical, test_bf16_trains_close,
                    test_comm_bytes_formula, test_peak_memory_falls, test_oom_under_cap,
                    test_bad_configs, test_offload_overlap, test_many_micro_batches,
                    test_eight_ranks_prefetch_offload, FSDP_TEST_LOOP(test_masked_loss, 2),
                    test_synthetic_eval_same_across_devices,
                    FSDP_TEST_LOOP(test_threads_per_device_bit_identical,
                                   (int)(sizeof thread_models / sizeof thread_models[0])))},
        {"offload_params", 300, .tmpdir = true,
         FSDP_TESTS(test_offload_params_identical, test_offload_params_resume)},
        {"pack", 300,
         FSDP_TESTS(FSDP_TEST_LOOP(test_packed_rows,
                                   (int)(sizeof pack_models / sizeof pack_models[0])))},
        {"accum", 120, .tmpdir = true,
         FSDP_TESTS(test_accum_flat_devices, test_accum_flat_is_tree_below_4,
                    test_accum_flat_resume)},
        {"recompute", 600,
         FSDP_TESTS(FSDP_TEST_LOOP(test_recompute_identical, N_RECOMPUTE_MODELS),
                    test_recompute_memory_formula,
                    FSDP_TEST_LOOP(test_recompute_schedule, N_RECOMPUTE_MODELS),
                    test_recompute_refused, test_recompute_flops,
                    FSDP_TEST_LOOP(test_recompute_identical_cuda, N_RECOMPUTE_MODELS))},
    };
    return fsdp_test_main("engine", tcases, FSDP_TEST_LEN(tcases));
}
