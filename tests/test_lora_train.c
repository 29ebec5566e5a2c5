/*
 * test_lora_train.c - LoRA fine-tuning end to end against PyTorch + PEFT in
 * float64 (tools/gen_lora_golden.py): a Hugging Face base directory, a PEFT
 * adapter directory to start from (--adapter), 4 steps of accumulation 2
 * with clipping, AdamW and warmup + cosine, on 1 and 2 devices, with and
 * without optimizer offload. Step losses, gradient norms and the final
 * adapters must match the reference.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "models/registry.h"
#include "train/adapt.h"
#include "testutil.h"
#include "train_util.h"

typedef struct lora_fixture {
    const char *base, *dir; /* tests/fixtures/<base>, tests/fixtures/<dir> */
    float clip;
} lora_fixture;

static const lora_fixture fixtures[] = {
    {"llama_gqa", "lora_gqa", 0.9f},     /* q/v/down_proj, GQA, untied head */
    {"llama_qwen2", "lora_qwen2", 3.5f}, /* all-linear, rslora, q/k/v biases, tied head */
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

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"peft", 120, FSDP_TESTS(FSDP_TEST_LOOP(test_lora_matches_peft, 6))},
    };
    return fsdp_test_main("lora_train", tcases, FSDP_TEST_LEN(tcases));
}
