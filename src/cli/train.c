/*
 * train.c - `fsdp train`.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_opts.h"

int fsdp_cli_train(int argc, char **argv)
{
    fsdp_run_opts ro;
    fsdp_opt opts[FSDP_RUN_OPTS_MAX];
    int n = fsdp_run_opts_table(&ro, opts);
    fsdp_train_config *c = &ro.cfg;
    fsdp_engine_config *e = &c->eng;
    bool quiet = false;
#define OPT(name_, type_, dst_, meta_, help_) \
    opts[n++] = (fsdp_opt){.name = name_, .type = type_, .dst = dst_, .metavar = meta_, .help = help_}
    OPT("data", FSDP_OPT_STR, &c->data, "synthetic|FILE.txt|FILE.jsonl|'GLOB.bin'",
        "training data: the built-in addition task, a text file (bytes, or tokens with "
        "--tokenizer), .jsonl rows ({\"text\"}; {\"prompt\",\"completion\"} or {\"messages\"} "
        "once models support loss masks) or llm.c token shards (default synthetic)");
    OPT("tokenizer", FSDP_OPT_STR, &c->tokenizer, "tokenizer.json",
        "Hugging Face tokenizer for .txt and .jsonl data (GPT-2, Llama 3, Qwen2 families)");
    OPT("chat-format", FSDP_OPT_STR, &c->chat_format, "llama3|chatml",
        "how {\"messages\"} rows are rendered (default: from the tokenizer's special tokens)");
    OPT("steps", FSDP_OPT_INT, &c->steps, "S", "optimizer steps (default 600)");
    OPT("lr", FSDP_OPT_FLOAT, &c->lr, "X", "peak learning rate (default 3e-3)");
    OPT("warmup", FSDP_OPT_INT, &c->warmup, "S", "linear warmup steps, then cosine decay to 10% (default 20)");
    OPT("wd", FSDP_OPT_FLOAT, &e->weight_decay, "X",
        "AdamW weight decay, applied to wte and the linear weights only (default 0.1)");
    OPT("clip", FSDP_OPT_FLOAT, &e->clip, "X", "clip the global gradient norm to X; 0 = off (default 1.0)");
    OPT("deterministic", FSDP_OPT_FLAG, &e->deterministic, "",
        "bit-identical losses and parameters for any device count and strategy");
    OPT("eval", FSDP_OPT_INT, &c->eval_problems, "N",
        "synthetic task: held-out problems decoded greedily at the end (default 512; 0 = none)");
    OPT("log", FSDP_OPT_STR, &c->log_path, "FILE.jsonl", "write per-step metrics as JSON Lines");
    OPT("trace", FSDP_OPT_STR, &c->trace_path, "FILE.json",
        "write a Chrome trace (Perfetto, chrome://tracing): one track per rank and stream");
    OPT("ckpt-dir", FSDP_OPT_STR, &c->ckpt_dir, "DIR",
        "write sharded checkpoints to DIR/step_NNNNNNNN (after the last step, and every "
        "--ckpt-every steps)");
    OPT("ckpt-every", FSDP_OPT_INT, &c->ckpt_every, "S", "checkpoint every S steps (default 0: "
        "after the last step only)");
    OPT("ckpt-keep", FSDP_OPT_INT, &c->ckpt_keep, "K",
        "keep the K newest checkpoints, removing older ones once a newer one is complete "
        "(default 0: keep all)");
    OPT("resume", FSDP_OPT_FLAG, &c->resume, "",
        "continue from the newest complete checkpoint in --ckpt-dir (any --devices and --shard; "
        "same --model, --seq, --seed and batch x devices x grad-accum)");
    OPT("quiet", FSDP_OPT_FLAG, &quiet, "", "print only errors and the final summary");
#undef OPT
    int rc = fsdp_args_parse("train", "[options]", opts, n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if ((rc = fsdp_run_opts_finish("train", &ro)))
        return rc;
    if (!c->ckpt_dir && (c->ckpt_every || c->ckpt_keep || c->resume)) {
        fprintf(stderr, "fsdp train: --ckpt-every, --ckpt-keep and --resume need --ckpt-dir DIR\n");
        return 2;
    }
    if (c->ckpt_every < 0 || c->ckpt_keep < 0) {
        fprintf(stderr, "fsdp train: --ckpt-every and --ckpt-keep must be >= 0\n");
        return 2;
    }
    if (c->steps < 1 || c->warmup < 0 || !(c->lr > 0) || !(e->clip >= 0) ||
        !(e->weight_decay >= 0) || c->eval_problems < 0) {
        fprintf(stderr, "fsdp train: need --steps >= 1, --warmup >= 0, --lr > 0, --clip >= 0, "
                        "--wd >= 0, --eval >= 0\n");
        return 2;
    }
    if (quiet)
        c->out = NULL;
    fsdp_train_result res;
    fsdp_status st = fsdp_train_run(c, &res);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp train: error: %s\n", fsdp_error_msg());
        fsdp_train_result_free(&res);
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    if (quiet && res.steps > 0) {
        printf("final loss %.6f after %d steps", res.losses[res.steps - 1], res.steps);
        if (res.accuracy >= 0)
            printf(", held-out accuracy %.1f%%", 100.0 * res.accuracy);
        printf("\n");
    }
    fsdp_train_result_free(&res);
    return 0;
}
