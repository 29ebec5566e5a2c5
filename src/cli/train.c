/*
 * train.c - `fsdp train`.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_opts.h"
#include "comm/procs.h"
#include "train/fit.h"

int fsdp_cli_train(int argc, char **argv)
{
    fsdp_run_opts ro;
    fsdp_opt_list l = {0};
    fsdp_run_opts_table(&ro, &l);
    fsdp_train_config *c = &ro.cfg;
    fsdp_engine_config *e = &c->eng;
    bool quiet = false;
    fsdp_opt_add(&l, "data", FSDP_OPT_STR, &c->data, "synthetic|FILE.txt|FILE.jsonl|'GLOB.bin'",
                 "training data: the built-in addition task, a text file (bytes, or tokens with "
                 "--tokenizer), .jsonl rows ({\"text\"}; {\"prompt\",\"completion\"} or "
                 "{\"messages\"} once models support loss masks) or llm.c token shards (default "
                 "synthetic)");
    fsdp_opt_add(&l, "tokenizer", FSDP_OPT_STR, &c->tokenizer, "tokenizer.json",
                 "Hugging Face tokenizer for .txt and .jsonl data (GPT-2, Llama 3, Qwen2 families)");
    fsdp_opt_add(&l, "chat-format", FSDP_OPT_STR, &c->chat_format, "llama3|chatml",
                 "how {\"messages\"} rows are rendered (default: from the tokenizer's special "
                 "tokens)");
    fsdp_opt_add_int(&l, "steps", &c->steps, 1, INT_MAX, "S", "optimizer steps (default 600)");
    fsdp_opt_add(&l, "lr", FSDP_OPT_FLOAT, &c->lr, "X", "peak learning rate (default 3e-3)");
    fsdp_opt_add_int(&l, "warmup", &c->warmup, 0, INT_MAX, "S",
                     "linear warmup steps, then cosine decay to 10% (default 20)");
    fsdp_opt_add(&l, "wd", FSDP_OPT_FLOAT, &e->weight_decay, "X",
                 "AdamW weight decay, applied to wte and the linear weights only (default 0.1)");
    fsdp_opt_add(&l, "clip", FSDP_OPT_FLOAT, &e->clip, "X",
                 "clip the global gradient norm to X; 0 = off (default 1.0)");
    fsdp_opt_add(&l, "deterministic", FSDP_OPT_FLAG, &e->deterministic, NULL,
                 "bit-identical losses and parameters for any device count and strategy");
    fsdp_opt_add_int(&l, "eval", &c->eval_problems, 0, INT_MAX, "N",
                     "synthetic task: held-out problems decoded greedily at the end (default "
                     "512; 0 = none)");
    fsdp_opt_add(&l, "log", FSDP_OPT_STR, &c->log_path, "FILE.jsonl",
                 "write per-step metrics as JSON Lines");
    fsdp_opt_add(&l, "trace", FSDP_OPT_STR, &c->trace_path, "FILE.json",
                 "write a Chrome trace (Perfetto, chrome://tracing): one track per rank and "
                 "stream");
    fsdp_opt_add(&l, "ckpt-dir", FSDP_OPT_STR, &c->ckpt_dir, "DIR",
                 "write sharded checkpoints to DIR/step_NNNNNNNN (after the last step, and "
                 "every --ckpt-every steps)");
    fsdp_opt_add_int(&l, "ckpt-every", &c->ckpt_every, 0, INT_MAX, "S",
                     "checkpoint every S steps (default 0: after the last step only)");
    fsdp_opt_add_int(&l, "ckpt-keep", &c->ckpt_keep, 0, INT_MAX, "K",
                     "keep the K newest checkpoints, removing older ones once a newer one is "
                     "complete (default 0: keep all)");
    fsdp_opt_add(&l, "resume", FSDP_OPT_FLAG, &c->resume, NULL,
                 "continue from the newest complete checkpoint in --ckpt-dir (any --devices "
                 "and --shard; same --model, --seq, --seed and batch x devices x grad-accum)");
    fsdp_opt_add(&l, "quiet", FSDP_OPT_FLAG, &quiet, NULL,
                 "print only errors and the final summary");
    int rc = fsdp_args_parse("train", "[options]", l.v, l.n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    /* a job of several processes (cli/main.c): --devices per process */
    c->procs = fsdp_cli_procs();
    ro.n_processes = c->procs ? c->procs->n_processes : 1;
    if ((rc = fsdp_run_opts_finish("train", &ro)))
        return rc;
    if (!c->ckpt_dir && (c->ckpt_every || c->ckpt_keep || c->resume))
        return fsdp_cli_usage("train", "--ckpt-every, --ckpt-keep and --resume need --ckpt-dir DIR");
    if (!(c->lr > 0) || !(e->clip >= 0) || !(e->weight_decay >= 0))
        return fsdp_cli_usage("train", "need --lr > 0, --clip >= 0 and --wd >= 0");
    if (quiet)
        c->out = NULL;
    /* refuse before allocating anything when the plan says the run exceeds
     * --device-mem (a GPU's own size is not known here yet: 0) */
    fsdp_status st = fsdp_fit_check_train(c, 0);
    if (st != FSDP_STATUS_OK)
        return fsdp_cli_status("train", st);
    fsdp_train_result res;
    st = fsdp_train_run(c, &res);
    if (st != FSDP_STATUS_OK) {
        fsdp_train_result_free(&res);
        return fsdp_cli_status("train", st);
    }
    if (quiet && res.steps > 0 && (!c->procs || c->procs->process == 0)) {
        printf("final loss %.6f after %d steps", res.losses[res.steps - 1], res.steps);
        if (res.accuracy >= 0)
            printf(", held-out accuracy %.1f%%", 100.0 * res.accuracy);
        printf("\n");
    }
    fsdp_train_result_free(&res);
    return fsdp_cli_flush("train");
}
