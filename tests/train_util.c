/*
 * train_util.c - training runs for the suites (train_util.h).
 */
#include "train_util.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "core/names.h"
#include "engine/engine.h"
#include "model_rig.h"
#include "models/registry.h"
#include "testutil.h"

void train_config_cpu(fsdp_train_config *c, const char *model, int devices)
{
    fsdp_train_config_default(c);
    c->eng.backend = FSDP_BACKEND_CPU;
    c->eng.n_ranks = devices;
    c->eng.seq = 16;
    c->model = model;
    c->data = "synthetic";
    c->eval_problems = 0;
    c->out = NULL;
}

void train_config_tiny(fsdp_train_config *c, int devices, int accum)
{
    train_config_cpu(c, "tiny", devices);
    c->eng.grad_accum = accum ? accum : 8 / devices;
    c->eng.batch = 8 / (devices * c->eng.grad_accum);
    c->eng.deterministic = true;
    c->steps = 3;
    c->warmup = 1;
    c->lr = 1e-2f;
    c->keep_params = true;
}

void expect_identical_runs(const fsdp_train_result *a, const fsdp_train_result *b,
                           const char *model, const char *what)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(model, &m), FSDP_STATUS_OK);
    expect_identical_runs_of(a, b, &m, what);
    fsdp_model_free(&m);
}

void expect_identical_runs_of(const fsdp_train_result *a, const fsdp_train_result *b,
                              const fsdp_model *m, const char *what)
{
    ck_assert_int_eq(a->steps, b->steps);
    for (int s = 0; s < a->steps; s++) {
        ck_assert_msg(!memcmp(&a->losses[s], &b->losses[s], sizeof(float)),
                      "%s: step %d loss %.9g vs %.9g", what, s + 1, a->losses[s], b->losses[s]);
        ck_assert_msg(!memcmp(&a->grad_norms[s], &b->grad_norms[s], sizeof(float)),
                      "%s: step %d grad norm %.9g vs %.9g", what, s + 1, a->grad_norms[s],
                      b->grad_norms[s]);
    }
    ck_assert_int_eq(a->n_units, m->n_units);
    ck_assert_int_eq(b->n_units, m->n_units);
    for (int u = 0; u < m->n_units; u++) {
        ck_assert_ptr_nonnull(a->params[u]);
        ck_assert_ptr_nonnull(b->params[u]);
        ck_assert_msg(!memcmp(a->params[u], b->params[u], m->units[u].numel * sizeof(float)),
                      "%s: final parameters of unit %s differ", what, m->units[u].name);
    }
}

void run_ok_as(const fsdp_train_config *c, fsdp_train_result *r, const char *what)
{
    fsdp_status st = fsdp_train_run(c, r);
    REQUIRE(st == FSDP_STATUS_OK, "%s: %s: %s", what, fsdp_status_name(st), fsdp_error_msg());
}

void run_ok(const fsdp_train_config *c, fsdp_train_result *r)
{
    char what[256];
    snprintf(what, sizeof what, "training %s failed", c->model);
    run_ok_as(c, r, what);
}

void expect_recompute_savings(fsdp_train_config *c, int L, size_t block_drop, size_t elem_drop)
{
    size_t act[FSDP_RECOMPUTE_COUNT], peak[FSDP_RECOMPUTE_COUNT];
    for (int mode = 0; mode < FSDP_RECOMPUTE_COUNT; mode++) {
        fsdp_train_result r;
        c->eng.recompute = (fsdp_recompute)mode;
        c->steps = 1;
        c->keep_params = false;
        run_ok(c, &r);
        act[mode] = r.stats[0].mem.peak_kind_bytes[FSDP_MEM_ACT];
        peak[mode] = r.stats[0].peak_bytes;
        fsdp_train_result_free(&r);
    }
    ck_assert_uint_eq(act[FSDP_RECOMPUTE_NONE] - act[FSDP_RECOMPUTE_BLOCK],
                      (size_t)(L - 1) * block_drop);
    ck_assert_uint_eq(act[FSDP_RECOMPUTE_NONE] - act[FSDP_RECOMPUTE_ELEMENTWISE],
                      (size_t)(L - 1) * elem_drop);
    for (int mode = 1; mode < FSDP_RECOMPUTE_COUNT; mode++)
        REQUIRE(peak[0] - peak[mode] == act[0] - act[mode],
                "%s, %s, recompute %s: the peak fell by %zu, activations by %zu", c->model,
                fsdp_dtype_name(c->eng.compute_dtype),
                fsdp_names_name(&fsdp_recompute_names, mode), peak[0] - peak[mode],
                act[0] - act[mode]);
}

void write_nan_tiny_model(const char *path, int unit, size_t index)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    float **units = units_alloc(&m);
    ck_assert(unit < m.n_units && index < m.units[unit].numel);
    units[unit][index] = NAN;
    ck_assert_int_eq(fsdp_modelfile_write(path, fsdp_modelfile_format_of(path), &m,
                                          (const float *const *)units, FSDP_DTYPE_F32),
                     FSDP_STATUS_OK);
    units_free(&m, units);
    fsdp_model_free(&m);
}

void run_fail(const fsdp_train_config *c, fsdp_status want, const char *a, const char *b)
{
    fsdp_train_result r;
    fsdp_status st = fsdp_train_run(c, &r);
    char msg[FSDP_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", fsdp_error_msg());
    fsdp_train_result_free(&r);
    REQUIRE(st == want, "expected %s, got %s: %s", fsdp_status_name(want), fsdp_status_name(st),
            msg);
    REQUIRE(!a || strstr(msg, a), "message lacks '%s': %s", a, msg);
    REQUIRE(!b || strstr(msg, b), "message lacks '%s': %s", b, msg);
}

void expect_same_units(const fsdp_ckpt_manifest *got, const fsdp_ckpt_manifest *want)
{
    ck_assert_int_eq(got->n_units, want->n_units);
    for (int u = 0; u < want->n_units; u++) {
        const fsdp_ckpt_unit *g = &got->units[u], *w = &want->units[u];
        ck_assert_str_eq(g->name, w->name);
        ck_assert_uint_eq(g->shard_numel, w->shard_numel);
        ck_assert_uint_eq(g->padded_numel, w->padded_numel);
        ck_assert_int_eq(g->n_params, w->n_params);
        for (int i = 0; i < w->n_params; i++) {
            ck_assert_str_eq(g->params[i].name, w->params[i].name);
            ck_assert_uint_eq(g->params[i].offset, w->params[i].offset);
            ck_assert_int_eq(g->params[i].ndim, w->params[i].ndim);
            ck_assert_int_eq(g->params[i].shape[0], w->params[i].shape[0]);
        }
    }
}
