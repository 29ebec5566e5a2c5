/*
 * llama_hf.c - the Llama family's Hugging Face config.json: the config a
 * downloaded model directory describes (model_type llama, qwen2, mistral)
 * and the config.json fsdp writes next to exported weights, which
 * transformers' AutoModelForCausalLM.from_pretrained loads (the slots of
 * models/weights.h; the directory reader and writer in src/ckpt call them).
 *
 * Read: the shape keys (hidden_size, intermediate_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim, vocab_size,
 * max_position_embeddings), rms_norm_eps, tie_word_embeddings, the rope
 * settings in either spelling - transformers 4's top-level rope_theta and
 * rope_scaling {rope_type (or type), factor, low_freq_factor,
 * high_freq_factor, original_max_position_embeddings}, or transformers 5's
 * rope_parameters holding rope_theta too - and the biases: Qwen2 always has
 * q/k/v biases, Llama's attention_bias would put one on o_proj as well,
 * which fsdp's layer does not have, so it is refused like mlp_bias, other
 * activations, other rope types and quantized checkpoints: FORMAT naming
 * the key. A sliding window (Mistral, Qwen2's use_sliding_window) shorter
 * than the context becomes the context: up to the window, sliding and full
 * causal attention are the same, and fsdp refuses longer sequences.
 *
 * Write: transformers 4's spelling (which transformers 5 still reads), the
 * architecture from the biases: q/k/v biases make a Qwen2ForCausalLM,
 * none a LlamaForCausalLM. Token ids (bos/eos) belong to the tokenizer and
 * are not written here.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json.h"
#include "models/llama.h"

const char *const fsdp_llama_hf_model_types[] = {"llama", "qwen2", "mistral", NULL};

/* The architectures whose weights are exactly a causal LM of this family. */
static const char *const architectures[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                            "MistralForCausalLM"};

static fsdp_status key_error(const char *key, const fsdp_json *v, const char *want)
{
    if (!v)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json has no \"%s\"; it needs %s", key,
                              want);
    if (v->type == FSDP_JSON_STRING && !fsdp_json_name(v))
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json \"%s\" holds \\u0000 (a NUL "
                              "character); fsdp needs %s", key, want);
    if (v->type == FSDP_JSON_STRING)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json \"%s\" is \"%.64s\"; fsdp needs %s",
                              key, v->str, want);
    if (v->type == FSDP_JSON_NUMBER)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json \"%s\" is %g; fsdp needs %s", key,
                              v->number, want);
    return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json \"%s\" is a%s %s; fsdp needs %s", key,
                          v->type == FSDP_JSON_ARRAY || v->type == FSDP_JSON_OBJECT ? "n" : "",
                          fsdp_json_type_name(v->type), want);
}

/* Integer member `key` of obj in [lo, hi]; absent or null: def (or FORMAT
 * when def < 0). `name` is the key as messages spell it. */
static fsdp_status get_int(const fsdp_json *obj, const char *key, const char *name, double lo,
                           double hi, int def, int *out)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    if ((!v || v->type == FSDP_JSON_NULL) && def >= 0) {
        *out = def;
        return FSDP_STATUS_OK;
    }
    if (!v || v->type != FSDP_JSON_NUMBER || v->number != floor(v->number) || v->number < lo ||
        v->number > hi) {
        char want[64];
        snprintf(want, sizeof want, "an integer in [%.0f, %.0f]", lo, hi);
        return key_error(name, v && v->type != FSDP_JSON_NULL ? v : NULL, want);
    }
    *out = (int)v->number;
    return FSDP_STATUS_OK;
}

/* Number member `key` of obj, > 0; absent or null: def (FORMAT when def <= 0). */
static fsdp_status get_pos(const fsdp_json *obj, const char *key, const char *name, double def,
                           double *out)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    if ((!v || v->type == FSDP_JSON_NULL) && def > 0) {
        *out = def;
        return FSDP_STATUS_OK;
    }
    if (!v || v->type != FSDP_JSON_NUMBER || !(v->number > 0) || !isfinite(v->number))
        return key_error(name, v && v->type != FSDP_JSON_NULL ? v : NULL, "a positive number");
    *out = v->number;
    return FSDP_STATUS_OK;
}

/* Boolean member `key` of obj; absent or null: def. */
static fsdp_status get_bool(const fsdp_json *obj, const char *key, bool def, bool *out)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    if (!v || v->type == FSDP_JSON_NULL) {
        *out = def;
        return FSDP_STATUS_OK;
    }
    if (v->type != FSDP_JSON_BOOL)
        return key_error(key, v, "true or false");
    *out = v->boolean;
    return FSDP_STATUS_OK;
}

/* The rope settings: theta and the scaling from rope_parameters
 * (transformers 5) or rope_theta + rope_scaling (transformers 4). */
static fsdp_status read_rope(const fsdp_json *cfg, fsdp_rope_spec *r)
{
    const fsdp_json *params = fsdp_json_get(cfg, "rope_parameters");
    const char *sname = "rope_parameters";
    const fsdp_json *sc = params;
    memset(r, 0, sizeof *r);
    if (params && params->type != FSDP_JSON_NULL) {
        if (params->type != FSDP_JSON_OBJECT)
            return key_error("rope_parameters", params, "an object");
        FSDP_TRY(get_pos(params, "rope_theta", "rope_parameters.rope_theta", 10000.0, &r->theta));
    } else {
        FSDP_TRY(get_pos(cfg, "rope_theta", "rope_theta", 10000.0, &r->theta));
        sc = fsdp_json_get(cfg, "rope_scaling");
        sname = "rope_scaling";
    }
    if (!sc || sc->type == FSDP_JSON_NULL) {
        r->type = FSDP_ROPE_DEFAULT;
        fsdp_llama_rope_neutralize(r);
        return FSDP_STATUS_OK;
    }
    if (sc->type != FSDP_JSON_OBJECT)
        return key_error(sname, sc, "an object or null");
    const fsdp_json *t = fsdp_json_get(sc, "rope_type");
    char key[64];
    snprintf(key, sizeof key, "%s.rope_type", sname);
    if (!t || t->type == FSDP_JSON_NULL) {
        t = fsdp_json_get(sc, "type");
        snprintf(key, sizeof key, "%s.type", sname);
    }
    if (!t || t->type == FSDP_JSON_NULL) {
        r->type = FSDP_ROPE_DEFAULT;
    } else if (t->type != FSDP_JSON_STRING ||
               fsdp_rope_type_parse(t->str, &r->type) != FSDP_STATUS_OK) {
        return key_error(key, t, "a rope type fsdp implements: \"default\", \"linear\" or "
                                 "\"llama3\"");
    }
    char name[96];
#define SCALE_KEY(k) (snprintf(name, sizeof name, "%s.%s", sname, k), name)
    if (r->type != FSDP_ROPE_DEFAULT)
        FSDP_TRY(get_pos(sc, "factor", SCALE_KEY("factor"), 0.0, &r->factor));
    if (r->type == FSDP_ROPE_LLAMA3) {
        FSDP_TRY(get_pos(sc, "low_freq_factor", SCALE_KEY("low_freq_factor"), 0.0,
                         &r->low_freq_factor));
        FSDP_TRY(get_pos(sc, "high_freq_factor", SCALE_KEY("high_freq_factor"), 0.0,
                         &r->high_freq_factor));
        FSDP_TRY(get_int(sc, "original_max_position_embeddings",
                         SCALE_KEY("original_max_position_embeddings"), 1, 1 << 24, -1,
                         &r->original_max_pos));
    }
#undef SCALE_KEY
    fsdp_llama_rope_neutralize(r);
    return FSDP_STATUS_OK;
}

/* Refuse what fsdp's layer does not compute. */
static fsdp_status check_supported(const fsdp_json *cfg, const char *type)
{
    const fsdp_json *arch = fsdp_json_get(cfg, "architectures");
    if (arch && arch->type == FSDP_JSON_ARRAY && arch->n > 0) {
        const fsdp_json *a = fsdp_json_at(arch, 0);
        bool known = false;
        for (size_t i = 0; a && a->type == FSDP_JSON_STRING &&
                           i < sizeof architectures / sizeof architectures[0]; i++)
            known = known || (fsdp_json_name(a) && !strcmp(a->str, architectures[i]));
        if (!known)
            return key_error("architectures", a, "a causal LM: LlamaForCausalLM, "
                                                 "Qwen2ForCausalLM or MistralForCausalLM");
    }
    const fsdp_json *act = fsdp_json_get(cfg, "hidden_act");
    if (act && act->type != FSDP_JSON_NULL && (!fsdp_json_name(act) || strcmp(act->str, "silu")))
        return key_error("hidden_act", act, "\"silu\" (the SwiGLU MLP)");
    if (fsdp_json_get(cfg, "quantization_config"))
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "config.json has \"quantization_config\": quantized checkpoints "
                              "are not supported; use the model's bf16 or fp32 release");
    bool b = false;
    FSDP_TRY(get_bool(cfg, "mlp_bias", false, &b));
    if (b)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json \"mlp_bias\" is true; fsdp's "
                              "Llama MLP has no biases");
    if (!strcmp(type, "llama")) {
        FSDP_TRY(get_bool(cfg, "attention_bias", false, &b));
        if (b)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "config.json \"attention_bias\" is true (biases on q, k, v and "
                                  "o_proj); fsdp supports q/k/v biases only (Qwen2)");
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_llama_hf_config(const struct fsdp_json *cfg, char *spec, size_t spec_size)
{
    if (!cfg || cfg->type != FSDP_JSON_OBJECT)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json is not a JSON object");
    const fsdp_json *mt = fsdp_json_get(cfg, "model_type");
    int kind = -1;
    for (int i = 0; fsdp_json_name(mt) && fsdp_llama_hf_model_types[i]; i++)
        if (!strcmp(mt->str, fsdp_llama_hf_model_types[i]))
            kind = i;
    if (kind < 0)
        return key_error("model_type", mt, "\"llama\", \"qwen2\" or \"mistral\"");
    const char *type = fsdp_llama_hf_model_types[kind];
    FSDP_TRY(check_supported(cfg, type));

    fsdp_llama_config c;
    memset(&c, 0, sizeof c);
    FSDP_TRY(get_int(cfg, "num_hidden_layers", "num_hidden_layers", 1, 4096, -1, &c.n_layer));
    FSDP_TRY(get_int(cfg, "num_attention_heads", "num_attention_heads", 1, 4096, -1, &c.n_head));
    FSDP_TRY(get_int(cfg, "num_key_value_heads", "num_key_value_heads", 1, 4096, c.n_head,
                     &c.n_kv_head));
    FSDP_TRY(get_int(cfg, "hidden_size", "hidden_size", 1, 65536, -1, &c.n_embd));
    FSDP_TRY(get_int(cfg, "intermediate_size", "intermediate_size", 1, 1 << 20, -1, &c.n_inter));
    FSDP_TRY(get_int(cfg, "vocab_size", "vocab_size", 1, 1 << 24, -1, &c.vocab_size));
    FSDP_TRY(get_int(cfg, "max_position_embeddings", "max_position_embeddings", 1, 1 << 24, -1,
                     &c.max_seq_len));
    int def_hd = c.n_embd % c.n_head == 0 ? c.n_embd / c.n_head : -1;
    FSDP_TRY(get_int(cfg, "head_dim", "head_dim", 2, 65536, def_hd, &c.head_dim));
    FSDP_TRY(get_pos(cfg, "rms_norm_eps", "rms_norm_eps", 1e-6, &c.norm_eps));
    FSDP_TRY(get_bool(cfg, "tie_word_embeddings", false, &c.tied));
    FSDP_TRY(read_rope(cfg, &c.rope));
    c.qkv_bias = !strcmp(type, "qwen2");

    /* a sliding window no shorter than the sequences is full attention */
    bool sliding = strcmp(type, "mistral") == 0;
    if (!strcmp(type, "qwen2"))
        FSDP_TRY(get_bool(cfg, "use_sliding_window", false, &sliding));
    const fsdp_json *win = fsdp_json_get(cfg, "sliding_window");
    if (sliding && win && win->type != FSDP_JSON_NULL) {
        int w;
        FSDP_TRY(get_int(cfg, "sliding_window", "sliding_window", 1, 1 << 30, -1, &w));
        if (w < c.max_seq_len)
            c.max_seq_len = w;
    }

    c.padded_vocab_size = fsdp_model_round_vocab(c.vocab_size);
    fsdp_status st = fsdp_llama_config_validate(&c);
    if (st != FSDP_STATUS_OK)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "config.json describes a model fsdp cannot "
                              "build: %s", fsdp_error_msg());
    fsdp_llama_config_format(&c, spec, spec_size);
    return FSDP_STATUS_OK;
}

/* ---- config.json out --------------------------------------------------------- */

fsdp_status fsdp_llama_hf_config_write(const fsdp_model *m, const char *dtype,
                                       struct fsdp_sbuf *out)
{
    const fsdp_llama_config *c = fsdp_llama_config_of(m);
    if (!c)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "model '%s' is not a Llama-family model",
                              m ? m->name : "(null)");
    if (!dtype || (strcmp(dtype, "float32") && strcmp(dtype, "bfloat16")))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "config.json torch_dtype '%s': write "
                              "\"float32\" or \"bfloat16\"", dtype ? dtype : "(null)");
    const bool qwen2 = c->qkv_bias;
    char eps[32], theta[32], factor[32], low[32], high[32];
    fsdp_llama_fmt_num(eps, sizeof eps, c->norm_eps);
    fsdp_llama_fmt_num(theta, sizeof theta, c->rope.theta);
    fsdp_sbuf_printf(out, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n",
                     qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM", qwen2 ? "qwen2" : "llama");
    if (!qwen2)
        fsdp_sbuf_printf(out, "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n");
    fsdp_sbuf_printf(out,
                     "  \"attention_dropout\": 0.0,\n  \"head_dim\": %d,\n"
                     "  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
                     "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
                     "  \"max_position_embeddings\": %d,\n  \"num_attention_heads\": %d,\n"
                     "  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n"
                     "  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n",
                     c->head_dim, c->n_embd, c->n_inter, c->max_seq_len, c->n_head, c->n_layer,
                     c->n_kv_head, eps, theta);
    if (c->rope.type == FSDP_ROPE_DEFAULT) {
        fsdp_sbuf_printf(out, "  \"rope_scaling\": null,\n");
    } else {
        fsdp_llama_fmt_num(factor, sizeof factor, c->rope.factor);
        fsdp_sbuf_printf(out, "  \"rope_scaling\": {\"rope_type\": \"%s\", \"factor\": %s",
                         fsdp_rope_type_name(c->rope.type), factor);
        if (c->rope.type == FSDP_ROPE_LLAMA3) {
            fsdp_llama_fmt_num(low, sizeof low, c->rope.low_freq_factor);
            fsdp_llama_fmt_num(high, sizeof high, c->rope.high_freq_factor);
            fsdp_sbuf_printf(out, ", \"low_freq_factor\": %s, \"high_freq_factor\": %s, "
                             "\"original_max_position_embeddings\": %d",
                             low, high, c->rope.original_max_pos);
        }
        fsdp_sbuf_printf(out, "},\n");
    }
    if (qwen2)
        fsdp_sbuf_printf(out, "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n"
                         "  \"max_window_layers\": %d,\n", c->n_layer);
    fsdp_sbuf_printf(out,
                     "  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\",\n"
                     "  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
                     c->tied ? "true" : "false", dtype, c->vocab_size);
    return out->oom ? fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing config.json")
                    : FSDP_STATUS_OK;
}
