/*
 * test_llama_weights.c - the Llama family's configs, names and files
 * (models/llama_family.c, llama_weights.c, llama_hf.c):
 *   - named shapes: parameter counts equal the released models' (as
 *     transformers counts them) and an independent formula; the fused
 *     layouts (q|k|v, their biases, gate|up contiguous), decay and init;
 *   - the spec grammar: strict, every refusal naming the key, canonical
 *     strings that rebuild the same model;
 *   - config.json in (transformers 4 and 5 spellings, Qwen2, Mistral's
 *     sliding window) and out (read back to the same config), and FORMAT
 *     errors naming the key for what fsdp does not compute;
 *   - single-file safetensors written by fsdp read back with the same config
 *     and values (fp32 exactly, bf16 rounded once), under Hugging Face's
 *     names and shapes;
 *   - the commands a user runs: plan of a released shape without weights,
 *     shardmap, train, convert, sample.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "case_util.h"
#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "core/fileio.h"
#include "core/json.h"
#include "model_rig.h"
#include "models/llama.h"
#include "models/registry.h"
#include "testutil.h"

static void build_ok(const char *spec, fsdp_model *m)
{
    fsdp_status st = fsdp_model_from_spec(spec, m);
    ck_assert_msg(st == FSDP_STATUS_OK, "'%s': %s", spec, fsdp_error_msg());
}

/* ---- named shapes ------------------------------------------------------------ */

/* Parameters of a Llama config by the architecture, independently of the
 * builder: embeddings (+ head), final norm; per layer two norms, q/k/v/o,
 * gate/up/down and the optional q/k/v biases. Vp: the padded vocabulary. */
static size_t count_params(const fsdp_llama_config *c, size_t V)
{
    size_t C = (size_t)c->n_embd, qh = (size_t)c->n_head * c->head_dim,
           kvh = (size_t)c->n_kv_head * c->head_dim, IC = (size_t)c->n_inter;
    size_t layer = 2 * C + C * (qh + 2 * kvh) + qh * C + 3 * C * IC + (c->qkv_bias ? qh + 2 * kvh : 0);
    return V * C * (c->tied ? 1 : 2) + C + (size_t)c->n_layer * layer;
}

START_TEST(test_released_shapes)
{
    /* transformers' model.num_parameters() of the released checkpoints */
    static const struct {
        const char *name;
        size_t params;
    } released[] = {
        {"llama3.2-1b", 1235814400},   {"llama3.2-3b", 3212749824},
        {"llama3.1-8b", 8030261248},   {"llama3.1-70b", 70553706496},
        {"qwen2.5-0.5b", 494032768},   {"qwen2.5-1.5b", 1543714304},
        {"qwen2.5-3b", 3085938688},    {"qwen2.5-7b", 7615616512},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(released); i++) {
        fsdp_model m;
        build_ok(released[i].name, &m);
        const fsdp_llama_config *c = fsdp_llama_config_of(&m);
        ck_assert_ptr_nonnull(c);
        ck_assert_msg(m.numel == released[i].params, "%s: %zu parameters, released %zu",
                      released[i].name, m.numel, released[i].params);
        ck_assert_uint_eq(m.numel, count_params(c, (size_t)c->padded_vocab_size));
        ck_assert_int_eq(c->padded_vocab_size, c->vocab_size); /* multiples of 128 already */
        ck_assert_int_eq(m.n_units, c->n_layer + 1);
        fsdp_model_free(&m);
    }
    /* a vocabulary that is not a multiple of 128 is padded */
    fsdp_model m;
    build_ok("llama:vocab=300", &m);
    ck_assert_int_eq(m.padded_vocab_size, 384);
    ck_assert_uint_eq(m.numel, count_params(fsdp_llama_config_of(&m), 384));
    fsdp_model_free(&m);
}
END_TEST

/* q|k|v weights and biases and gate|up are contiguous: one matmul each. */
START_TEST(test_fused_layout_decay_init)
{
    static const char *const shapes[] = {"llama-tiny", "qwen2-tiny", "llama3.1-8b"};
    for (size_t s = 0; s < FSDP_TEST_LEN(shapes); s++) {
        fsdp_model m;
        build_ok(shapes[s], &m);
        const fsdp_llama_config *c = fsdp_llama_config_of(&m);
        for (int l = 0; l < c->n_layer; l++) {
            const char *const runs[][3] = {
                {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"},
                {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"},
                {"mlp.gate_proj.weight", "mlp.up_proj.weight", NULL},
            };
            for (int r = 0; r < 3; r++) {
                const fsdp_param_spec *prev = NULL;
                int prev_unit = -1;
                for (int k = 0; k < 3 && runs[r][k]; k++) {
                    char name[96];
                    snprintf(name, sizeof name, "model.layers.%d.%s", l, runs[r][k]);
                    int unit = -1;
                    const fsdp_param_spec *p = fsdp_model_find_param(&m, name, &unit);
                    if (r == 1 && !c->qkv_bias) {
                        ck_assert_msg(!p, "%s: %s without qkv_bias", shapes[s], name);
                        continue;
                    }
                    ck_assert_msg(p, "%s: no %s", shapes[s], name);
                    ck_assert_int_eq(unit, 1 + l);
                    if (prev)
                        ck_assert_msg(prev_unit == unit && prev->offset + prev->numel == p->offset,
                                      "%s: %s does not follow %s", shapes[s], name, prev->name);
                    prev = p;
                    prev_unit = unit;
                }
            }
        }
        for (int u = 0; u < m.n_units; u++)
            for (int i = 0; i < m.units[u].n_params; i++) {
                const fsdp_param_spec *p = &m.units[u].params[i];
                bool matrix = p->ndim == 2, bias = strstr(p->name, ".bias") != NULL;
                ck_assert_msg(p->decay == matrix, "%s: decay on %s", shapes[s], p->name);
                ck_assert_msg(matrix ? p->init == FSDP_INIT_NORMAL && p->std == 0.02f
                                     : p->init == (bias ? FSDP_INIT_ZEROS : FSDP_INIT_ONES),
                              "%s: init of %s", shapes[s], p->name);
            }
        ck_assert(!fsdp_model_find_param(&m, "lm_head.weight", NULL) == c->tied);
        fsdp_model_free(&m);
    }
}
END_TEST

/* ---- the spec grammar ------------------------------------------------------------ */

START_TEST(test_spec_errors)
{
    static const text_case bad[] = {
        {"llama:", "is empty"},
        {"llama", "needs a config"},
        {"llama:foo=1", "unknown key 'foo'"},
        {"llama:layers=2,layers=3", "'layers' is given twice"},
        {"llama:rope=llama3,rope=default,rope_factor=2", "'rope' is given twice"},
        {"llama:layers=2,", "empty entry"},
        {"llama:heads=6,kv_heads=4,head_dim=8", "not a multiple of kv_heads=4"},
        {"llama:head_dim=7", "head_dim=7 is odd"},
        {"llama:hidden=30,heads=4", "give head_dim"},
        {"llama:rope=yarn", "rope=yarn is not a rope scaling type"},
        {"llama:rope=2", "rope=2 is not a rope scaling type"},
        {"llama:rope=linear", "needs rope_factor"},
        {"llama:rope_factor=8", "rope_factor has no effect with rope=default"},
        {"llama:rope=linear,rope_factor=2,rope_low_freq=2", "rope_low_freq has no effect"},
        {"llama:rope=llama3,rope_factor=8,rope_low_freq=4,rope_high_freq=1", "high_freq_factor"},
        {"llama:qkv_bias=2", "qkv_bias=2 is out of range"},
        {"llama:tied=yes", "needs an integer"},
        {"llama:norm_eps=0", "out of range"},
        {"llama:rope_theta=-1", "out of range"},
        {"llama:heads=4096,head_dim=4096", "heads * head_dim"},
        {"llama:context=0", "out of range"},
    };
    expect_specs_rejected(bad, FSDP_TEST_LEN(bad));
}
END_TEST

START_TEST(test_spec_defaults_and_canonical)
{
    fsdp_model a, b, c;
    /* kv_heads = heads, head_dim = hidden / heads when left out */
    build_ok("llama:hidden=64,heads=8", &a);
    ck_assert_int_eq(fsdp_llama_config_of(&a)->n_kv_head, 8);
    ck_assert_int_eq(fsdp_llama_config_of(&a)->head_dim, 8);
    fsdp_model_free(&a);
    /* order and spelling do not matter; the canonical form rebuilds it */
    build_ok("llama:rope=llama3,rope_factor=8,layers=3,rope_theta=5e5,norm_eps=0.00001", &a);
    build_ok("llama:norm_eps=1e-5,layers=3,rope_factor=8,rope_theta=500000,rope=llama3", &b);
    ck_assert_str_eq(a.config, b.config);
    ck_assert_ptr_nonnull(strstr(a.config, "rope_theta=500000,rope=llama3,rope_factor=8,"
                                           "rope_low_freq=1,rope_high_freq=4,"
                                           "rope_orig_context=8192"));
    char spec[FSDP_MODEL_NAME_MAX];
    fsdp_model_spec_of(&a, spec, sizeof spec);
    build_ok(spec, &c);
    ck_assert_str_eq(c.config, a.config);
    ck_assert_uint_eq(c.numel, a.numel);
    const fsdp_rope_spec *r = &fsdp_llama_config_of(&c)->rope;
    ck_assert(r->type == FSDP_ROPE_LLAMA3 && r->factor == 8 && r->theta == 5e5);
    fsdp_model_free(&a);
    fsdp_model_free(&b);
    fsdp_model_free(&c);
    /* a named shape's config is found back as the shape */
    build_ok("llama:layers=32,heads=32,kv_heads=8,hidden=4096,intermediate=14336,head_dim=128,"
             "vocab=128256,context=131072,rope_theta=500000,rope=llama3,rope_factor=8,"
             "qkv_bias=0,tied=0,norm_eps=1e-5", &a);
    ck_assert_str_eq(a.name, "llama3.1-8b");
    fsdp_model_free(&a);
}
END_TEST

/* ---- config.json ----------------------------------------------------------------- */

static fsdp_status hf_read(const char *text, char *config, size_t n)
{
    fsdp_json *js = NULL;
    ck_assert_msg(fsdp_json_parse(text, strlen(text), &js) == FSDP_STATUS_OK, "%s: %s", text,
                  fsdp_error_msg());
    fsdp_status st = fsdp_llama_safetensors.hf_config(js, config, n);
    fsdp_json_free(js);
    return st;
}

/* The canonical config of a config.json text. */
static void hf_canonical(const char *text, char *out, size_t n)
{
    char config[FSDP_MODEL_CONFIG_MAX];
    ck_assert_msg(hf_read(text, config, sizeof config) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    fsdp_model m;
    ck_assert_msg(fsdp_model_build(&fsdp_llama_family, config, &m) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
    snprintf(out, n, "%s", m.config);
    fsdp_model_free(&m);
}

#define HF_SHAPE                                                                          \
    "\"hidden_size\": 48, \"intermediate_size\": 80, \"num_hidden_layers\": 2, "          \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "          \
    "\"vocab_size\": 128, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-05, "

START_TEST(test_hf_config_read)
{
    char got[FSDP_MODEL_CONFIG_MAX], want[FSDP_MODEL_CONFIG_MAX];
    /* the golden fixture's config.json (transformers 4 spelling, llama3 scaling) */
    char *fixture = fsdp_test_read_file("tests/fixtures/llama_gqa/config.json", NULL);
    hf_canonical(fixture, got, sizeof got);
    free(fixture);
    ck_assert_str_eq(got, "layers=2,heads=4,kv_heads=2,hidden=48,intermediate=80,head_dim=16,"
                          "vocab=128,context=256,rope_theta=500000,rope=llama3,rope_factor=8,"
                          "rope_low_freq=1,rope_high_freq=4,rope_orig_context=64,qkv_bias=0,"
                          "tied=0,norm_eps=1e-05");
    fixture = fsdp_test_read_file("tests/fixtures/llama_qwen2/config.json", NULL);
    hf_canonical(fixture, got, sizeof got);
    free(fixture);
    ck_assert_ptr_nonnull(strstr(got, "heads=6,kv_heads=2,hidden=48,intermediate=96,head_dim=8,"));
    ck_assert_ptr_nonnull(strstr(got, "rope_theta=1000000,rope=default,"));
    ck_assert_ptr_nonnull(strstr(got, "qkv_bias=1,tied=1,norm_eps=1e-06"));
    /* transformers 5: rope_parameters holds theta and the scaling */
    hf_canonical("{\"model_type\": \"llama\", " HF_SHAPE "\"rope_parameters\": {\"rope_type\": "
                 "\"llama3\", \"rope_theta\": 500000.0, \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                 "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}}",
                 want, sizeof want);
    ck_assert_str_eq(want, "layers=2,heads=4,kv_heads=2,hidden=48,intermediate=80,head_dim=16,"
                           "vocab=128,context=256,rope_theta=500000,rope=llama3,rope_factor=8,"
                           "rope_low_freq=1,rope_high_freq=4,rope_orig_context=64,qkv_bias=0,"
                           "tied=0,norm_eps=1e-05");
    /* legacy "type", linear; head_dim null and kv heads absent: the defaults */
    hf_canonical("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 80, "
                 "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"head_dim\": null, "
                 "\"vocab_size\": 100, \"max_position_embeddings\": 512, \"rope_scaling\": "
                 "{\"type\": \"linear\", \"factor\": 2.0}, \"tie_word_embeddings\": true}",
                 got, sizeof got);
    ck_assert_ptr_nonnull(strstr(got, "heads=4,kv_heads=4,hidden=64,intermediate=80,head_dim=16,"
                                      "vocab=100,context=512,rope_theta=10000,rope=linear,"
                                      "rope_factor=2,"));
    ck_assert_ptr_nonnull(strstr(got, "tied=1,norm_eps=1e-06"));
    /* Mistral: a sliding window shorter than the context becomes the context */
    hf_canonical("{\"model_type\": \"mistral\", \"architectures\": [\"MistralForCausalLM\"], "
                 "\"hidden_size\": 64, \"intermediate_size\": 80, \"num_hidden_layers\": 1, "
                 "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 100, "
                 "\"max_position_embeddings\": 32768, \"sliding_window\": 4096, "
                 "\"rope_theta\": 1000000.0}", got, sizeof got);
    ck_assert_ptr_nonnull(strstr(got, "context=4096,"));
    ck_assert_ptr_nonnull(strstr(got, "qkv_bias=0"));
    /* Qwen2 without use_sliding_window keeps its context */
    hf_canonical("{\"model_type\": \"qwen2\", " HF_SHAPE "\"sliding_window\": 64, "
                 "\"use_sliding_window\": false}", got, sizeof got);
    ck_assert_ptr_nonnull(strstr(got, "context=256,"));
    ck_assert_ptr_nonnull(strstr(got, "qkv_bias=1"));
}
END_TEST

START_TEST(test_hf_config_refusals)
{
    static const text_case bad[] = {
        {"{\"model_type\": \"gpt2\"}", "\"model_type\" is \"gpt2\""},
        {"[]", "not a JSON object"},
        {"{\"model_type\": \"llama\", \"intermediate_size\": 80}", "no \"num_hidden_layers\""},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"rope_scaling\": {\"rope_type\": \"yarn\", "
         "\"factor\": 4}}", "\"rope_scaling.rope_type\" is \"yarn\""},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"rope_parameters\": {\"rope_type\": "
         "\"dynamic\", \"rope_theta\": 1e4}}", "\"rope_parameters.rope_type\" is \"dynamic\""},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"rope_scaling\": {\"rope_type\": \"llama3\", "
         "\"factor\": 8}}", "no \"rope_scaling.low_freq_factor\""},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"attention_bias\": true}", "attention_bias"},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"mlp_bias\": true}", "mlp_bias"},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"hidden_act\": \"gelu\"}",
         "\"hidden_act\" is \"gelu\""},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"quantization_config\": {}}", "quantized"},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"architectures\": "
         "[\"LlamaForSequenceClassification\"]}", "\"architectures\" is \"LlamaForSequence"},
        {"{\"model_type\": \"llama\", " HF_SHAPE "\"tie_word_embeddings\": 1}",
         "\"tie_word_embeddings\" is 1"},
        {"{\"model_type\": \"qwen2\", \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
         "\"hidden_size\": 48.5}",
         "\"hidden_size\" is 48.5"},
        {"{\"model_type\": \"llama\", \"hidden_size\": 48, \"intermediate_size\": 80, "
         "\"num_hidden_layers\": 2, \"num_attention_heads\": 6, \"num_key_value_heads\": 4, "
         "\"vocab_size\": 128, \"max_position_embeddings\": 256}", "not a multiple of kv_heads"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(bad); i++) {
        char config[FSDP_MODEL_CONFIG_MAX];
        fsdp_error_clear();
        fsdp_status st = hf_read(bad[i].in, config, sizeof config);
        ck_assert_msg(st == FSDP_STATUS_FORMAT, "%s: %s", bad[i].in, fsdp_status_name(st));
        ck_assert_msg(strstr(fsdp_error_msg(), bad[i].want), "%s: message '%s' lacks '%s'",
                      bad[i].in, fsdp_error_msg(), bad[i].want);
    }
}
END_TEST

/* config.json out, read back: the same model, the architecture by the biases. */
START_TEST(test_hf_config_write_reads_back)
{
    int n = 0;
    for (int i = 0; i < fsdp_model_family_count(); i++) {
        const fsdp_model_family *f = fsdp_model_family_at(i);
        if (f != &fsdp_llama_family)
            continue;
        for (int k = 0; k < f->n_shapes; k++, n++) {
            fsdp_model m;
            build_ok(f->shapes[k].name, &m);
            for (int d = 0; d < 2; d++) {
                fsdp_sbuf out = {0};
                ck_assert_int_eq(f->safetensors->hf_config_write(&m, d ? "bfloat16" : "float32",
                                                                 &out),
                                 FSDP_STATUS_OK);
                char got[FSDP_MODEL_CONFIG_MAX];
                hf_canonical(out.p, got, sizeof got);
                ck_assert_msg(!strcmp(got, m.config), "%s: wrote\n%s\nread back %s",
                              m.name, out.p, got);
                const bool qwen = fsdp_llama_config_of(&m)->qkv_bias;
                ck_assert_ptr_nonnull(strstr(out.p, qwen ? "\"Qwen2ForCausalLM\""
                                                         : "\"LlamaForCausalLM\""));
                ck_assert_ptr_nonnull(strstr(out.p, d ? "\"torch_dtype\": \"bfloat16\""
                                                      : "\"torch_dtype\": \"float32\""));
                free(out.p);
            }
            fsdp_model_free(&m);
        }
    }
    ck_assert_int_ge(n, 11);
    fsdp_model gpt2;
    build_ok("tiny", &gpt2);
    fsdp_sbuf out = {0};
    ck_assert_int_eq(fsdp_llama_safetensors.hf_config_write(&gpt2, "float32", &out),
                     FSDP_STATUS_INVALID_ARG);
    fsdp_model_free(&gpt2);
    free(out.p);
}
END_TEST

/* ---- single-file safetensors -------------------------------------------------------- */

START_TEST(test_safetensors_round_trip)
{
    static const char *const specs[] = {"llama-tiny", "qwen2-tiny",
                                        "llama:layers=1,heads=2,kv_heads=1,hidden=16,"
                                        "intermediate=24,head_dim=8,vocab=200,context=32,"
                                        "rope=llama3,rope_factor=4,rope_orig_context=16"};
    for (size_t s = 0; s < FSDP_TEST_LEN(specs); s++)
        for (int d = 0; d < 2; d++) {
            fsdp_model m;
            build_ok(specs[s], &m);
            float **units = units_init(&m, 7);
            /* the vocabulary padding is not written: give it values that would show */
            const fsdp_param_spec *e = fsdp_model_find_param(&m, "model.embed_tokens.weight",
                                                             NULL);
            for (size_t k = (size_t)m.vocab_size * (size_t)e->shape[1]; k < e->numel;
                 k++)
                units[0][e->offset + k] = 5.0f;
            char path[256];
            fsdp_test_path(path, sizeof path, "m.safetensors");
            ck_assert_msg(fsdp_modelfile_write(path, fsdp_modelfile_format_find("safetensors"),
                                               &m, (const float *const *)units,
                                               d ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32) ==
                              FSDP_STATUS_OK, "%s", fsdp_error_msg());
            /* Hugging Face's names and shapes */
            fsdp_st_file st;
            ck_assert_int_eq(fsdp_st_open(path, &st), FSDP_STATUS_OK);
            bool head = false, embed = false;
            for (int i = 0; i < st.n_tensors; i++) {
                head |= !strcmp(st.tensors[i].name, "lm_head.weight");
                if (!strcmp(st.tensors[i].name, "model.embed_tokens.weight")) {
                    embed = true;
                    ck_assert_uint_eq(st.tensors[i].shape[0], (uint64_t)m.vocab_size);
                }
            }
            ck_assert(embed && head == !fsdp_llama_config_of(&m)->tied);
            fsdp_st_free(&st);
            /* read back: the same config; values exact (fp32) or rounded once (bf16) */
            fsdp_modelfile *mf = NULL;
            ck_assert_msg(fsdp_modelfile_open(&mf, path) == FSDP_STATUS_OK, "%s",
                          fsdp_error_msg());
            ck_assert_ptr_eq(fsdp_modelfile_family(mf), &fsdp_llama_family);
            ck_assert_str_eq(fsdp_modelfile_config(mf), m.config);
            ck_assert_int_eq(fsdp_modelfile_bind(mf, &m), FSDP_STATUS_OK);
            for (int u = 0; u < m.n_units; u++) {
                size_t n = m.units[u].numel;
                float *back = malloc(n * sizeof *back);
                ck_assert_int_eq(fsdp_modelfile_read_range(mf, u, 0, n, back), FSDP_STATUS_OK);
                for (int i = 0; i < m.units[u].n_params; i++) {
                    const fsdp_param_spec *p = &m.units[u].params[i];
                    size_t real = p->ndim == 2 && p->shape[0] == m.padded_vocab_size
                                      ? (size_t)m.vocab_size * p->shape[1]
                                      : p->numel;
                    for (size_t k = 0; k < p->numel; k++) {
                        float want = k >= real ? 0.0f
                                     : d ? fsdp_bf16_to_f32(fsdp_f32_to_bf16(units[u][p->offset + k]))
                                         : units[u][p->offset + k];
                        ck_assert_msg(back[p->offset + k] == want, "%s %s[%zu]: %g vs %g",
                                      specs[s], p->name, k, back[p->offset + k], want);
                    }
                }
                free(back);
            }
            fsdp_modelfile_close(mf);
            units_free(&m, units);
            fsdp_model_free(&m);
        }
}
END_TEST

/* A Hugging Face model.safetensors alone does not hold the heads: the
 * Llama mapping says which metadata is missing and where to read it. */
START_TEST(test_bare_hf_file_needs_its_config)
{
    fsdp_st_file st;
    ck_assert_int_eq(fsdp_st_open("tests/fixtures/llama_gqa/model.safetensors", &st),
                     FSDP_STATUS_OK);
    fsdp_file_tensor *t = calloc((size_t)st.n_tensors, sizeof *t);
    for (int i = 0; i < st.n_tensors; i++)
        t[i] = (fsdp_file_tensor){st.tensors[i].name, st.tensors[i].ndim, st.tensors[i].shape};
    fsdp_file_tensors ft = {.n = st.n_tensors, .t = t, .n_meta = st.n_meta,
                            .meta_key = (const char *const *)st.meta_key,
                            .meta_val = (const char *const *)st.meta_val};
    char config[FSDP_MODEL_CONFIG_MAX];
    ck_assert_int_eq(fsdp_llama_safetensors.config(&ft, config, sizeof config),
                     FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "\"num_attention_heads\" is missing") &&
                      strstr(fsdp_error_msg(), "config.json"),
                  "%s", fsdp_error_msg());
    /* the same tensors with the metadata fsdp writes: the fixture's model */
    const char *keys[] = {"num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                          "rms_norm_eps", "rope_theta", "rope_type", "rope_factor",
                          "rope_low_freq_factor", "rope_high_freq_factor",
                          "rope_original_max_position_embeddings"};
    const char *vals[] = {"4", "2", "256", "1e-05", "500000", "llama3", "8", "1", "4", "64"};
    ft.n_meta = (int)FSDP_TEST_LEN(keys);
    ft.meta_key = keys;
    ft.meta_val = vals;
    ck_assert_msg(fsdp_llama_safetensors.config(&ft, config, sizeof config) == FSDP_STATUS_OK,
                  "%s", fsdp_error_msg());
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_build(&fsdp_llama_family, config, &m), FSDP_STATUS_OK);
    fsdp_tensor_src *src = calloc(64, sizeof *src);
    ck_assert_msg(fsdp_st_locate(&st, 1, "model.safetensors", NULL, &m, src) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_ptr_nonnull(strstr(m.config, "rope=llama3,rope_factor=8,rope_low_freq=1,"
                                           "rope_high_freq=4,rope_orig_context=64"));
    free(src);
    fsdp_model_free(&m);
    /* a GPT-2 file is not a Llama */
    fsdp_st_file g;
    ck_assert_int_eq(fsdp_st_open("tests/fixtures/tiny_gpt2.safetensors", &g), FSDP_STATUS_OK);
    fsdp_file_tensor gt[64];
    for (int i = 0; i < g.n_tensors && i < 64; i++)
        gt[i] = (fsdp_file_tensor){g.tensors[i].name, g.tensors[i].ndim, g.tensors[i].shape};
    fsdp_file_tensors gft = {.n = g.n_tensors < 64 ? g.n_tensors : 64, .t = gt};
    ck_assert_int_eq(fsdp_llama_safetensors.config(&gft, config, sizeof config),
                     FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "not a Llama-family model"));
    fsdp_st_free(&g);
    free(t);
    fsdp_st_free(&st);
}
END_TEST

/* ---- commands --------------------------------------------------------------------- */

START_TEST(test_commands)
{
    static const fsdp_test_cli_case cases[] = {
        {"plan --model llama3.1-8b --devices 8 --device-mem 24GiB --offload optimizer --seq 1024 "
         "--batch 1", 0, "8030261248 parameters"},
        {"plan --model qwen2.5-7b --devices 8 --seq 512 --batch 1 --json", 0, "\"per_device\""},
        {"plan --model llama3.1-70b --devices 8 --offload optimizer --seq 256 --batch 1", 0,
         "70553706496 parameters"},
        {"shardmap --model qwen2-tiny --devices 2 --params", 0, "model.layers.1.self_attn.v_proj.bias"},
        {"train --model llama-tiny --steps 3 --devices 2 --quiet", 0, NULL},
        {"train --model llama:rope=yarn --steps 1", 2, "rope=yarn is not a rope scaling type"},
        {"train --model llama-tiny --seq 65 --steps 1", 2, "context"},
        {"plan --help", 0, "llama3.1-8b"},
    };
    fsdp_test_cli_cases(cases, FSDP_TEST_LEN(cases));
    /* train, convert to safetensors, sample from it */
    char ck[256], st[256], out[8192];
    fsdp_test_path(ck, sizeof ck, "ck");
    fsdp_test_path(st, sizeof st, "m.safetensors");
    int rc = fsdp_test_cli(out, sizeof out, "train --model qwen2-tiny --steps 2 --devices 2 "
                           "--ckpt-dir %s --quiet", ck);
    ck_assert_msg(rc == 0, "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "convert %s %s --dtype bf16", ck, st);
    ck_assert_msg(rc == 0 && strstr(out, "model qwen2-tiny"), "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s --prompt 12 --tokens 4", st);
    ck_assert_msg(rc == 0, "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "shardmap --model %s --params", st);
    ck_assert_msg(rc == 0 && strstr(out, "model.embed_tokens.weight"), "%s", out);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"configs", 60,
         FSDP_TESTS(test_released_shapes, test_fused_layout_decay_init, test_spec_errors,
                    test_spec_defaults_and_canonical, test_hf_config_read, test_hf_config_refusals,
                    test_hf_config_write_reads_back)},
        {"files", 120, .tmpdir = true,
         FSDP_TESTS(test_safetensors_round_trip, test_bare_hf_file_needs_its_config,
                    test_commands)},
    };
    return fsdp_test_main("llama_weights", tcases, FSDP_TEST_LEN(tcases));
}
