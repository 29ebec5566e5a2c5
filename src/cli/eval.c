/*
 * eval.c - `fsdp eval`: the mean next-token loss of a model file on a data
 * set, over the first S micro-batches the trainer would read (same
 * numbering, so it matches a training run's loss on the same batches).
 * Text and jsonl data are tokenized with --tokenizer, else with the
 * tokenizer.json of a Hugging Face model directory or the one a checkpoint
 * carries (ckpt/ckpt_tok.h); {"messages"} rows are rendered in --chat-format,
 * else as a checkpoint's run rendered them (its manifest says), else in
 * the tokenizer's own format, and stderr says which rendering was used.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckpt/ckpt_tok.h"
#include "cli/cli.h"
#include "cli/infer_opts.h"
#include "data/chat.h"
#include "ckpt/modelfile.h"

int fsdp_cli_eval(int argc, char **argv)
{
    fsdp_infer_opts io;
    fsdp_opt_list l = {.n = 0};
    fsdp_infer_opts_table(&io, &l);
    fsdp_infer_config *c = &io.cfg;
    const char *data = NULL;
    int steps = 10;
    uint64_t seed = 1337;
    bool per_batch = false;
    c->seq = 0;
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
    fsdp_opt_add(&l, "batch", FSDP_OPT_INT, &c->batch, "B",
                 "sequences per micro-batch (default 8)");
    fsdp_opt_add(&l, "seq", FSDP_OPT_INT, &c->seq, "T",
                 "sequence length (default 64, or the model's context)");
    fsdp_opt_add(&l, "steps", FSDP_OPT_INT, &steps, "S",
                 "micro-batches to average over: 0 .. S-1, numbered as the trainer numbers them "
                 "(default 10)");
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
    char found[4096];
    bool has_own = false; /* a Hugging Face directory's or a checkpoint's */
    if (!c->tokenizer &&
        fsdp_ckpt_tok_for_model(c->model_path, found, sizeof found, &has_own) !=
            FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp eval: error: %s\n", fsdp_error_msg());
        return 1;
    }
    if (has_own)
        c->tokenizer = found;
    char chat[FSDP_CKPT_CHAT_FORMAT_MAX]; /* a checkpoint's run's --chat-format */
    if (!c->chat_format && fsdp_ckpt_chat_find(c->model_path, chat, sizeof chat) !=
                               FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp eval: error: %s\n", fsdp_error_msg());
        return 1;
    }
    if (!c->chat_format && chat[0])
        c->chat_format = chat;
    if (steps < 1 || c->batch < 1 || c->seq < 0) {
        fprintf(stderr, "fsdp eval: need --steps >= 1, --batch >= 1 and --seq >= 1\n");
        return 2;
    }
    if (c->seq == 0) { /* 64, or the model's context if shorter */
        fsdp_model m;
        fsdp_status st = fsdp_modelfile_resolve(c->model_path, &m, NULL);
        if (st != FSDP_STATUS_OK) {
            fprintf(stderr, "fsdp eval: error: %s\n", fsdp_error_msg());
            return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
        }
        c->seq = m.max_seq_len < 64 ? m.max_seq_len : 64;
        fsdp_model_free(&m);
    }
    float *losses = malloc((size_t)steps * sizeof *losses);
    if (!losses) {
        fprintf(stderr, "fsdp eval: out of memory\n");
        return 1;
    }
    float mean = 0.0f;
    c->note = stderr;
    fsdp_status st = fsdp_infer_eval(c, data, seed, steps, &mean, losses);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp eval: error: %s\n", fsdp_error_msg());
        free(losses);
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    for (int m = 0; per_batch && m < steps; m++) {
        if (isnan(losses[m]))
            printf("batch %d: no target (every row is cut at --seq before its completion)\n", m);
        else
            printf("batch %d loss %.6g\n", m, losses[m]);
    }
    printf("mean loss %.6g over %d batches of %d x %d tokens (model %s, data %s, %d %s "
           "device(s))\n",
           mean, steps, c->batch, c->seq, c->model_path, data, c->n_ranks,
           fsdp_backend_name(c->backend));
    free(losses);
    return fflush(stdout) == 0 ? 0 : 1;
}
