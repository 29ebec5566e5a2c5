/*
 * train.c - `fsdp train`, and how it stops on SIGINT and SIGTERM.
 *
 * The first signal asks the trainer to stop (fsdp_train_config.stop): the
 * step in progress finishes, a checkpoint is written with --ckpt-dir, the
 * metrics and the trace are flushed, and the command exits 128 + the
 * signal (130 for SIGINT, 143 for SIGTERM). In a job of several processes
 * the signal may reach any one of them: the trainer's stop decision is the
 * job's, so every process stops after the same step and exits with that
 * code (cli/main.c ends such a job in order, not as a failure). A second
 * signal exits at once with the same code, losing what was not written
 * yet.
 */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/run_opts.h"
#include "comm/procs.h"
#include "core/flight.h"
#include "data/chat.h"
#include "models/registry.h"
#include "report/tensorboard.h"
#include "train/schedule.h"

/* ---- stopping on a signal --------------------------------------------------- */

static atomic_int g_stop_signal; /* the first signal received, or 0 */

/* Async-signal-safe: a lock-free atomic, write(2) and _exit(2) only. */
static void on_stop_signal(int sig)
{
    int none = 0;
    if (!atomic_compare_exchange_strong(&g_stop_signal, &none, sig))
        _exit(128 + sig); /* the second signal */
    static const char msg[] = "\nfsdp train: stopping after the current step (checkpoint, "
                              "metrics and trace are written); signal again to exit at once\n";
    ssize_t rc = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)rc;
}

static const int stop_signals[] = {SIGINT, SIGTERM};

static void stop_handlers_install(struct sigaction *old)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART; /* reads and writes in flight carry on */
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        sigaction(stop_signals[i], &sa, &old[i]);
}

static void stop_handlers_restore(const struct sigaction *old)
{
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++)
        sigaction(stop_signals[i], &old[i], NULL);
}

/* ---- the command ---------------------------------------------------------- */

static const fsdp_name nonfinite_names[] = {
    {"stop", 0,
     "stop the run with an error naming the step, after a checkpoint of the state before it"},
    {"skip", 1,
     "drop that step's update and go on (the step still counts; the metrics mark it "
     "\"skipped\")"},
};
static const fsdp_name_table fsdp_nonfinite_names = FSDP_NAME_TABLE(nonfinite_names);

enum {
    MAX_STEPS = 100000000,   /* the result keeps a loss per step */
    MAX_EVAL = 1 << 24,      /* held-out problems */
};

/* The user-facing summary of a run that did not run to its last step
 * (rank 0's process: the result's steps are its). */
static void report_early_end(const fsdp_train_config *c, const fsdp_train_result *res)
{
    if (!res->interrupted)
        return;
    /* one write: stderr is unbuffered, and under mpirun the other
     * processes' lines would land between the pieces */
    char line[4352]; /* a path of up to 4096 bytes and the words */
    int n = snprintf(line, sizeof line, "fsdp train: stopped by %s after step %d of %d",
                     res->stop_code == SIGTERM ? "SIGTERM" : "SIGINT", res->steps, res->last_step);
    size_t at = n > 0 && (size_t)n < sizeof line ? (size_t)n : 0;
    if (res->ckpt_step >= 0)
        snprintf(line + at, sizeof line - at, "; checkpoint step %d is in %s: continue with "
                 "--resume\n", res->ckpt_step, c->ckpt_dir);
    else if (c->ckpt_dir)
        snprintf(line + at, sizeof line - at, "; %s already holds the state of step %d: "
                 "continue with --resume\n", c->ckpt_dir, res->steps);
    else
        snprintf(line + at, sizeof line - at, " (no --ckpt-dir: nothing was saved)\n");
    fputs(line, stderr);
}

/* --grad-accum from --global-batch (which must be a multiple of --batch x
 * devices). A pre-trained --model (a file or directory, not a built-in
 * name or spec) gets fine-tuning defaults for what was not given: --lr
 * 2e-5 (2e-4 with LoRA adapters, --lora or --adapter) and a warmup of 3% of
 * the steps (at least 1). Then the schedule's
 * and the held-out set's settings are checked. Nonzero after a usage
 * error. */
static int finetune_finish(fsdp_opt_list *l, fsdp_train_config *c, int global_batch)
{
    fsdp_engine_config *e = &c->eng;
    int64_t per_step = (int64_t)e->batch * e->n_ranks;
    if (global_batch && fsdp_opt_get(l, "grad-accum")->seen)
        return fsdp_cli_usage("train", "--global-batch %d and --grad-accum %d: give one of them "
                              "(--global-batch G sets --grad-accum to G / (--batch x devices))",
                              global_batch, e->grad_accum);
    if (global_batch && (global_batch % per_step || global_batch / per_step > 1 << 16))
        return fsdp_cli_usage("train", "--global-batch %d is not a multiple of --batch %d x %d "
                              "device(s) = %lld sequences per micro-step (with at most 65536 of "
                              "them); pick a global batch that is, or another --batch",
                              global_batch, e->batch, e->n_ranks, (long long)per_step);
    if (global_batch)
        e->grad_accum = (int)(global_batch / per_step);
    if (c->model && !fsdp_model_is_spec(c->model)) {
        if (!fsdp_opt_get(l, "lr")->seen) { /* adapters learn from zero: 10x a full tune's */
            bool lora = c->lora.r > 0 || c->adapter;
            c->lr = lora ? 2e-4f : 2e-5f;
            c->lr_note = lora ? "fine-tuning default with LoRA" : "fine-tuning default";
        }
        if (!fsdp_opt_get(l, "warmup")->seen) /* the steps are known later with --epochs */
            c->warmup_pct = 3;
    }
    if (c->min_lr > c->lr)
        return fsdp_cli_usage("train", "--min-lr %g is above --lr %g: the floor must be at most "
                              "the peak", (double)c->min_lr, (double)c->lr);
    if (fsdp_opt_get(l, "decay-frac")->seen && c->schedule != FSDP_LR_WSD)
        return fsdp_cli_usage("train", "--decay-frac applies to --schedule wsd only");
    if (!c->eval_data && (c->eval_every || c->eval_steps || c->keep_best || c->early_stop))
        return fsdp_cli_usage("train", "--eval-every, --eval-steps, --keep-best and --early-stop "
                              "need --eval-data FILE");
    if (c->keep_best && !c->ckpt_dir)
        return fsdp_cli_usage("train", "--keep-best needs --ckpt-dir DIR (where the best "
                              "checkpoint is kept)");
    return 0;
}

/* train's own options (fsdp_run_opts_table has those train shares with plan and eval). */
static void train_opts_add(fsdp_opt_list *l, fsdp_run_opts *ro, bool *quietp, int *on_nonfinitep,
                           const char **tensorboardp, int *global_batchp)
{
    fsdp_train_config *c = &ro->cfg;
    fsdp_engine_config *e = &c->eng;
    fsdp_opt_add(l, "adapter", FSDP_OPT_STR, &c->adapter, "DIR",
                 "start LoRA adapters from a PEFT adapter directory (adapter_config.json + "
                 "adapter_model.safetensors; its r, lora_alpha, target_modules and use_rslora "
                 "set the LoRA settings) on the frozen --model");
    fsdp_opt_add(
        l, "tokenizer", FSDP_OPT_STR, &c->tokenizer, "tokenizer.json",
        "Hugging Face tokenizer for .txt and .jsonl data (GPT-2, Llama 3, Qwen2 families)");
    static char chat_formats[96]; /* "template|llama3|chatml", from data/chat.c */
    fsdp_opt_add(l, "chat-format", FSDP_OPT_STR, &c->chat_format,
                 fsdp_chat_format_names(chat_formats, sizeof chat_formats, "|"),
                 "how {\"messages\"} rows are rendered (default: the chat_template beside the "
                 "tokenizer, else the built-in format its special tokens fit)");
    c->steps = 0; /* unset: 600, unless --epochs */
    fsdp_opt_add_int(l, "steps", &c->steps, 1, MAX_STEPS, "S", "optimizer steps (default 600)");
    fsdp_opt_add_int(l, "epochs", &c->epochs, 1, MAX_STEPS, "N",
                     "instead of --steps: the steps that cover N passes over the data's rows "
                     "(rounded up; the header says how many)");
    fsdp_opt_add_int(l, "global-batch", global_batchp, 1, INT_MAX, "G",
                     "sequences per optimizer step across the job: sets --grad-accum to G / "
                     "(--batch x devices), which must divide it");
    fsdp_opt_add_float(l, "lr", &c->lr, 0.0, true, 10.0, "X",
                       "peak learning rate, in (0, 10] (default 3e-3 for built-in models, 2e-5 "
                       "for a pre-trained --model, 2e-4 for LoRA adapters on one)");
    fsdp_opt_add_int(l, "warmup", &c->warmup, 0, INT_MAX, "S",
                     "linear warmup steps (default 20 for built-in models, 3% of --steps, at "
                     "least 1, for a pre-trained --model)");
    fsdp_opt_add_name(l, "schedule", &c->schedule, &fsdp_lr_schedule_names,
                      "the learning rate after warmup");
    fsdp_opt_add_float(l, "min-lr", &c->min_lr, 0.0, false, 10.0, "X",
                       "the schedule's floor, at most --lr (default 10% of --lr)");
    fsdp_opt_add_float(l, "decay-frac", &c->decay_frac, 0.0, true, 1.0, "F",
                       "--schedule wsd: the fraction of the steps that decay, in (0, 1] "
                       "(default 0.1)");
    fsdp_opt_add_float(l, "wd", &e->optim_hp.weight_decay, 0.0, false, 10.0, "X",
                       "weight decay, applied to wte and the linear weights only, with "
                       "--lr x --wd <= 1 (default 0.1)");
    fsdp_opt_add_float(l, "clip", &e->clip, 0.0, false, 1e6, "X",
                       "clip the global gradient norm to X; 0 = off (default 1.0)");
    fsdp_opt_add_name(l, "on-nonfinite", on_nonfinitep, &fsdp_nonfinite_names,
                      "what a step whose loss or gradient norm is NaN or infinite does");
    fsdp_opt_add(l, "deterministic", FSDP_OPT_FLAG, &e->deterministic, NULL,
                 "bit-identical losses and parameters for any device count and strategy");
    fsdp_opt_add_int(l, "eval", &c->eval_problems, 0, MAX_EVAL, "N",
                     "synthetic task: held-out problems decoded greedily at the end (default "
                     "512; 0 = none)");
    fsdp_opt_add(l, "eval-data", FSDP_OPT_STR, &c->eval_data, "FILE",
                 "held-out data of the same kind as --data: its loss (and perplexity) is "
                 "measured during training, printed and logged as eval_loss");
    fsdp_opt_add_int(l, "eval-every", &c->eval_every, 1, INT_MAX, "N",
                     "evaluate --eval-data after every N steps and after the last (default 10% "
                     "of --steps, at least 1)");
    fsdp_opt_add_int(l, "eval-steps", &c->eval_steps, 1, INT_MAX, "K",
                     "micro-batches per evaluation (default: the whole file, at most 50)");
    fsdp_opt_add(l, "keep-best", FSDP_OPT_FLAG, &c->keep_best, NULL,
                 "checkpoint each new lowest eval loss and name it in --ckpt-dir/BEST, which "
                 "--ckpt-keep never removes");
    fsdp_opt_add_int(l, "early-stop", &c->early_stop, 1, INT_MAX, "P",
                     "stop (with a checkpoint, exit 0) after P evaluations without a lower "
                     "eval loss");
    fsdp_opt_add(l, "log", FSDP_OPT_STR, &c->log_path, "FILE.jsonl",
                 "write per-step metrics as JSON Lines (a failed write stops the run)");
    fsdp_opt_add(l, "tensorboard", FSDP_OPT_STR, tensorboardp, "DIR",
                 "write the same metrics as TensorBoard event files into DIR (created; a "
                 "resumed run adds a file, which TensorBoard merges): tensorboard --logdir DIR");
    fsdp_opt_add(l, "trace", FSDP_OPT_STR, &c->trace_path, "FILE.json",
                 "write a Chrome trace (Perfetto, chrome://tracing): one track per rank and "
                 "stream");
    fsdp_opt_add(l, "ckpt-dir", FSDP_OPT_STR, &c->ckpt_dir, "DIR",
                 "write sharded checkpoints to DIR/step_NNNNNNNN (after the last step, every "
                 "--ckpt-every steps, and when the run stops early)");
    fsdp_opt_add_int(l, "ckpt-every", &c->ckpt_every, 0, INT_MAX, "S",
                     "checkpoint every S steps (default 0: after the last step only)");
    fsdp_opt_add_int(l, "ckpt-keep", &c->ckpt_keep, 0, INT_MAX, "K",
                     "keep the K newest checkpoints, removing older ones once a newer one is "
                     "complete (default 0: keep all)");
    fsdp_opt_add(l, "resume", FSDP_OPT_FLAG, &c->resume, NULL,
                 "continue from the newest complete checkpoint in --ckpt-dir (any --devices "
                 "and --shard; same --model, --seq, --seed and batch x devices x grad-accum)");
    fsdp_opt_add(l, "allow-batch-change", FSDP_OPT_FLAG, &c->allow_batch_change, NULL,
                 "with --resume: accept another global batch (batch x devices x grad-accum); "
                 "the data continues at step x the new batch, and the run is no longer "
                 "bit-identical to an uninterrupted one");
    fsdp_opt_add_float(l, "watchdog", &c->watchdog_s, 0.0, false, FSDP_WATCHDOG_MAX_S, "S",
                       "stall watchdog: a wait in a collective or barrier longer than S "
                       "seconds stops the run (no checkpoint) with one report of the step, the "
                       "collective and the ranks that have not arrived, and a flight record "
                       "beside --log (else fsdp_flight.json); 0 = off (default FSDP_WATCHDOG, "
                       "else 300)");
    fsdp_opt_add(l, "allow-data-change", FSDP_OPT_FLAG, &c->allow_data_change, NULL,
                 "with --resume: accept other --data or --tokenizer than the checkpoint was "
                 "trained on; the run continues at the checkpoint's data position in the new "
                 "data");
    fsdp_opt_add(l, "quiet", FSDP_OPT_FLAG, quietp, NULL,
                 "print only errors and the final summary");
}

/* What train refuses among its options, after they are parsed: 0 or the exit code. */
static int train_args_check(const fsdp_train_config *c)
{
    const fsdp_path_arg ins[] = {{"--model", c->model, FSDP_PATH_TREE},
                                 {"--data", c->data, FSDP_PATH_GLOB},
                                 {"--tokenizer", c->tokenizer, FSDP_PATH_FILE},
                                 {"--eval-data", c->eval_data, FSDP_PATH_GLOB}};
    const fsdp_path_arg outs[] = {{"--log", c->log_path, FSDP_PATH_FILE},
                                  {"--trace", c->trace_path, FSDP_PATH_FILE}};
    int rc = fsdp_cli_check_paths("train", ins, 4, outs, 2);
    if (rc)
        return rc;
    if (c->chat_format && fsdp_chat_check_name(c->chat_format) != FSDP_STATUS_OK)
        return fsdp_cli_status("train", FSDP_STATUS_INVALID_ARG);
    if (!c->ckpt_dir && (c->ckpt_every || c->ckpt_keep || c->resume))
        return fsdp_cli_usage("train",
                              "--ckpt-every, --ckpt-keep and --resume need --ckpt-dir DIR");
    if (c->allow_batch_change && !c->resume)
        return fsdp_cli_usage("train", "--allow-batch-change only applies with --resume");
    if (c->allow_data_change && !c->resume)
        return fsdp_cli_usage("train", "--allow-data-change only applies with --resume");
    float wd = c->eng.optim_hp.weight_decay;
    if (c->lr * wd > 1.0f) /* in float, as the optimizer takes 1 - lr x wd: 10 x 0.1 is 1 */
        return fsdp_cli_usage("train", "--lr %g x --wd %g = %g: each step would multiply the "
                              "weights by 1 - lr x wd < 0; keep lr x wd <= 1", (double)c->lr,
                              (double)wd, (double)c->lr * wd);
    return 0;
}

/* --quiet: the one line that says how the run ended. */
static void print_quiet_summary(const fsdp_train_config *c, const fsdp_train_result *r)
{
    if (r->first_step >= r->last_step) {
        printf("nothing left to do: checkpoint step %d in %s already reached --steps %d\n",
               r->first_step, c->ckpt_dir, r->last_step);
    } else if (r->steps > r->first_step) {
        printf("final loss %.6g after %d steps", r->losses[r->steps - 1], r->steps);
        if (r->n_skipped)
            printf(" (%d skipped)", r->n_skipped);
        if (r->accuracy >= 0)
            printf(", held-out accuracy %.1f%%", 100.0 * r->accuracy);
        if (!isnan(r->eval_loss))
            printf(", eval loss %.6g (lowest %.6g after step %d)", r->eval_loss,
                   r->best_eval_loss, r->best_eval_step);
        if (r->early_stopped)
            printf("; stopped early: no lower eval loss in the last %d evaluations", c->early_stop);
        printf("\n");
    }
}

int fsdp_cli_train(int argc, char **argv)
{
    fsdp_run_opts ro;
    fsdp_opt_list l = {0};
    fsdp_run_opts_table(&ro, &l);
    fsdp_train_config *c = &ro.cfg;
    fsdp_engine_config *e = &c->eng;
    bool quiet = false;
    int on_nonfinite = 0;
    const char *tensorboard = NULL;
    int global_batch = 0;
    train_opts_add(&l, &ro, &quiet, &on_nonfinite, &tensorboard, &global_batch);
    int rc = fsdp_args_parse("train",
                             "[options]\n\n"
                             "SIGINT or SIGTERM stop after the current step, with a checkpoint "
                             "(--ckpt-dir), the metrics\nand the trace written, and exit 130 or "
                             "143; a second signal exits at once.\n"
                             "FSDP_FAULT=RANK:alloc|collective|write|stall:K (testing only) fails "
                             "(stall: holds back)\nthe K-th such operation of rank RANK.",
                             l.v, l.n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    /* a job of several processes (cli/main.c): --devices per process */
    c->procs = fsdp_cli_procs();
    ro.n_processes = c->procs ? c->procs->n_processes : 1;
    if ((rc = fsdp_run_opts_finish("train", &ro)))
        return rc;
    if (c->epochs && c->steps)
        return fsdp_cli_usage("train", "--steps and --epochs both say how long to train: give "
                              "one of them");
    if (!c->steps && !c->epochs)
        c->steps = 600;
    if ((rc = finetune_finish(&l, c, global_batch)))
        return rc;
    if ((rc = train_args_check(c)))
        return rc;
    e->skip_nonfinite = on_nonfinite == 1;
    if (quiet)
        c->out = NULL;
    /* the run refuses before allocating anything when the plan says it
     * exceeds --device-mem or, on cuda, the smallest GPU's memory (0 elsewhere) */
    int rpd = e->ranks_per_device > 0 ? e->ranks_per_device : 1;
    fsdp_status st = fsdp_backend_device_total(e->backend, (e->n_ranks + rpd - 1) / rpd,
                                               &c->fit_device_total);
    if (st != FSDP_STATUS_OK)
        return fsdp_cli_status("train", st);
    c->fit_check = true;
    fsdp_tboard_sink tb;
    if (tensorboard) {
        fsdp_tboard_sink_init(&tb, tensorboard);
        c->sink = &tb.sink;
    }
    struct sigaction old[2];
    atomic_store(&g_stop_signal, 0);
    c->stop = &g_stop_signal;
    stop_handlers_install(old);
    fsdp_train_result res;
    st = fsdp_train_run(c, &res);
    stop_handlers_restore(old);
    int sig = atomic_load(&g_stop_signal);
    if (st != FSDP_STATUS_OK) { /* a failure outranks a signal: its exit code and message */
        fsdp_train_result_free(&res);
        return fsdp_cli_status("train", st);
    }
    bool speaks = !c->procs || c->procs->process == 0; /* rank 0's process */
    if (quiet && speaks)
        print_quiet_summary(c, &res);
    if (speaks)
        report_early_end(c, &res);
    /* the job's decision: every process exits with the signal that stopped it, whichever
     * process received it; a signal after the job's last decision is this process's own */
    int code = res.interrupted ? (res.stop_code ? res.stop_code : sig ? sig : SIGINT) : sig;
    fsdp_train_result_free(&res);
    rc = fsdp_cli_flush("train");
    return code ? 128 + code : rc;
}
