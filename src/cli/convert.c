/*
 * convert.c - `fsdp convert IN OUT`: move model weights between any two
 * weight formats (src/ckpt/modelfile.h: an fsdp checkpoint directory, an
 * llm.c model file, a Hugging Face .safetensors file or model directory),
 * in any direction the model's family has names for.
 *
 * IN's format comes from its form (fsdp_modelfile_format_of). OUT's comes
 * from --to, else its extension (*.bin llm.c, *.safetensors one file),
 * else it is a directory of the other kind than IN: the first directory
 * format of the table that IN is not (a Hugging Face directory, what
 * transformers loads; a checkpoint when IN is a Hugging Face directory).
 * Every format name, suffix and property comes from the format table
 * (ckpt/modelfile.h); this file spells none. IN is validated completely
 * before anything is
 * written; OUT is written atomically. The whole model passes through host
 * memory once (fp32). fp32 conversions are bit-exact; --dtype bf16 rounds
 * to nearest even, and bf16 read back as bf16 is exact. Without --dtype, OUT
 * is fp32 but for a bf16 IN (all its tensors bf16) written in its own
 * format: that stays bf16 (lossless both ways, half the bytes).
 *
 * --quantize nf4 (a Hugging Face OUT only) writes a bnb-4bit directory
 * (ckpt/bnb4.h): the block linear weights in NF4 as transformers +
 * bitsandbytes save them, the rest in --dtype (bf16 unless given); a LoRA
 * IN is merged first, as for any Hugging Face OUT.
 *
 * A Hugging Face OUT gets the tokenizer and generation files of a Hugging
 * Face IN or those a checkpoint IN carries (ckpt/ckpt_tok.h), or those of
 * --tokenizer's directory (with that tokenizer.json), and a
 * generation_config.json with the tokenizer's BOS, padding and stop tokens
 * when they hold none (their own gets the chat format's end of turn added
 * when it lacks it). A checkpoint OUT carries the tokenizer of a Hugging
 * Face or checkpoint IN.
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/bnb4.h"
#include "ckpt/ckpt_tok.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "ckpt/modelfile.h"
#include "data/chat.h"
#include "data/hftok.h"
#include "models/lora.h"
#include "train/adapt.h"

/* OUT's format (see the top of the file), or NULL after a usage message. */
static const fsdp_modelfile_format *out_format(const char *to, const char *out,
                                              const char *in)
{
    if (to) {
        const fsdp_modelfile_format *f = fsdp_modelfile_format_find(to);
        if (!f) {
            char names[128];
            fsdp_cli_usage("convert", "--to: unknown format '%s' (expected %s)", to,
                           fsdp_modelfile_format_names(names, sizeof names, "|"));
        }
        return f;
    }
    const fsdp_modelfile_format *f = fsdp_modelfile_format_by_suffix(out);
    if (f)
        return f;
    const fsdp_modelfile_format *in_fmt = fsdp_modelfile_format_of(in);
    for (int i = 0; i < fsdp_modelfile_format_count(); i++) {
        f = fsdp_modelfile_format_at(i);
        if (fsdp_modelfile_format_is_dir(f) && f != in_fmt)
            return f;
    }
    return in_fmt; /* a table of one directory format */
}

/* The names (name_of: short or long) of the formats for which `has`
 * holds, joined by sep. */
static const char *formats_with(bool (*has)(const fsdp_modelfile_format *),
                                const char *(*name_of)(const fsdp_modelfile_format *),
                                const char *sep, char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < fsdp_modelfile_format_count() && at < n; i++) {
        const fsdp_modelfile_format *f = fsdp_modelfile_format_at(i);
        if (has(f))
            at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? sep : "", name_of(f));
    }
    return buf;
}

/* The dtype and the options OUT's format must take. 0, or 2 after a usage
 * message. */
static int check_out_options(const fsdp_modelfile_format *f, const char *out, fsdp_dtype dt,
                             const char *tokenizer, size_t shard_bytes)
{
    char names[128];
    if (dt != FSDP_DTYPE_F32 && !fsdp_modelfile_format_writes_bf16(f))
        return fsdp_cli_usage("convert", "a %s holds fp32 parameters only; drop --dtype %s or "
                              "write another format (--to %s)", fsdp_modelfile_format_name(f),
                              fsdp_dtype_name(dt),
                              formats_with(fsdp_modelfile_format_writes_bf16,
                                           fsdp_modelfile_format_short_name, "|", names,
                                           sizeof names));
    if (!fsdp_modelfile_format_ships_tokenizer(f) && (tokenizer || shard_bytes))
        return fsdp_cli_usage("convert", "--%s applies to a %s OUT only, and OUT '%s' is a %s",
                              tokenizer ? "tokenizer" : "shard-size",
                              formats_with(fsdp_modelfile_format_ships_tokenizer,
                                           fsdp_modelfile_format_name, " or ", names,
                                           sizeof names),
                              out, fsdp_modelfile_format_name(f));
    return 0;
}

/* A model format holds the weights, not adapters: *m becomes the base model (family and
 * config without adapters) and *units its parameters with every adapter merged,
 * W + scale B A (models/lora.h). */
static fsdp_status merge_lora(fsdp_model *m, float ***units)
{
    fsdp_model base;
    FSDP_TRY(fsdp_model_build(m->family, m->config, &base));
    float **out = calloc((size_t)base.n_units, sizeof *out);
    fsdp_status st = out ? FSDP_STATUS_OK
                         : fsdp_error_set(FSDP_STATUS_OOM, "out of host memory merging adapters");
    for (int u = 0; st == FSDP_STATUS_OK && u < base.n_units; u++)
        if (!(out[u] = malloc(base.units[u].numel * sizeof(float) + 1)))
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory merging adapters");
    if (st == FSDP_STATUS_OK)
        fsdp_lora_merge(m, (const float *const *)*units, &base, out);
    float **drop = st == FSDP_STATUS_OK ? *units : out;
    for (int u = 0; drop && u < (drop == out ? base.n_units : m->n_units); u++)
        free(drop[u]);
    free(drop);
    if (st != FSDP_STATUS_OK) {
        fsdp_model_free(&base);
        return st;
    }
    fsdp_model_free(m);
    *m = base;
    *units = out;
    return FSDP_STATUS_OK;
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

/* The ids generation_config.json gives transformers' generate, from the
 * tokenizer.json at `path`: its BOS; the end of an assistant turn of the
 * chat format it renders (data/chat.h: Llama 3 <|eot_id|>, ChatML
 * <|im_end|>) and its end of text, which stop the generation (the end of
 * turn alone is added to the model's own file); the end of text again as
 * padding. When the chat template does not open, the end of turn is left
 * out with a warning: the export does not depend on it. */
static fsdp_status generation_ids(const char *path, fsdp_modelfile_generation *g)
{
    fsdp_hftok *t = NULL;
    FSDP_TRY(fsdp_hftok_open(&t, path));
    fsdp_chat *chat = NULL;
    fsdp_chat_opts o = {.tokenizer = path};
    int eot = fsdp_hftok_eot(t), turn = -1;
    if (fsdp_chat_open(&chat, t, &o) != FSDP_STATUS_OK)
        fprintf(stderr, "fsdp convert: warning: generation_config.json lists no end-of-turn "
                        "token: %s\n", fsdp_error_msg());
    else if (chat)
        turn = fsdp_chat_end_of_turn(chat, t);
    *g = (fsdp_modelfile_generation){.bos_token_id = fsdp_hftok_bos(t), .pad_token_id = eot,
                                     .end_of_turn = turn};
    if (turn >= 0)
        g->eos_token_id[g->n_eos++] = turn;
    if (eot >= 0 && eot != turn)
        g->eos_token_id[g->n_eos++] = eot;
    fsdp_chat_free(chat);
    fsdp_hftok_free(t);
    return FSDP_STATUS_OK;
}

/* --to's help: the default OUT format, from the table's directory formats. */
static const char *to_help(char *buf, size_t n)
{
    const fsdp_modelfile_format *dirs[2] = {NULL, NULL};
    for (int i = 0, k = 0; i < fsdp_modelfile_format_count() && k < 2; i++)
        if (fsdp_modelfile_format_is_dir(fsdp_modelfile_format_at(i)))
            dirs[k++] = fsdp_modelfile_format_at(i);
    int at = snprintf(buf, n, "OUT's format (default: by OUT's extension, else a %s",
                      fsdp_modelfile_format_name(dirs[0]));
    if (dirs[1] && at >= 0 && (size_t)at < n)
        at += snprintf(buf + at, n - (size_t)at, ", or a %s when IN is a %s",
                       fsdp_modelfile_format_name(dirs[1]), fsdp_modelfile_format_name(dirs[0]));
    if (at >= 0 && (size_t)at < n)
        snprintf(buf + at, n - (size_t)at, ")");
    return buf;
}

/* Every unit of m read from mf whole, as fp32, into *out (an array of
 * m->n_units buffers, set before the first is read, so the caller frees
 * what was allocated whatever fails). */
static fsdp_status read_units(fsdp_modelfile *mf, const fsdp_model *m, float ***out)
{
    float **units = calloc((size_t)m->n_units, sizeof *units);
    *out = units;
    if (!units)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    for (int u = 0; u < m->n_units; u++) {
        units[u] = malloc(m->units[u].numel * sizeof(float) + 1);
        if (!units[u]) {
            char b[32];
            return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for unit '%s' (%s)",
                                  m->units[u].name,
                                  fsdp_fmt_bytes(b, sizeof b, 4.0 * (double)m->units[u].numel));
        }
        FSDP_TRY(fsdp_modelfile_read_range(mf, u, 0, m->units[u].numel, units[u]));
    }
    return FSDP_STATUS_OK;
}

/* The success lines: what was read, what was written, what came along. */
static void print_converted(const fsdp_modelfile *mf, const fsdp_model *m,
                            const fsdp_modelfile_format *out_fmt, const char *out, fsdp_dtype dt,
                            bool merged, bool nf4, const char *copied)
{
    const char *note = fsdp_modelfile_format_note(out_fmt);
    printf("converted %s '%s' (%s, model %s, %.2fM parameters) to %s '%s' (%s%s%s%s%s)\n",
           fsdp_modelfile_format_name(fsdp_modelfile_format_get(mf)), fsdp_modelfile_path(mf),
           fsdp_modelfile_dtype_name(mf), m->name, (double)m->numel / 1e6,
           fsdp_modelfile_format_name(out_fmt), out, fsdp_dtype_name(dt), note ? ", " : "",
           note ? note : "", merged ? ", LoRA adapters merged into the weights" : "",
           nf4 ? ", block linear weights in NF4 (bnb-4bit)" : "");
    if (fsdp_modelfile_format_ships_tokenizer(out_fmt))
        printf("copied along: %s\n", copied[0] ? copied : "nothing (no tokenizer: pass "
                                                         "--tokenizer tokenizer.json)");
}

/* convert's options and operands. */
struct convert_args {
    const char *to, *tokenizer;
    int dtype;                   /* -1: fp32, bf16 with --quantize nf4 */
    int quantize;
    size_t shard_bytes;
    bool quiet;
    const char *pos[2];          /* IN, OUT */
    char files[384];             /* the forms IN and OUT take, for messages */
};

/* Parse convert's command line into *a; FSDP_ARGS_OK, or the exit code
 * (--help, a usage error). The option table and --help read the format
 * table (ckpt/modelfile.h) for every name, suffix and property. */
static int parse_args(int argc, char **argv, struct convert_args *a)
{
    *a = (struct convert_args){.dtype = -1, .quantize = FSDP_QUANT_NONE};
    /* every format name, suffix and property from the table (ckpt/modelfile.h) */
    char names[96], help_to[256], ships[96], help_shard[256], help_tok[320];
    char synopsis[512];
    fsdp_modelfile_format_names(names, sizeof names, "|");
    fsdp_modelfile_help(a->files, sizeof a->files);
    formats_with(fsdp_modelfile_format_ships_tokenizer, fsdp_modelfile_format_name, " or ", ships,
                 sizeof ships);
    snprintf(help_shard, sizeof help_shard, "%s OUT: the most bytes per safetensors file, e.g. "
             "2GB (default 5GB); more than one file gets model.safetensors.index.json", ships);
    snprintf(help_tok, sizeof help_tok, "%s OUT: ship this tokenizer (and the "
             "tokenizer_config.json, special_tokens_map.json and generation_config.json next "
             "to it); default: those of such an IN, or those a checkpoint IN carries", ships);
    snprintf(synopsis, sizeof synopsis,
             "IN OUT [--dtype fp32|bf16] [--to FORMAT] [--quantize nf4]   "
             "(IN, OUT: %s)",
             a->files);
    fsdp_opt opts[] = {
        {.name = "dtype", .type = FSDP_OPT_NAME, .dst = &a->dtype, .names = &fsdp_dtype_names,
         .help = "element type of the tensors OUT holds (a format that holds fp32 only refuses "
                 "bf16; default fp32, bf16 for a bf16 IN in its own format and with "
                 "--quantize nf4)"},
        {.name = "to", .type = FSDP_OPT_STR, .dst = &a->to, .metavar = names,
         .help = to_help(help_to, sizeof help_to)},
        {.name = "quantize", .type = FSDP_OPT_NAME, .dst = &a->quantize,
         .names = &fsdp_quant_names,
         .allow = FSDP_NAME_BIT(FSDP_QUANT_NF4),
         .help = "write a bnb-4bit Hugging Face directory (--to hf): every block linear "
                 "weight (not the LM head) in NF4 with double quantization, byte for byte as "
                 "transformers + bitsandbytes save it; the rest in --dtype"},
        {.name = "shard-size", .type = FSDP_OPT_SIZE, .dst = &a->shard_bytes, .metavar = "BYTES",
         .help = help_shard},
        {.name = "tokenizer", .type = FSDP_OPT_STR, .dst = &a->tokenizer,
         .metavar = "tokenizer.json",
         .help = help_tok},
        {.name = "quiet", .type = FSDP_OPT_FLAG, .dst = &a->quiet, .metavar = "",
         .help = "print nothing on success"},
    };
    int n_pos = 0;
    int rc = fsdp_args_parse("convert", synopsis, opts, (int)(sizeof opts / sizeof opts[0]), argc,
                             argv, a->pos, 2, &n_pos);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (n_pos != 2)
        return fsdp_cli_usage("convert", "need IN and OUT (each %s)", a->files);
    return FSDP_ARGS_OK;
}

int fsdp_cli_convert(int argc, char **argv)
{
    struct convert_args args;
    int rc = parse_args(argc, argv, &args);
    if (rc != FSDP_ARGS_OK)
        return rc;
    const char *to = args.to, *tokenizer = args.tokenizer, *const *pos = args.pos;
    const char *files = args.files;
    int dtype = args.dtype, quantize = args.quantize;
    size_t shard_bytes = args.shard_bytes;
    bool quiet = args.quiet;
    bool nf4 = quantize == FSDP_QUANT_NF4;
    fsdp_dtype dt = dtype >= 0 ? (fsdp_dtype)dtype : nf4 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    const fsdp_modelfile_format *out_fmt = out_format(to, pos[1], pos[0]);
    if (!out_fmt)
        return 2;
    if (nf4 && out_fmt != fsdp_modelfile_format_find("hf"))
        return fsdp_cli_usage("convert", "--quantize nf4 writes a bnb-4bit %s (--to hf), and OUT "
                              "'%s' is a %s", fsdp_modelfile_format_name(
                                  fsdp_modelfile_format_find("hf")),
                              pos[1], fsdp_modelfile_format_name(out_fmt));
    if ((rc = check_out_options(out_fmt, pos[1], dt, tokenizer, shard_bytes)))
        return rc;
    const fsdp_path_arg ins[] = {{"IN", pos[0], FSDP_PATH_TREE},
                                 {"--tokenizer", tokenizer, FSDP_PATH_FILE}};
    const fsdp_path_arg outs[] = {{"OUT", pos[1], fsdp_modelfile_format_is_dir(out_fmt)
                                                      ? FSDP_PATH_TREE : FSDP_PATH_FILE}};
    if ((rc = fsdp_cli_check_paths("convert", ins, 2, outs, 1)))
        return rc;
    fsdp_modelfile *mf = NULL;
    fsdp_model m;
    float **units = NULL;
    char copied[512] = "", tok_dir[4096], own_tok[4096];
    fsdp_modelfile_generation gen;
    fsdp_status st = fsdp_modelfile_resolve(pos[0], &m, &mf);
    if (st == FSDP_STATUS_OK && !mf) {
        fsdp_model_free(&m);
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "IN '%s' names a model shape, not weights; "
                            "give %s", pos[0], files);
    }
    if (st == FSDP_STATUS_OK && tokenizer)
        st = check_tokenizer(tokenizer, &m);
    /* else a Hugging Face IN's, or the one a checkpoint IN carries (checked) */
    bool has_own = false;
    if (st == FSDP_STATUS_OK && !tokenizer)
        st = fsdp_ckpt_tok_for_model(pos[0], own_tok, sizeof own_tok, &has_own);
    const char *tok_json = tokenizer ? tokenizer : has_own ? own_tok : NULL;
    if (st == FSDP_STATUS_OK && tok_json && fsdp_modelfile_format_ships_tokenizer(out_fmt))
        st = generation_ids(tok_json, &gen);
    if (st != FSDP_STATUS_OK)
        goto fail;
    if (m.train_numel < m.numel && out_fmt == fsdp_modelfile_format_find("ckpt")) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                            "'%s' is a checkpoint of a run with frozen parameters (its base is "
                            "'%s'); write the whole model with --to hf (LoRA adapters merged "
                            "into the weights) or the adapters with --to peft", pos[0],
                            fsdp_modelfile_base(mf) ? fsdp_modelfile_base(mf) : "?");
        goto fail;
    }
    /* without --dtype, a bf16 IN written in its own format stays bf16
     * (lossless either way, and half the bytes); another format gets fp32,
     * which every reader of it takes (llm.c's fp32 trainer reads no bf16) */
    const bool dt_open = dtype < 0 && !nf4 && fsdp_modelfile_format_writes_bf16(out_fmt);
    const bool dt_of_in = dt_open && out_fmt == fsdp_modelfile_format_get(mf) &&
                          !strcmp(fsdp_modelfile_dtype_name(mf), "bf16");
    if (dt_of_in)
        dt = FSDP_DTYPE_BF16;
    fsdp_ckpt_run run = {0}; /* a checkpoint IN's run, for the word on its precision */
    if (dt_open && !dt_of_in && (st = fsdp_ckpt_run_find(pos[0], &run)) != FSDP_STATUS_OK)
        goto fail;
    if ((st = read_units(mf, &m, &units)) != FSDP_STATUS_OK)
        goto fail;
    bool merged = m.lora.r && out_fmt != fsdp_modelfile_format_find("peft");
    if (merged && (st = merge_lora(&m, &units)) != FSDP_STATUS_OK)
        goto fail;
    fsdp_modelfile_write_opts wo = {.dtype = dt, .shard_bytes = shard_bytes,
                                    .companions = fsdp_modelfile_companions(mf),
                                    .tokenizer = tokenizer, .copied = copied,
                                    .base = fsdp_modelfile_base(mf),
                                    .copied_size = sizeof copied};
    if (tok_json && fsdp_modelfile_format_ships_tokenizer(out_fmt))
        wo.generation = &gen;
    if (tokenizer || (has_own && !wo.companions)) { /* its configuration and template come
                                                      * from where it comes from */
        snprintf(tok_dir, sizeof tok_dir, "%s", tok_json);
        wo.companions = dirname(tok_dir);
    }
    if (nf4)
        st = fsdp_bnb4_write(pos[1], &m, (const float *const *)units, &wo);
    else
        st = fsdp_modelfile_write_with(pos[1], out_fmt, &m, (const float *const *)units, &wo);
    if (st == FSDP_STATUS_OK && !quiet) {
        print_converted(mf, &m, out_fmt, pos[1], dt, merged, nf4, copied);
        if (dt_of_in)
            printf("dtype: bf16, as IN (--dtype fp32 writes fp32)\n");
        else if (dt == FSDP_DTYPE_F32 && run.found && !strcmp(run.compute_dtype, "bf16") &&
                 (merged || !m.lora.r)) /* a model, not adapters (fp32 as PEFT keeps them) */
            printf("dtype: fp32, the run's master weights as they are; it trained with "
                   "--precision bf16: --dtype bf16 writes half the bytes\n");
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
