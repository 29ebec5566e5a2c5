/*
 * test_lora_train.c - LoRA fine-tuning end to end against PyTorch + PEFT in
 * float64 (tools/gen_lora_golden.py): a Hugging Face base directory, a PEFT
 * adapter directory to start from (--adapter), 4 steps of accumulation 2
 * with clipping, AdamW and warmup + cosine, on 1 and 2 devices, with and
 * without optimizer offload. Step losses, gradient norms and the final
 * adapters must match the reference. QLoRA the same way against the
 * reference on bitsandbytes' NF4 round trip of the base
 * (tools/gen_qlora_golden.py), its offloaded run with the base's shards in
 * host memory too.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "ckpt/peft.h"
#include "ckpt/safetensors.h"
#include "models/lora.h"
#include "models/registry.h"
#include "train/adapt.h"
#include "testutil.h"
#include "train_util.h"

typedef struct lora_fixture {
    const char *base, *dir; /* tests/fixtures/<base>, tests/fixtures/<dir> */
    float clip;
    fsdp_quant quantize;
} lora_fixture;

static const lora_fixture fixtures[] = {
    {"llama_gqa", "lora_gqa", 0.9f, FSDP_QUANT_NONE},     /* q/v/down_proj, GQA, untied head */
    {"llama_qwen2", "lora_qwen2", 3.5f, FSDP_QUANT_NONE}, /* all-linear, rslora, biases, tied */
    {"llama_gqa", "qlora_gqa", 0.9f, FSDP_QUANT_NF4},     /* lora_gqa on an NF4 base */
};

/* Tensor `name` of a parsed golden file as floats (F32), numel checked when want > 0. */
static const float *golden_f32(const fsdp_st_file *st, const char *buf, const char *name,
                               size_t want)
{
    for (int i = 0; i < st->n_tensors; i++) {
        const fsdp_st_tensor *t = &st->tensors[i];
        if (strcmp(t->name, name))
            continue;
        ck_assert_str_eq(t->dtype_name, "F32");
        if (want)
            ck_assert_uint_eq(t->numel, want);
        return (const float *)(buf + st->data_offset + t->begin);
    }
    ck_abort_msg("golden tensor %s is missing", name);
    return NULL;
}

START_TEST(test_lora_matches_peft)
{
    const lora_fixture *fx = &fixtures[_i / 3];
    int devices = _i % 3 ? 2 : 1;
    bool offload = _i % 3 == 2;
    char base[256], adapter[256], data[256], golden[256];
    snprintf(base, sizeof base, "tests/fixtures/%s", fx->base);
    snprintf(adapter, sizeof adapter, "tests/fixtures/%s/adapter_init", fx->dir);
    snprintf(data, sizeof data, "tests/fixtures/%s/tokens.bin", fx->dir);
    snprintf(golden, sizeof golden, "tests/fixtures/%s/golden.safetensors", fx->dir);

    fsdp_train_config c;
    train_config_cpu(&c, base, devices);
    c.adapter = adapter;
    c.data = data;
    c.steps = 4;
    c.eng.batch = 2 / devices;
    c.eng.grad_accum = 2;
    c.eng.seq = 16;
    c.lr = 1e-2f;
    c.min_lr = 1e-3f;
    c.warmup = 1;
    c.eng.optim_hp.weight_decay = 0.1f;
    c.eng.clip = fx->clip;
    c.eng.deterministic = true;
    c.eng.offload = offload;
    c.eng.offload_params = offload && fx->quantize;
    c.quantize = fx->quantize;
    c.n_samples = 0;
    c.keep_params = true;
    fsdp_train_result r;
    char what[128];
    snprintf(what, sizeof what, "%s, %d device(s)%s", fx->dir, devices, offload ? ", offload" : "");
    run_ok_as(&c, &r, what);

    size_t len = 0;
    char *buf = fsdp_test_read_file(golden, &len);
    ck_assert_ptr_nonnull(buf);
    fsdp_st_file st;
    ck_assert_int_eq(fsdp_st_parse_buffer(golden, buf, len, &st), FSDP_STATUS_OK);
    const float *losses = golden_f32(&st, buf, "step_losses", 4);
    const float *norms = golden_f32(&st, buf, "step_grad_norms", 4);
    for (int s = 0; s < 4; s++) {
        ck_assert_msg(fabsf(r.losses[s] - losses[s]) <= 2e-5f * fabsf(losses[s]),
                      "%s: step %d loss %.7g, PEFT float64 %.7g", what, s + 1, r.losses[s],
                      losses[s]);
        ck_assert_msg(fabsf(r.grad_norms[s] - norms[s]) <= 1e-4f * norms[s],
                      "%s: step %d gradient norm %.7g, PEFT float64 %.7g", what, s + 1,
                      r.grad_norms[s], norms[s]);
    }
    /* the final adapters, by PEFT's names, in the trained model's layout */
    fsdp_model m;
    fsdp_modelfile *mf = NULL;
    fsdp_adapt ad;
    ck_assert_int_eq(fsdp_modelfile_resolve(base, &m, &mf), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_adapt_apply(&ad, &m, mf, &c.lora, NULL, adapter, c.eng.seed),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_adapt_quantize(&ad, &m, fx->quantize), FSDP_STATUS_OK);
    int n_adapters = 0;
    for (int i = 0; i < st.n_tensors; i++) {
        const char *name = st.tensors[i].name;
        if (strncmp(name, "final/base_model.model.", 23))
            continue;
        const float *want = golden_f32(&st, buf, name, 0);
        int u;
        const fsdp_param_spec *p = fsdp_model_find_param(&m, name + 23, &u);
        ck_assert_msg(p && !p->frozen, "%s: no trainable parameter %s", what, name + 23);
        ck_assert_uint_eq(p->numel, st.tensors[i].numel);
        const float *got = r.params[u] + p->offset;
        for (size_t k = 0; k < p->numel; k++)
            ck_assert_msg(fabsf(got[k] - want[k]) <= 1e-5f + 1e-4f * fabsf(want[k]),
                          "%s: %s[%zu] = %.7g, PEFT float64 %.7g", what, name + 23, k, got[k],
                          want[k]);
        n_adapters++;
    }
    fsdp_modelfile_close(mf);
    fsdp_adapt_free(&ad);
    fsdp_model_free(&m);
    ck_assert_int_gt(n_adapters, 4);
    fsdp_st_free(&st);
    free(buf);
    fsdp_train_result_free(&r);
}
END_TEST

/* `fsdp eval`'s mean loss of `model` (--model and maybe more) on the gqa fixture's tokens. */
static double eval_loss(const char *model)
{
    char out[4096];
    int rc = fsdp_test_cli(out, sizeof out, "eval --model %s --data "
                           "tests/fixtures/lora_gqa/tokens.bin --seq 16 --batch 1 --devices 2",
                           model);
    const char *at = strstr(out, "mean loss ");
    ck_assert_msg(rc == 0 && at, "eval of %s failed:\n%s", model, out);
    return strtod(at + 10, NULL);
}

/* The exports of LoRA checkpoint `ck` (model m, the run r, base `base`): `--to peft` holds the
 * run's adapters bit for bit, and `eval --model BASE --adapter` of it gives the checkpoint's
 * loss exactly; `--to hf` is the merged model, whose loss is the adapters' and
 * which PEFT agrees with: transformers' logits of the merged directory equal PEFT's of the base
 * with the exported adapter (python3 with torch, transformers and peft; said and skipped
 * without them). `--to ckpt` is refused (the frozen part would be lost). */
static void expect_exports(const char *ck, const char *base, const fsdp_model *m,
                           const fsdp_train_result *r)
{
    char peft[4096], hf[4096], out[8192];
    fsdp_test_path(peft, sizeof peft, "adapter");
    fsdp_test_path(hf, sizeof hf, "merged");
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "convert %s %s --to peft", ck, peft), 0);
    fsdp_peft_dir d;
    ck_assert_int_eq(fsdp_peft_open(peft, &d), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_peft_bind(&d, m), FSDP_STATUS_OK);
    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++) {
            const fsdp_param_spec *p = &m->units[u].params[i];
            if (!fsdp_lora_is_adapter(p->name))
                continue;
            float *got = malloc(p->numel * sizeof(float));
            ck_assert_int_eq(fsdp_peft_read(&d, u, i, 0, p->numel, got), FSDP_STATUS_OK);
            ck_assert_msg(!memcmp(got, r->params[u] + p->offset, p->numel * sizeof(float)),
                          "--to peft: %s is not the run's", p->name);
            free(got);
            n++;
        }
    ck_assert_int_eq(n, 12);
    fsdp_peft_close(&d);
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "convert %s %s --to hf", ck, hf), 0);
    ck_assert_msg(strstr(out, "LoRA adapters merged"), "%s", out);
    char with[8300];
    snprintf(with, sizeof with, "%s --adapter %s", base, peft);
    double a = eval_loss(ck), b = eval_loss(hf), c = eval_loss(with);
    ck_assert_msg(fabs(a - b) <= 1e-5 * fabs(a), "merged loss %.7g, with adapters %.7g", b, a);
    ck_assert_msg(c == a, "eval --adapter: loss %.9g, the checkpoint's %.9g", c, a);
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "convert %s %s-ck --to ckpt", ck, hf), 2);
    ck_assert_msg(strstr(out, "frozen parameters") && strstr(out, "--to peft"), "%s", out);
    static const char script[] =
        "import sys\n"
        "try:\n"
        "    import torch\n"
        "    from peft import PeftModel\n"
        "    from transformers import AutoModelForCausalLM\n"
        "except ImportError as e:\n"
        "    print('no peft:', e)\n"
        "    sys.exit(0)\n"
        "base, adapter, merged = sys.argv[1:4]\n"
        "x = torch.arange(16).reshape(1, 16) % 100\n"
        "p = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)\n"
        "m = AutoModelForCausalLM.from_pretrained(merged)\n"
        "with torch.no_grad():\n"
        "    a, b = p(x).logits, m(x).logits\n"
        "d = (a - b).abs().max().item() / a.abs().max().item()\n"
        "print('peft vs merged: %.3g' % d)\n"
        "sys.exit(0 if d < 1e-5 else 1)\n";
    char py[4096];
    fsdp_test_path(py, sizeof py, "check.py");
    fsdp_test_write_file(py, script);
    int rc = fsdp_test_sh(out, sizeof out, "python3 %s %s %s %s 2>&1", py, base, peft, hf);
    if (rc == 0 && strstr(out, "no peft:"))
        printf("expect_exports: the PEFT comparison skipped (%s)\n", out);
    else
        ck_assert_msg(rc == 0 && strstr(out, "peft vs merged"), "PEFT disagrees (rc %d):\n%s",
                      rc, out);
}

/* A LoRA checkpoint holds the adapters and a reference to the base; read as a model (eval,
 * sample, convert), it gives every parameter the run ended with, bit for bit: adapters from
 * its shards, frozen ones from the base (a directory, or a shape the seed draws). Changing the
 * base's files afterwards is refused, naming the base. */
/* A 2-step, 2-device run of base that checkpoints into dir and keeps its parameters (the
 * caller adds the adapters and data). */
static void checkpoint_run_config(fsdp_train_config *c, const char *base, const char *dir)
{
    train_config_cpu(c, base, 2);
    c->steps = 2;
    c->eng.batch = 1;
    c->eng.seq = 16;
    c->n_samples = 0;
    c->keep_params = true;
    c->ckpt_dir = dir;
}

START_TEST(test_lora_checkpoint_reads_whole)
{
    static const char *const bases[] = {"tests/fixtures/llama_gqa", "llama-tiny"};
    const char *base = bases[_i];
    char dir[4096], copy[4096], cmd[9000];
    fsdp_test_path(copy, sizeof copy, "base");
    if (_i == 0) { /* a copy, so that the test can change it */
        snprintf(cmd, sizeof cmd, "cp -r %s %s", base, copy);
        ck_assert_int_eq(system(cmd), 0);
        base = copy;
    }
    fsdp_test_path(dir, sizeof dir, "ck");
    fsdp_train_config c;
    checkpoint_run_config(&c, base, dir);
    if (_i == 0) {
        c.adapter = "tests/fixtures/lora_gqa/adapter_init";
        c.data = "tests/fixtures/lora_gqa/tokens.bin";
    } else {
        c.lora = (fsdp_lora_config){.r = 4, .alpha = 8, .targets = "all-linear"};
    }
    fsdp_train_result r;
    run_ok_as(&c, &r, base);
    fsdp_model m;
    fsdp_modelfile *mf = NULL;
    fsdp_status st = fsdp_modelfile_resolve(dir, &m, &mf);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_gt(m.lora.r, 0);
    for (int u = 0; u < m.n_units; u++) {
        float *got = malloc(m.units[u].numel * sizeof(float) + 1);
        ck_assert_int_eq(fsdp_modelfile_read_range(mf, u, 0, m.units[u].numel, got),
                         FSDP_STATUS_OK);
        ck_assert_msg(!memcmp(got, r.params[u], m.units[u].numel * sizeof(float)),
                      "%s: unit %s read from the checkpoint is not the run's", base,
                      m.units[u].name);
        free(got);
    }
    if (_i == 0)
        expect_exports(dir, base, &m, &r);
    fsdp_modelfile_close(mf);
    fsdp_model_free(&m);
    fsdp_train_result_free(&r);
    if (_i == 0) { /* another base under the same path */
        snprintf(cmd, sizeof cmd, "printf 'x' | dd of=%s/model.safetensors bs=1 seek=$(( $(stat "
                 "-c %%s %s/model.safetensors) - 1 )) conv=notrunc 2>/dev/null", base, base);
        ck_assert_int_eq(system(cmd), 0);
        st = fsdp_modelfile_resolve(dir, &m, &mf);
        ck_assert_int_eq(st, FSDP_STATUS_FORMAT);
        ck_assert_msg(strstr(fsdp_error_msg(), "now holds another model") &&
                          strstr(fsdp_error_msg(), base), "%s", fsdp_error_msg());
    }
}
END_TEST

/* LoRA on every linear layer leaves the root unit nothing to train (its checkpoint units hold
 * 0 elements): interrupted after step 2 on 2 devices and resumed on 4, the run ends bit for bit
 * where the uninterrupted one does, with offload. */
/* A QLoRA checkpoint: it reads back whole with its frozen linear weights as the NF4 round
 * trip the run trained against (every parameter, by name, bit for bit the run's), and a
 * resume with the base in floats is refused. */
START_TEST(test_qlora_checkpoint)
{
    char dir[4096];
    fsdp_test_path(dir, sizeof dir, "ck");
    const char *base = "tests/fixtures/llama_gqa";
    fsdp_train_config c;
    checkpoint_run_config(&c, base, dir);
    c.adapter = "tests/fixtures/qlora_gqa/adapter_init";
    c.data = "tests/fixtures/qlora_gqa/tokens.bin";
    c.quantize = FSDP_QUANT_NF4;
    fsdp_train_result r;
    run_ok_as(&c, &r, "QLoRA");
    fsdp_model run, m;
    fsdp_modelfile *bmf = NULL, *mf = NULL;
    fsdp_adapt ad;
    ck_assert_int_eq(fsdp_modelfile_resolve(base, &run, &bmf), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_adapt_apply(&ad, &run, bmf, NULL, NULL, c.adapter, c.eng.seed),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_adapt_quantize(&ad, &run, FSDP_QUANT_NF4), FSDP_STATUS_OK);
    fsdp_status st = fsdp_modelfile_resolve(dir, &m, &mf);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    int n_nf4 = 0;
    for (int u = 0; u < m.n_units; u++) {
        float *got = malloc(m.units[u].numel * sizeof(float) + 1);
        ck_assert_int_eq(fsdp_modelfile_read_range(mf, u, 0, m.units[u].numel, got),
                         FSDP_STATUS_OK);
        for (int i = 0; i < m.units[u].n_params; i++) {
            const fsdp_param_spec *p = &m.units[u].params[i], *q = &run.units[u].params[i];
            ck_assert_str_eq(p->name, q->name);
            n_nf4 += q->nf4;
            ck_assert_msg(!memcmp(got + p->offset, r.params[u] + q->offset,
                                  p->numel * sizeof(float)),
                          "%s read from the QLoRA checkpoint is not the run's", p->name);
        }
        free(got);
    }
    ck_assert_int_eq(n_nf4, 14);
    /* its adapters, exported, on the float base stored as the run stored it (eval
     * --quantize nf4): the checkpoint's loss exactly; on the float base as it is, another */
    char peft[4200], out[4096], with[4600];
    snprintf(peft, sizeof peft, "%s_peft", dir);
    ck_assert_msg(fsdp_test_cli(out, sizeof out, "convert %s %s --to peft", dir, peft) == 0,
                  "%s", out);
    double ck_loss = eval_loss(dir);
    snprintf(with, sizeof with, "%s --adapter %s --quantize nf4", base, peft);
    double nf4_loss = eval_loss(with);
    ck_assert_msg(nf4_loss == ck_loss, "QLoRA adapters on the NF4 base: %.9g, the checkpoint "
                  "%.9g", nf4_loss, ck_loss);
    snprintf(with, sizeof with, "%s --adapter %s", base, peft);
    ck_assert_msg(eval_loss(with) != ck_loss, "the float base gives the NF4 base's loss");
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "eval --model %s --quantize nf4 --data "
                                   "tests/fixtures/lora_gqa/tokens.bin", base), 2);
    ck_assert_msg(strstr(out, "give the adapter"), "%s", out);
    fsdp_modelfile_close(mf);
    fsdp_model_free(&m);
    fsdp_modelfile_close(bmf);
    fsdp_adapt_free(&ad);
    fsdp_model_free(&run);
    fsdp_train_result_free(&r);
    c.quantize = FSDP_QUANT_NONE;
    c.resume = true;
    c.steps = 3;
    st = fsdp_train_run(&c, &r);
    ck_assert_msg(st != FSDP_STATUS_OK && strstr(fsdp_error_msg(), "--quantize"), "%s",
                  fsdp_error_msg());
    fsdp_error_clear();
}
END_TEST

START_TEST(test_lora_resume)
{
    char dir[4096];
    fsdp_test_path(dir, sizeof dir, "ck");
    fsdp_train_config c;
    fsdp_train_result ref, r;
    train_config_cpu(&c, "llama-tiny", 2);
    c.lora = (fsdp_lora_config){.r = 4, .alpha = 8, .targets = "all-linear"};
    c.steps = 4;
    c.eng.batch = 1; /* the same micro-batches on 2 devices x 2 micro-steps and on 4 x 1 */
    c.eng.grad_accum = 2;
    c.eng.deterministic = true;
    c.eng.offload = true;
    c.n_samples = 0;
    c.keep_params = true;
    run_ok_as(&c, &ref, "uninterrupted");
    c.ckpt_dir = dir;
    c.ckpt_every = 2;
    c.stop_after = 2;
    run_ok_as(&c, &r, "first half");
    fsdp_train_result_free(&r);
    c.eng.n_ranks = 4;
    c.eng.grad_accum = 1;
    c.stop_after = 0;
    c.resume = true;
    run_ok_as(&c, &r, "resumed on 4 devices");
    ck_assert_int_eq(r.first_step, 2);
    ck_assert_msg(ref.losses[3] < ref.losses[0], "LoRA does not train: %g -> %g", ref.losses[0],
                  ref.losses[3]);
    for (int s = 2; s < 4; s++)
        ck_assert_msg(!memcmp(&r.losses[s], &ref.losses[s], sizeof(float)),
                      "step %d: resumed %.9g, uninterrupted %.9g", s + 1, r.losses[s],
                      ref.losses[s]);
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("llama-tiny", &m), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_model_add_lora(&m, &c.lora), FSDP_STATUS_OK);
    ck_assert_uint_eq(m.units[0].train_numel, 0); /* the point of the case */
    for (int u = 0; u < m.n_units; u++)
        ck_assert_msg(!memcmp(r.params[u], ref.params[u], m.units[u].numel * sizeof(float)),
                      "unit %s differs after the resume", m.units[u].name);
    fsdp_model_free(&m);
    fsdp_train_result_free(&r);
    fsdp_train_result_free(&ref);
    /* other adapters, or none, are refused, naming the options that resume */
    c.steps = 6;
    for (int k = 0; k < 2; k++) {
        c.lora = k ? (fsdp_lora_config){0}
                   : (fsdp_lora_config){.r = 4, .alpha = 16, .targets = "all-linear"};
        fsdp_status st = fsdp_train_run(&c, &r);
        ck_assert_msg(st != FSDP_STATUS_OK &&
                          strstr(fsdp_error_msg(), "(--lora 4 --lora-alpha 8 --lora-targets "
                                                   "'all-linear')"), "%s", fsdp_error_msg());
        fsdp_error_clear();
    }
}
END_TEST

/* QLoRA's run on 1 device (an NF4 base drawn by the seed, all-linear adapters, clipping)
 * is the run, bit for bit, on 2 and 4 devices with every strategy, with the optimizer and
 * the frozen shards offloaded, and with each recompute mode. */
static void qlora_config(fsdp_train_config *c, int devices)
{
    train_config_cpu(c, "llama-tiny", devices);
    c->lora = (fsdp_lora_config){.r = 4, .alpha = 8, .targets = "all-linear"};
    c->quantize = FSDP_QUANT_NF4;
    c->steps = 3;
    c->warmup = 1;
    c->lr = 1e-2f;
    c->eng.batch = 1;
    c->eng.grad_accum = 4 / devices; /* the same 4 micro-batches a step on 1, 2 and 4 devices */
    c->eng.clip = 0.5f;
    c->eng.deterministic = true;
    c->n_samples = 0;
    c->keep_params = true;
}

START_TEST(test_qlora_identical_everywhere)
{
    fsdp_train_config c;
    fsdp_train_result ref, r;
    qlora_config(&c, 1);
    run_ok_as(&c, &ref, "qlora, 1 device");
    ck_assert_msg(ref.losses[2] < ref.losses[0], "QLoRA does not train: %g -> %g",
                  ref.losses[0], ref.losses[2]);
    qlora_config(&c, 1); /* the base in floats trains otherwise: NF4 is in force */
    c.quantize = FSDP_QUANT_NONE;
    run_ok_as(&c, &r, "lora, 1 device");
    ck_assert_msg(memcmp(&r.losses[0], &ref.losses[0], sizeof(float)),
                  "the NF4 base gives the float base's loss %.9g", r.losses[0]);
    fsdp_train_result_free(&r);
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("llama-tiny", &m), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_model_add_lora(&m, &c.lora), FSDP_STATUS_OK);
    static const int devs[] = {2, 4};
    int n_runs = 0;
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < FSDP_SHARD_COUNT; s++)
            for (int v = 0; v < 2 + FSDP_RECOMPUTE_COUNT - 1; v++) {
                qlora_config(&c, devs[d]);
                c.eng.shard = (fsdp_shard_strategy)s;
                if (s == FSDP_SHARD_HYBRID)
                    c.eng.n_nodes = 2;
                c.eng.offload = c.eng.offload_params = v == 1; /* optimizer,params */
                c.eng.recompute = v >= 2 ? (fsdp_recompute)(v - 1) : FSDP_RECOMPUTE_NONE;
                char what[160];
                snprintf(what, sizeof what, "qlora, %d devices, %s%s, recompute %s", devs[d],
                         fsdp_shard_strategy_name(c.eng.shard), v == 1 ? ", offload" : "",
                         fsdp_names_name(&fsdp_recompute_names, (int)c.eng.recompute));
                run_ok_as(&c, &r, what);
                expect_identical_runs_of(&ref, &r, &m, what);
                fsdp_train_result_free(&r);
                n_runs++;
            }
    ck_assert_int_eq(n_runs, 2 * FSDP_SHARD_COUNT * (1 + FSDP_RECOMPUTE_COUNT));
    fsdp_model_free(&m);
    fsdp_train_result_free(&ref);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"peft", 120, FSDP_TESTS(FSDP_TEST_LOOP(test_lora_matches_peft, 9))},
        {"checkpoint", 120, .tmpdir = true,
         FSDP_TESTS(FSDP_TEST_LOOP(test_lora_checkpoint_reads_whole, 2), test_lora_resume,
                    test_qlora_checkpoint)},
        {"qlora", 300, FSDP_TESTS(test_qlora_identical_everywhere)},
    };
    return fsdp_test_main("lora_train", tcases, FSDP_TEST_LEN(tcases));
}
