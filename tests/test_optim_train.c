/*
 * test_optim_train.c - optimizers through the whole engine: SGD with
 * momentum against PyTorch (tools/gen_optim_golden.py ->
 * tests/fixtures/sgd_golden/: per-step losses, gradient norms and the final
 * weights of torch.optim.SGD with clipping and weight decay on the same
 * model, weights and batch), then the same run bit for bit with its state
 * offloaded to the CPU, on other device counts and sharding strategies, in
 * bf16, and across a checkpoint and resume onto another world; a
 * checkpoint refuses to resume into another optimizer; the trace names the
 * optimizer's host step.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "core/error.h"
#include "file_util.h"
#include "models/registry.h"
#include "testutil.h"
#include "train/train.h"
#include "train_util.h"

#define GOLDEN_DIR "tests/fixtures/sgd_golden"
#define MAX_STEPS 16

/* ---- the golden run ---------------------------------------------------------- */

typedef struct golden {
    char model[128];
    int batch, seq, steps;
    float lr, momentum, wd, clip;
    double loss[MAX_STEPS], grad_norm[MAX_STEPS];
} golden;

static void golden_read(golden *g)
{
    char *text = slurp(GOLDEN_DIR "/golden.txt");
    memset(g, 0, sizeof *g);
    char optimizer[16] = "";
    int n_loss = 0, n_norm = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int s;
        double x;
        if (sscanf(line, "loss %d %lf", &s, &x) == 2 && s >= 1 && s <= MAX_STEPS)
            g->loss[s - 1] = x, n_loss++;
        else if (sscanf(line, "grad_norm %d %lf", &s, &x) == 2 && s >= 1 && s <= MAX_STEPS)
            g->grad_norm[s - 1] = x, n_norm++;
        else
            (void)(sscanf(line, "model %127s", g->model) || sscanf(line, "batch %d", &g->batch) ||
                   sscanf(line, "seq %d", &g->seq) || sscanf(line, "steps %d", &g->steps) ||
                   sscanf(line, "lr %f", &g->lr) || sscanf(line, "momentum %f", &g->momentum) ||
                   sscanf(line, "weight_decay %f", &g->wd) || sscanf(line, "clip %f", &g->clip) ||
                   sscanf(line, "optimizer %15s", optimizer));
    }
    free(text);
    REQUIRE(!strcmp(optimizer, "sgd") && g->model[0] && g->batch > 0 && g->seq > 0 &&
                g->steps >= 2 && g->steps <= MAX_STEPS && n_loss == g->steps &&
                n_norm == g->steps && g->lr > 0 && g->momentum > 0 && g->wd > 0 && g->clip > 0,
            GOLDEN_DIR "/golden.txt is incomplete");
}

/* The golden run's configuration on `devices` devices with the global batch
 * of two micro-batches (each the golden batch: the data file holds exactly
 * one batch, so every micro-batch is the same). */
static void sgd_config(fsdp_train_config *c, const golden *g, int devices)
{
    fsdp_train_config_default(c);
    c->eng.backend = FSDP_BACKEND_CPU;
    c->eng.n_ranks = devices;
    c->eng.grad_accum = 2 / devices;
    c->eng.batch = g->batch;
    c->eng.seq = g->seq;
    c->eng.deterministic = true;
    c->eng.optim = &fsdp_optim_sgd;
    ck_assert_int_eq(fsdp_optim_hparam_set(&fsdp_optim_sgd, &c->eng.optim_hp, "momentum",
                                           g->momentum), FSDP_STATUS_OK);
    c->eng.optim_hp.weight_decay = g->wd;
    c->eng.clip = g->clip;
    c->model = GOLDEN_DIR "/init.bin";
    c->data = GOLDEN_DIR "/tokens.bin";
    c->steps = g->steps;
    c->lr = g->lr;
    c->warmup = 0;
    c->lr_min_frac = 1.0f; /* a constant learning rate, as the reference */
    c->eval_problems = 0;
    c->n_samples = 0;
    c->keep_params = true;
    c->out = NULL;
}

/* Bit-identical losses from `from` on, and final parameters. */
static void expect_identical(const fsdp_train_result *a, const fsdp_train_result *b, int from,
                             const char *what)
{
    REQUIRE(a->steps == b->steps && a->n_units == b->n_units, "%s: shapes differ", what);
    for (int s = from; s < a->steps; s++) {
        REQUIRE(!memcmp(&a->losses[s], &b->losses[s], 4), "%s: step %d loss %.9g vs %.9g", what,
                s + 1, a->losses[s], b->losses[s]);
        REQUIRE(!memcmp(&a->grad_norms[s], &b->grad_norms[s], 4),
                "%s: step %d grad norm %.9g vs %.9g", what, s + 1, a->grad_norms[s],
                b->grad_norms[s]);
    }
    fsdp_modelfile *mf;
    fsdp_model m;
    ck_assert_int_eq(fsdp_modelfile_resolve(GOLDEN_DIR "/init.bin", &m, &mf), FSDP_STATUS_OK);
    for (int u = 0; u < m.n_units; u++)
        REQUIRE(!memcmp(a->params[u], b->params[u], m.units[u].numel * 4),
                "%s: final parameters of unit %s differ", what, m.units[u].name);
    fsdp_model_free(&m);
    fsdp_modelfile_close(mf);
}

/* max |a - b| / max |b| over one unit's parameters. */
static double rel_err(const float *a, const float *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

START_TEST(test_sgd_matches_pytorch)
{
    golden g;
    golden_read(&g);
    fsdp_train_config c;
    fsdp_train_result r;
    sgd_config(&c, &g, 1);
    run_ok_as(&c, &r, "sgd, 1 device");
    ck_assert_int_eq(r.steps, g.steps);
    for (int s = 0; s < g.steps; s++) {
        double lerr = fabs(r.losses[s] - g.loss[s]) / g.loss[s];
        double nerr = fabs(r.grad_norms[s] - g.grad_norm[s]) / g.grad_norm[s];
        /* fp32 against float64: about one rounding (measured up to 2e-7) */
        REQUIRE(lerr < 1e-6 && nerr < 2e-6,
                "step %d: loss %.9g vs PyTorch %.9g (rel %.2e), grad norm %.9g vs %.9g (rel "
                "%.2e)", s + 1, r.losses[s], g.loss[s], lerr, r.grad_norms[s], g.grad_norm[s],
                nerr);
    }
    /* the final weights, unit by unit, against PyTorch's */
    fsdp_modelfile *mf;
    fsdp_model m;
    ck_assert_int_eq(fsdp_modelfile_resolve(GOLDEN_DIR "/final.bin", &m, &mf), FSDP_STATUS_OK);
    ck_assert_int_eq(r.n_units, m.n_units);
    for (int u = 0; u < m.n_units; u++) {
        size_t n = m.units[u].numel;
        float *want = malloc(n * sizeof *want);
        ck_assert_int_eq(fsdp_modelfile_read_range(mf, u, 0, n, want), FSDP_STATUS_OK);
        double e = rel_err(r.params[u], want, n);
        REQUIRE(e < 2e-6, "unit %s: final parameters differ from PyTorch's by %.2e (relative)",
                m.units[u].name, e);
        free(want);
    }
    /* the update moved them: not a run that skipped its steps */
    fsdp_modelfile *init;
    ck_assert_int_eq(fsdp_modelfile_open(&init, GOLDEN_DIR "/init.bin"), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_modelfile_bind(init, &m), FSDP_STATUS_OK);
    float *w0 = malloc(m.units[1].numel * sizeof *w0);
    ck_assert_int_eq(fsdp_modelfile_read_range(init, 1, 0, m.units[1].numel, w0),
                     FSDP_STATUS_OK);
    ck_assert(rel_err(r.params[1], w0, m.units[1].numel) > 1e-3);
    free(w0);
    fsdp_modelfile_close(init);
    fsdp_modelfile_close(mf);
    fsdp_model_free(&m);
    fsdp_train_result_free(&r);
}
END_TEST

/* The same run, bit for bit: offloaded to the CPU, on 2 devices, with
 * every sharding strategy; in bf16, device and offload agree. */
START_TEST(test_sgd_offload_and_sharding_identical)
{
    golden g;
    golden_read(&g);
    fsdp_train_config c;
    fsdp_train_result ref, r;
    sgd_config(&c, &g, 1);
    run_ok_as(&c, &ref, "reference");
    for (int k = 0; k < 4; k++) {
        sgd_config(&c, &g, k == 0 ? 1 : 2);
        c.eng.offload = k != 2;
        c.eng.shard = k == 3 ? FSDP_SHARD_GRAD_OP : k == 2 ? FSDP_SHARD_NONE : FSDP_SHARD_FULL;
        char what[96];
        snprintf(what, sizeof what, "%d device(s), shard %s, offload %s", c.eng.n_ranks,
                 fsdp_shard_strategy_name(c.eng.shard), c.eng.offload ? "optimizer" : "none");
        run_ok_as(&c, &r, what);
        expect_identical(&ref, &r, 0, what);
        fsdp_train_result_free(&r);
    }
    fsdp_train_result_free(&ref);
    /* bf16: the compute copy written by the device step and by the host step */
    sgd_config(&c, &g, 1);
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    run_ok_as(&c, &ref, "bf16");
    sgd_config(&c, &g, 2);
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    c.eng.offload = true;
    run_ok_as(&c, &r, "bf16, offload");
    expect_identical(&ref, &r, 0, "bf16: device vs offload");
    ck_assert(fabsf(ref.losses[g.steps - 1] - (float)g.loss[g.steps - 1]) < 0.05f);
    fsdp_train_result_free(&ref);
    fsdp_train_result_free(&r);
}
END_TEST

/* Save on 2 devices (state in device memory), resume on 1 device with
 * grad-op sharding and offload: the momentum buffer comes back exactly;
 * AdamW may not resume from it, nor SGD from AdamW's. */
START_TEST(test_sgd_checkpoint_resume_reshard)
{
    golden g;
    golden_read(&g);
    char ck[96], ck2[96];
    fsdp_test_path(ck, sizeof ck, "sgd");
    fsdp_test_path(ck2, sizeof ck2, "adamw");
    fsdp_train_config c;
    fsdp_train_result ref, a, b;
    sgd_config(&c, &g, 1);
    run_ok_as(&c, &ref, "reference");
    sgd_config(&c, &g, 2);
    c.ckpt_dir = ck;
    c.stop_after = g.steps / 2;
    c.ckpt_every = g.steps / 2;
    run_ok_as(&c, &a, "first half");
    sgd_config(&c, &g, 1);
    c.ckpt_dir = ck;
    c.resume = true;
    c.eng.shard = FSDP_SHARD_GRAD_OP;
    c.eng.offload = true;
    run_ok_as(&c, &b, "resumed on 1 device");
    ck_assert_int_eq(b.first_step, g.steps / 2);
    expect_identical(&ref, &b, g.steps / 2, "uninterrupted vs saved on 2, resumed on 1");
    /* the manifest names the optimizer and its one state array */
    char p[192];
    pathf(p, sizeof p, "%s/step_%08d/manifest", ck, g.steps / 2);
    char *text = slurp(p);
    REQUIRE(strstr(text, "\noptimizer sgd\n") && strstr(text, "\noptim_state momentum\n"), "%s",
            text);
    free(text);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);

    /* another optimizer is refused before anything is loaded */
    sgd_config(&c, &g, 2);
    c.ckpt_dir = ck;
    c.resume = true;
    c.eng.optim = NULL; /* the default: AdamW */
    fsdp_status st = fsdp_train_run(&c, &a);
    fsdp_train_result_free(&a);
    REQUIRE(st == FSDP_STATUS_INVALID_ARG && strstr(fsdp_error_msg(), "--optimizer sgd") &&
                strstr(fsdp_error_msg(), "momentum") && strstr(fsdp_error_msg(), "adam_m"),
            "%s: %s", fsdp_status_name(st), fsdp_error_msg());
    sgd_config(&c, &g, 2);
    c.eng.optim = &fsdp_optim_adamw;
    c.ckpt_dir = ck2;
    c.stop_after = 2;
    c.ckpt_every = 2;
    run_ok_as(&c, &a, "adamw first half");
    fsdp_train_result_free(&a);
    sgd_config(&c, &g, 2);
    c.ckpt_dir = ck2;
    c.resume = true;
    st = fsdp_train_run(&c, &a);
    fsdp_train_result_free(&a);
    REQUIRE(st == FSDP_STATUS_INVALID_ARG && strstr(fsdp_error_msg(), "--optimizer adamw"),
            "%s: %s", fsdp_status_name(st), fsdp_error_msg());
    fsdp_train_result_free(&ref);
}
END_TEST

/* With offload, the trace's CPU optimizer track shows the optimizer's own
 * step, once per unit and step. */
START_TEST(test_sgd_trace_names_the_step)
{
    golden g;
    golden_read(&g);
    char path[128];
    fsdp_test_path(path, sizeof path, "trace.json");
    fsdp_train_config c;
    fsdp_train_result r;
    sgd_config(&c, &g, 1);
    c.eng.offload = true;
    c.steps = 2;
    c.trace_path = path;
    run_ok_as(&c, &r, "traced");
    fsdp_train_result_free(&r);
    char *t = slurp(path);
    int n = 0;
    for (const char *p = t; (p = strstr(p, "\"name\":\"sgd\"")); p++)
        n++;
    REQUIRE(n == 2 * 3, "%d sgd events in the trace (want 2 steps x 3 units)", n);
    REQUIRE(!strstr(t, "\"name\":\"adamw\""), "an adamw event in an sgd run");
    free(t);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"sgd", 300, .tmpdir = true,
         FSDP_TESTS(test_sgd_matches_pytorch, test_sgd_offload_and_sharding_identical,
                    test_sgd_checkpoint_resume_reshard, test_sgd_trace_names_the_step)},
    };
    return fsdp_test_main("optim_train", tcases, FSDP_TEST_LEN(tcases));
}
