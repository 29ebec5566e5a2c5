/*
 * convert.c - `fsdp convert IN OUT`: move model weights between any two
 * weight formats (src/ckpt/modelfile.h: an fsdp checkpoint directory, an
 * llm.c model file, a Hugging Face .safetensors file or model directory),
 * in any direction the model's family has names for.
 *
 * IN's format comes from its form (fsdp_modelfile_format_of). OUT's comes
 * from --to, else its extension (*.bin llm.c, *.safetensors one file),
 * else it is a directory of the other kind than IN: a Hugging Face
 * directory (what transformers loads), or a checkpoint when IN is a
 * Hugging Face directory. IN is validated completely before anything is
 * written; OUT is written atomically. The whole model passes through host
 * memory once (fp32). fp32 conversions are bit-exact; --dtype bf16 rounds
 * to nearest even, and bf16 read back as bf16 is exact.
 *
 * A Hugging Face OUT gets the tokenizer and generation files of a Hugging
 * Face IN, or those of --tokenizer's directory (with that tokenizer.json).
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "ckpt/modelfile.h"
#include "data/hftok.h"

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* OUT's format (see the top of the file), or NULL after a usage message. */
static const fsdp_modelfile_format *out_format(const char *to, const char *out,
                                              const char *in)
{
    if (to) {
        const fsdp_modelfile_format *f = fsdp_modelfile_format_find(to);
        if (!f) {
            char names[128] = "";
            for (int i = 0; i < fsdp_modelfile_format_count(); i++)
                snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                         i ? "|" : "",
                         fsdp_modelfile_format_short_name(fsdp_modelfile_format_at(i)));
            fsdp_cli_usage("convert", "--to: unknown format '%s' (expected %s)", to, names);
        }
        return f;
    }
    if (has_suffix(out, ".bin") || has_suffix(out, ".safetensors"))
        return fsdp_modelfile_format_of(out);
    const fsdp_modelfile_format *hf = fsdp_modelfile_format_find("hf");
    return fsdp_modelfile_format_of(in) == hf ? fsdp_modelfile_format_find("ckpt") : hf;
}

/* --tokenizer must be a tokenizer.json whose ids fit the model. */
static fsdp_status check_tokenizer(const char *path, const fsdp_model *m)
{
    fsdp_hftok *t = NULL;
    if (fsdp_hftok_open(&t, path) != FSDP_STATUS_OK) {
        fsdp_error_prefix("--tokenizer must be a Hugging Face tokenizer.json");
        return FSDP_STATUS_INVALID_ARG;
    }
    int v = fsdp_hftok_vocab(t);
    fsdp_hftok_free(t);
    if (v > m->vocab_size)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "tokenizer '%s' has %d tokens but model "
                              "'%s' a vocabulary of %d: it is another model's tokenizer", path,
                              v, m->name, m->vocab_size);
    return FSDP_STATUS_OK;
}

int fsdp_cli_convert(int argc, char **argv)
{
    const char *dtype = "fp32", *to = NULL, *tokenizer = NULL;
    size_t shard_bytes = 0;
    bool quiet = false;
    fsdp_opt opts[] = {
        {.name = "dtype", .type = FSDP_OPT_STR, .dst = &dtype, .metavar = "fp32|bf16",
         .help = "element type of the tensors OUT holds (default fp32; checkpoints are always "
                 "fp32)"},
        {.name = "to", .type = FSDP_OPT_STR, .dst = &to, .metavar = "llmc|safetensors|hf|ckpt",
         .help = "OUT's format (default: by OUT's extension, else a Hugging Face directory, "
                 "or a checkpoint when IN is a Hugging Face directory)"},
        {.name = "shard-size", .type = FSDP_OPT_SIZE, .dst = &shard_bytes, .metavar = "BYTES",
         .help = "Hugging Face OUT: the most bytes per safetensors file, e.g. 2GB (default 5GB); "
                 "more than one file gets model.safetensors.index.json"},
        {.name = "tokenizer", .type = FSDP_OPT_STR, .dst = &tokenizer, .metavar = "tokenizer.json",
         .help = "Hugging Face OUT: ship this tokenizer (and the tokenizer_config.json, "
                 "special_tokens_map.json and generation_config.json next to it); default: "
                 "those of a Hugging Face IN"},
        {.name = "quiet", .type = FSDP_OPT_FLAG, .dst = &quiet, .metavar = "",
         .help = "print nothing on success"},
    };
    const char *pos[2];
    int n_pos = 0;
    int rc = fsdp_args_parse("convert",
                             "IN OUT [--dtype fp32|bf16] [--to FORMAT]   (IN, OUT: CKPT_DIR | "
                             "FILE.bin | FILE.safetensors | HF_DIR)",
                             opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, pos, 2, &n_pos);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (n_pos != 2)
        return fsdp_cli_usage("convert", "need IN and OUT (a checkpoint directory, FILE.bin, "
                              "FILE.safetensors or a Hugging Face directory each)");
    fsdp_dtype dt;
    if (!strcmp(dtype, "fp32"))
        dt = FSDP_DTYPE_F32;
    else if (!strcmp(dtype, "bf16"))
        dt = FSDP_DTYPE_BF16;
    else
        return fsdp_cli_usage("convert", "--dtype: unknown value '%s' (expected fp32|bf16)",
                              dtype);
    const fsdp_modelfile_format *out_fmt = out_format(to, pos[1], pos[0]);
    if (!out_fmt)
        return 2;
    bool to_hf = out_fmt == fsdp_modelfile_format_find("hf");
    if (out_fmt == fsdp_modelfile_format_find("ckpt") && dt != FSDP_DTYPE_F32)
        return fsdp_cli_usage("convert", "checkpoints hold fp32 parameters; drop --dtype %s or "
                              "write a .bin, .safetensors or Hugging Face OUT", dtype);
    if (!to_hf && (tokenizer || shard_bytes))
        return fsdp_cli_usage("convert", "--%s applies to Hugging Face directories only, and "
                              "OUT '%s' is a %s", tokenizer ? "tokenizer" : "shard-size", pos[1],
                              fsdp_modelfile_format_name(out_fmt));
    fsdp_modelfile *mf = NULL;
    fsdp_model m;
    float **units = NULL;
    char copied[512] = "", tok_dir[4096];
    fsdp_status st = fsdp_modelfile_resolve(pos[0], &m, &mf);
    if (st == FSDP_STATUS_OK && !mf) {
        fsdp_model_free(&m);
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "IN '%s' names a model shape, not weights; "
                            "give a checkpoint directory, FILE.bin, FILE.safetensors or a "
                            "Hugging Face directory", pos[0]);
    }
    if (st == FSDP_STATUS_OK && tokenizer)
        st = check_tokenizer(tokenizer, &m);
    if (st != FSDP_STATUS_OK)
        goto fail;
    units = calloc((size_t)m.n_units, sizeof *units);
    if (!units) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        goto fail;
    }
    for (int u = 0; u < m.n_units; u++) {
        units[u] = malloc(m.units[u].numel * sizeof(float) + 1);
        if (!units[u]) {
            char b[32];
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for unit '%s' (%s)",
                                m.units[u].name,
                                fsdp_fmt_bytes(b, sizeof b, 4.0 * (double)m.units[u].numel));
            goto fail;
        }
        if ((st = fsdp_modelfile_read_range(mf, u, 0, m.units[u].numel, units[u])) !=
            FSDP_STATUS_OK)
            goto fail;
    }
    fsdp_modelfile_write_opts wo = {.dtype = dt, .shard_bytes = shard_bytes,
                                    .companions = fsdp_modelfile_companions(mf),
                                    .tokenizer = tokenizer, .copied = copied,
                                    .copied_size = sizeof copied};
    if (tokenizer) { /* its configuration and template come from where it comes from */
        snprintf(tok_dir, sizeof tok_dir, "%s", tokenizer);
        wo.companions = dirname(tok_dir);
    }
    st = fsdp_modelfile_write_with(pos[1], out_fmt, &m, (const float *const *)units, &wo);
    if (st == FSDP_STATUS_OK && !quiet) {
        printf("converted %s '%s' (%s, model %s, %.2fM parameters) to %s '%s' (%s)\n",
               fsdp_modelfile_format_name(fsdp_modelfile_format_get(mf)),
               fsdp_modelfile_path(mf), fsdp_modelfile_dtype_name(mf), m.name,
               (double)m.numel / 1e6, fsdp_modelfile_format_name(out_fmt), pos[1],
               out_fmt == fsdp_modelfile_format_find("ckpt") ? "fp32, step 0, 1 device" : dtype);
        if (to_hf)
            printf("copied along: %s\n", copied[0] ? copied : "nothing (no tokenizer: pass "
                                                             "--tokenizer tokenizer.json)");
    }
fail:
    if (st != FSDP_STATUS_OK)
        fprintf(stderr, "fsdp convert: error: %s\n", fsdp_error_msg());
    if (units)
        for (int u = 0; u < m.n_units; u++)
            free(units[u]);
    free(units);
    fsdp_modelfile_close(mf); /* bound to the model: closed first */
    fsdp_model_free(&m);      /* zeroed when resolving failed */
    if (st != FSDP_STATUS_OK)
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    return 0;
}
