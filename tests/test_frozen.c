/*
 * test_frozen.c - frozen parameters in the engine (--freeze; LoRA's base):
 * a frozen parameter keeps its initial value, has no gradient, optimizer
 * state or reduction, and what trains trains exactly as it would with
 * nothing frozen; the guarantees of every run (bit-identity across device
 * counts, strategies, offload and accumulation) hold with a frozen segment.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/lora.h"
#include "models/registry.h"
#include "testutil.h"
#include "train_util.h"

#define FROZEN_MODEL "llama-tiny"
/* the MLPs, the embeddings and one norm: a trainable and a frozen segment in every unit */
#define FROZEN_PATTERNS "model.layers.*.mlp.*,model.embed_tokens.weight,model.layers.1.input_*"

static void frozen_config(fsdp_train_config *c, int devices, const char *freeze)
{
    train_config_cpu(c, FROZEN_MODEL, devices);
    c->eng.grad_accum = 4 / devices > 0 ? 4 / devices : 1;
    c->eng.batch = 4 / (devices * c->eng.grad_accum) > 0 ? 4 / (devices * c->eng.grad_accum) : 1;
    c->eng.deterministic = true;
    c->steps = 3;
    c->warmup = 1;
    c->lr = 1e-2f;
    c->eng.optim_hp.weight_decay = 0.1f;
    c->keep_params = true;
    c->freeze = freeze;
}

/* The model the run trains, laid out as the engine holds it. */
static void frozen_model(fsdp_model *m, const char *freeze)
{
    ck_assert_int_eq(fsdp_model_from_spec(FROZEN_MODEL, m), FSDP_STATUS_OK);
    if (freeze)
        ck_assert_int_eq(fsdp_model_freeze(m, freeze), FSDP_STATUS_OK);
}

/* Parameter `name`'s values in a kept unit buffer of model m. */
static const float *param_in(const fsdp_model *m, float *const *params, const char *name,
                             size_t *numel)
{
    int u;
    const fsdp_param_spec *p = fsdp_model_find_param(m, name, &u);
    ck_assert_ptr_nonnull(p);
    *numel = p->numel;
    return params[u] + p->offset;
}

/* One step without clipping: a gradient does not depend on what else is frozen, so every
 * trainable parameter ends bit for bit where the run without frozen parameters puts it, and
 * every frozen one stays at its initial value (which the full run does move). */
START_TEST(test_frozen_step_matches_full)
{
    fsdp_model full, fz;
    frozen_model(&full, NULL);
    frozen_model(&fz, FROZEN_PATTERNS);
    ck_assert_uint_lt(fz.train_numel, full.train_numel);
    ck_assert_uint_gt(fz.train_numel, 0);
    fsdp_train_config c;
    fsdp_train_result a, b;
    frozen_config(&c, 2, NULL);
    c.steps = 1;
    c.eng.clip = 0.0f;
    run_ok_as(&c, &a, "full");
    frozen_config(&c, 2, FROZEN_PATTERNS);
    c.steps = 1;
    c.eng.clip = 0.0f;
    run_ok_as(&c, &b, "frozen");
    ck_assert_msg(!memcmp(&a.losses[0], &b.losses[0], sizeof(float)), "step 1 loss %.9g vs %.9g",
                  a.losses[0], b.losses[0]);
    int n_frozen = 0, n_trained = 0;
    for (int u = 0; u < fz.n_units; u++)
        for (int i = 0; i < fz.units[u].n_params; i++) {
            const fsdp_param_spec *p = &fz.units[u].params[i];
            size_t n, n2;
            const float *got = param_in(&fz, b.params, p->name, &n);
            const float *moved = param_in(&full, a.params, p->name, &n2);
            ck_assert_uint_eq(n, n2);
            if (p->frozen) {
                float *init = malloc(n * sizeof(float));
                fsdp_model_init_range(&fz, u, p->offset, p->offset + n, c.eng.seed, init);
                ck_assert_msg(!memcmp(got, init, n * sizeof(float)),
                              "frozen %s moved during the step", p->name);
                ck_assert_msg(memcmp(moved, init, n * sizeof(float)),
                              "%s does not move in the full run either: the test proves nothing",
                              p->name);
                free(init);
                n_frozen++;
            } else {
                ck_assert_msg(!memcmp(got, moved, n * sizeof(float)),
                              "trainable %s differs from the run without frozen parameters",
                              p->name);
                n_trained++;
            }
        }
    ck_assert_int_gt(n_frozen, 3);
    ck_assert_int_gt(n_trained, 3);
    /* no gradient or optimizer state for what is frozen: the ledger's peaks */
    size_t g_full = a.stats[0].mem.peak_kind_bytes[FSDP_MEM_OPTIM];
    size_t g_fz = b.stats[0].mem.peak_kind_bytes[FSDP_MEM_OPTIM];
    ck_assert_msg(g_fz < g_full, "optimizer state %zu bytes with frozen parameters, %zu without",
                  g_fz, g_full);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
    fsdp_model_free(&full);
    fsdp_model_free(&fz);
}
END_TEST

/* Bit-identity across device counts, strategies, offload and accumulation, with clipping;
 * offload: none, optimizer, and (v 2) optimizer,params, with every parameter shard, frozen
 * and trainable, in pinned host memory. */
START_TEST(test_frozen_identical_everywhere)
{
    fsdp_train_config c;
    fsdp_train_result ref, r;
    frozen_config(&c, 1, FROZEN_PATTERNS);
    run_ok_as(&c, &ref, "frozen, 1 device");
    ck_assert_msg(ref.losses[2] < ref.losses[0], "does not train: %g -> %g", ref.losses[0],
                  ref.losses[2]);
    static const int devs[] = {2, 4};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int v = 0; v < 3; v++) {
                frozen_config(&c, devs[d], FROZEN_PATTERNS);
                c.eng.shard = (fsdp_shard_strategy)s;
                c.eng.offload = v >= 1;
                c.eng.offload_params = v == 2;
                if (s == FSDP_SHARD_HYBRID)
                    c.eng.n_nodes = 2;
                c.eng.direct_numel = (d + s + v) % 2 ? 1 : 0; /* shardmap.h's groups */
                char what[160];
                snprintf(what, sizeof what, "frozen, %d devices, %s, offload %s, %s groups",
                         devs[d], fsdp_shard_strategy_name(c.eng.shard),
                         fsdp_names_name(&fsdp_offload_names, fsdp_offload_value(&c.eng)),
                         c.eng.direct_numel ? "direct" : "packed");
                run_ok_as(&c, &r, what);
                expect_identical_runs(&ref, &r, FROZEN_MODEL, what);
                fsdp_train_result_free(&r);
            }
    fsdp_train_result_free(&ref);
}
END_TEST

/* A run resumed from a checkpoint of frozen parameters (which holds the trainable ones only,
 * and a reference to the base) on another device count ends bit for bit where the
 * uninterrupted run does; another --freeze, or another base, is refused naming both. */
START_TEST(test_frozen_resume)
{
    char dir[4096], base[4096], cmd[9000];
    fsdp_test_path(dir, sizeof dir, "ck");
    fsdp_train_config c;
    fsdp_train_result ref, r;
    frozen_config(&c, 2, FROZEN_PATTERNS);
    c.steps = 4;
    run_ok_as(&c, &ref, "uninterrupted");
    c.ckpt_dir = dir;
    c.ckpt_every = 2;
    c.stop_after = 2; /* as a crash after step 2's checkpoint */
    run_ok_as(&c, &r, "first half");
    fsdp_train_result_free(&r);
    frozen_config(&c, 4, FROZEN_PATTERNS);
    c.eng.batch = 1;
    c.eng.grad_accum = 1;
    c.steps = 4;
    c.ckpt_dir = dir;
    c.resume = true;
    run_ok_as(&c, &r, "resumed on 4 devices");
    ck_assert_int_eq(r.first_step, 2);
    for (int s = 2; s < 4; s++)
        ck_assert_msg(!memcmp(&r.losses[s], &ref.losses[s], sizeof(float)),
                      "step %d: resumed %.9g, uninterrupted %.9g", s + 1, r.losses[s],
                      ref.losses[s]);
    fsdp_model m;
    frozen_model(&m, FROZEN_PATTERNS);
    for (int u = 0; u < m.n_units; u++)
        ck_assert_msg(!memcmp(r.params[u], ref.params[u], m.units[u].numel * sizeof(float)),
                      "unit %s differs after the resume", m.units[u].name);
    fsdp_model_free(&m);
    fsdp_train_result_free(&r);
    fsdp_train_result_free(&ref);
    c.steps = 6;
    c.freeze = "model.layers.*.mlp.*";
    run_fail(&c, FSDP_STATUS_FORMAT, "--freeze", "model.layers.*.mlp.*");
    /* another base: a Hugging Face directory (llama-tiny's, exported), then the same with one
     * byte changed */
    fsdp_test_path(base, sizeof base, "base");
    fsdp_test_path(dir, sizeof dir, "ck0");
    frozen_config(&c, 1, NULL);
    c.steps = 1;
    c.ckpt_dir = dir;
    run_ok_as(&c, &r, "the base");
    fsdp_train_result_free(&r);
    snprintf(cmd, sizeof cmd, "%s convert %s %s --to hf >/dev/null 2>&1", FSDP_BIN, dir, base);
    ck_assert_int_eq(system(cmd), 0);
    fsdp_test_path(dir, sizeof dir, "ck2");
    frozen_config(&c, 2, "model.layers.*.mlp.*");
    c.model = base;
    c.steps = 1;
    c.ckpt_dir = dir;
    run_ok_as(&c, &r, "on a directory");
    fsdp_train_result_free(&r);
    snprintf(cmd, sizeof cmd, "printf 'x' | dd of=%s/model.safetensors bs=1 seek=$(( $(stat -c %%s "
             "%s/model.safetensors) - 1 )) conv=notrunc 2>/dev/null", base, base);
    ck_assert_int_eq(system(cmd), 0);
    c.steps = 2;
    c.resume = true;
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "another base", base);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"engine", 300,
         FSDP_TESTS(test_frozen_step_matches_full, test_frozen_identical_everywhere)},
        {"resume", 120, .tmpdir = true, FSDP_TESTS(test_frozen_resume)},
    };
    return fsdp_test_main("frozen", tcases, FSDP_TEST_LEN(tcases));
}
