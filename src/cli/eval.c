/*
 * eval.c - `fsdp eval`: the mean next-token loss of a model file on a data
 * set, over the first S micro-batches the trainer would read (same
 * numbering, so it matches a training run's loss on the same batches; by
 * default the batches that read the file once, as a run's --eval-data).
 * A checkpoint's run's --batch, --seq and --precision are the defaults, so
 * eval of a checkpoint repeats its run's eval loss.
 * Text and jsonl data are tokenized with --tokenizer, else with the
 * tokenizer.json of a Hugging Face model directory or the one a checkpoint
 * carries (ckpt/ckpt_tok.h); {"messages"} rows are rendered in --chat-format,
 * else as a checkpoint's run rendered them (its manifest says), else in
 * the tokenizer's own format, and stderr says which rendering was used.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_tok.h"
#include "cli/cli.h"
#include "cli/infer_opts.h"
#include "data/chat.h"
#include "train/train.h"

/* Defaults a checkpoint's run chose (--batch, --seq, --precision, --chat-format), so the
 * loss is over the tokens and in the dtype of its --eval-data figure; stderr names them. */
static int run_defaults(fsdp_infer_opts *io)
{
    fsdp_infer_config *c = &io->cfg;
    fsdp_ckpt_run run;
    if (fsdp_ckpt_run_find(c->model_path, &run) != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp eval: error: %s\n", fsdp_error_msg());
        return 1;
    }
    static char chat[FSDP_CKPT_CHAT_FORMAT_MAX];
    if (!c->chat_format && run.chat_format[0]) {
        snprintf(chat, sizeof chat, "%s", run.chat_format);
        c->chat_format = chat;
    }
    if (!run.found)
        return 0;
    char taken[96] = "";
    size_t k = 0;
    if (c->batch == 0 && run.batch > 0) {
        c->batch = run.batch;
        k += (size_t)snprintf(taken + k, sizeof taken - k, " --batch %d", run.batch);
    }
    if (c->seq == 0 && run.seq > 0) {
        c->seq = run.seq;
        k += (size_t)snprintf(taken + k, sizeof taken - k, " --seq %d", run.seq);
    }
    int v;
    if (!io->precision && fsdp_names_parse(&fsdp_dtype_names, 0, run.compute_dtype, &v) ==
                          FSDP_STATUS_OK) {
        c->compute_dtype = (fsdp_dtype)v;
        snprintf(taken + k, sizeof taken - k, " --precision %s", run.compute_dtype);
    }
    if (taken[0])
        fprintf(stderr, "defaults:%s (the checkpoint's run's, as its eval loss was measured; "
                "give them to choose)\n", taken);
    return 0;
}

int fsdp_cli_eval(int argc, char **argv)
{
    fsdp_infer_opts io;
    fsdp_opt_list l = {.n = 0};
    fsdp_infer_opts_table(&io, &l);
    fsdp_infer_config *c = &io.cfg;
    const char *data = NULL;
    int steps = 0; /* not given: the file once */
    uint64_t seed = 1337;
    bool per_batch = false;
    c->seq = 0;
    c->batch = 0; /* not given: a checkpoint's run's, else 8 */
    fsdp_opt_add(
        &l, "data", FSDP_OPT_STR, &data, "synthetic|FILE.txt|FILE.jsonl|'GLOB.bin'",
        "evaluation data: the synthetic task, a text file (bytes, or tokens with --tokenizer), "
        ".jsonl rows ({\"text\"}; {\"prompt\", \"completion\"} and {\"messages\"} rows count "
        "their completion or assistant tokens only, as training does), or llm.c token shards "
        "(required)");
    fsdp_opt_add(&l, "tokenizer", FSDP_OPT_STR, &c->tokenizer, "tokenizer.json",
                 "Hugging Face tokenizer for .txt and .jsonl data (GPT-2, Llama 3, Qwen2 families; "
                 "default: the model directory's, or the one a checkpoint carries)");
    static char chat_formats[96]; /* "template|llama3|chatml", from data/chat.c */
    fsdp_opt_add(&l, "chat-format", FSDP_OPT_STR, &c->chat_format,
                 fsdp_chat_format_names(chat_formats, sizeof chat_formats, "|"),
                 "how {\"messages\"} rows are rendered: the training run's --chat-format, so the "
                 "loss is over the same tokens (default: a checkpoint's run's, else the "
                 "chat_template beside the tokenizer, else the built-in format its special "
                 "tokens fit)");
    fsdp_opt_add_name(&l, "pack", &c->pack, &fsdp_train_pack_names,
                      "example (.jsonl prompt/completion, messages) rows, as train's --pack: the "
                      "same loss either way, packed rows take fewer batches");
    fsdp_opt_add_int(&l, "batch", &c->batch, 1, INT_MAX, "B",
                     "sequences per micro-batch (default: a checkpoint's run's --batch, else 8)");
    fsdp_opt_add(&l, "seq", FSDP_OPT_INT, &c->seq, "T",
                 "sequence length (default: a checkpoint's run's --seq; else on example rows "
                 "train's default, the longest example rounded up to a multiple of 64; else 64, "
                 "or the model's context if shorter)");
    fsdp_opt_add_int(&l, "steps", &steps, 1, INT_MAX, "S",
                     "micro-batches to average over: 0 .. S-1, numbered as the trainer numbers "
                     "them (default: those that read the data once, at most 50, as train's "
                     "--eval-steps; 10 of the synthetic task)");
    fsdp_opt_add(&l, "seed", FSDP_OPT_U64, &seed, "S",
                 "data seed, as for train (synthetic task; default 1337)");
    fsdp_opt_add(&l, "per-batch", FSDP_OPT_FLAG, &per_batch, "",
                 "also print each micro-batch's loss");
    int rc = fsdp_args_parse("eval", "--model FILE|DIR --data DATA [options]", l.v, l.n, argc, argv,
                             NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if ((rc = fsdp_infer_opts_finish("eval", &io)))
        return rc;
    if (!data) {
        fprintf(stderr, "fsdp eval: --data is required (synthetic, FILE.txt or token shards)\n");
        return 2;
    }
    if (c->chat_format && fsdp_chat_check_name(c->chat_format) != FSDP_STATUS_OK)
        return fsdp_cli_status("eval", FSDP_STATUS_INVALID_ARG);
    if (c->seq < 0)
        return fsdp_cli_usage("eval", "need --seq >= 1");
    char found[4096];
    bool has_own = false; /* a Hugging Face directory's or a checkpoint's */
    if (!c->tokenizer &&
        fsdp_ckpt_tok_for_model(c->model_path, found, sizeof found, &has_own) !=
            FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp eval: error: %s\n", fsdp_error_msg());
        return 1;
    }
    if (has_own && strcmp(data, "synthetic")) /* the synthetic task is byte-level text */
        c->tokenizer = found;
    if ((rc = run_defaults(&io)))
        return rc;
    if (c->batch == 0)
        c->batch = 8;
    c->note = stderr;
    fsdp_infer_eval_result res;
    fsdp_status st = fsdp_infer_eval(c, data, seed, steps, &res);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp eval: error: %s\n", fsdp_error_msg());
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    for (int m = 0; per_batch && m < res.n_batches; m++) {
        if (m >= res.n_data)
            printf("batch %d: past the end of the data (each example is read once)\n", m);
        else if (isnan(res.losses[m]))
            printf("batch %d: no target (every row is cut at --seq before its completion)\n", m);
        else
            printf("batch %d loss %.6g\n", m, res.losses[m]);
    }
    if (res.n_data < res.n_batches)
        fprintf(stderr, "note: the data fills %d batch%s of %d rows%s; batches %d-%d hold "
                "nothing (each example is read once)\n", res.n_data, res.n_data == 1 ? "" : "es",
                res.batch,
                res.packed ? " (packed)" : "", res.n_data, res.n_batches - 1);
    printf("mean loss %.6g over %d batch%s of %d x %d tokens (model %s, data %s, %d %s "
           "device(s))\n",
           res.mean, res.n_data, res.n_data == 1 ? "" : "es", res.batch, res.seq,
           c->model_path, data, c->n_ranks,
           fsdp_backend_name(c->backend));
    free(res.losses);
    return fflush(stdout) == 0 ? 0 : 1;
}
