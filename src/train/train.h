/*
 * train.h - the trainer: data -> engine step -> optimizer -> log, on N rank
 * threads. Used by `fsdp train` and by the tests.
 */
#ifndef FSDP_TRAIN_TRAIN_H
#define FSDP_TRAIN_TRAIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "engine/engine.h"
#include "train/stop.h"

struct fsdp_procs;
struct fsdp_metrics_sink;

typedef struct fsdp_train_config {
    fsdp_engine_config eng;   /* eng.n_ranks: the job's ranks, every process's */
    struct fsdp_procs *procs; /* the job's processes (comm/procs.h); NULL: one process */
    const char *model;        /* --model: a spec or a model file (fsdp_modelfile_resolve) */
    fsdp_lora_config lora;    /* --lora R, --lora-alpha, --lora-targets, --rslora: adapters on
                               * a frozen base (r = 0: none; models/lora.h) */
    const char *freeze;       /* --freeze PATTERN[,...]: parameters not trained, or NULL */
    int quantize;             /* --quantize: fsdp_quant (train/adapt.h): how frozen linear
                               * weights are stored */
    const char *adapter;      /* --adapter DIR: LoRA adapters (and their settings) from a PEFT
                               * adapter directory, or NULL */
    const char *data;         /* "synthetic", FILE.txt, FILE.jsonl or token shard glob */
    const char *tokenizer;    /* tokenizer.json for .txt/.jsonl data, or NULL (data/data.h) */
    const char *chat_format;  /* messages rows: a chat format name, or NULL (data/chat.h) */
    int steps;
    int epochs;               /* > 0: steps = ceil(epochs x the data's rows / global batch
                               * rows), `steps` ignored (train_data.c) */
    int pack;                 /* example data: fsdp_train_pack_names (AUTO: packed when the
                               * model's attention takes positions, else one per row) */
    bool pad_full;            /* unpacked example rows run at --seq, not at each step's
                               * longest example (tests: the path it shortens; train_data.c) */
    bool seq_auto;            /* eng.seq was not given and is min(context, FSDP_TRAIN_SEQ_CAP):
                               * example data lowers it to its longest example rounded up to
                               * FSDP_TRAIN_SEQ_ROUND (train_data.c) */
    float lr;                 /* peak learning rate */
    int warmup;               /* linear warmup steps */
    int warmup_pct;           /* > 0: warmup is this percentage of the steps (at least 1),
                               * set once the steps are known (--epochs: after the data) */
    float lr_min_frac;        /* the schedule ends at lr * lr_min_frac ... */
    float min_lr;             /* ... or, when >= 0, at min_lr (--min-lr) */
    int schedule;             /* fsdp_lr_schedule (train/schedule.h): the shape after warmup */
    float decay_frac;         /* wsd: the last fraction of the steps that decay */
    const char *lr_note;      /* the header's word on --lr ("fine-tuning default"), or NULL */
    /* held-out loss during training (train/heldout.h) */
    const char *eval_data;    /* a file of the same kind as data, or NULL: none */
    int eval_every;           /* evaluate after every N steps and after the last; 0: 10% of
                               * the steps (at least 1) */
    int eval_steps;           /* micro-batches per evaluation; 0: the whole file, at most 50 */
    bool keep_best;           /* ckpt_dir: checkpoint each new lowest eval loss and record it
                               * in ckpt_dir/BEST, which --ckpt-keep never removes */
    int early_stop;           /* stop after this many evaluations without a new lowest loss,
                               * with a checkpoint; 0: never */
    const char *log_path;     /* metrics JSONL, or NULL */
    const char *trace_path;   /* Chrome trace JSON, or NULL */
    const struct fsdp_metrics_sink *sink; /* another writer of --log's figures (TensorBoard:
                                           * train/outputs.h), or NULL; process 0 uses it */
    int eval_problems;        /* synthetic task: held-out problems to decode (0: none) */
    int n_samples;            /* greedy samples to print at the end */
    bool keep_params;         /* copy final parameters into the result (tests) */
    FILE *out;                /* progress lines (NULL: silent) */
    /* checkpoints (src/engine/engine_ckpt.h) */
    const char *ckpt_dir;     /* NULL: no checkpoints */
    int ckpt_every;           /* save every S steps and after the last; 0: after the last only */
    int ckpt_keep;            /* keep the K newest complete checkpoints; 0: all */
    bool resume;              /* start from the newest complete checkpoint in ckpt_dir, if any */
    bool allow_batch_change;  /* resume with another global batch (engine/engine_ckpt.h) */
    float watchdog_s;         /* the stall watchdog (core/flight.h): a wait in a collective
                               * or barrier longer than this ends the run with STALLED and
                               * one report, no checkpoint; 0: off; < 0: FSDP_WATCHDOG's
                               * (default 300). The flight record goes beside log_path
                               * (fsdp_output_flight_path, train/outputs.h) */
    bool allow_data_change;   /* resume on other --data or --tokenizer than the checkpoint's */
    bool fit_check;           /* before allocating, once the data has decided --seq and
                               * packing: refuse when the plan exceeds device_mem or
                               * fit_device_total (fsdp_fit_check_train, train/fit.h) */
    size_t fit_device_total;  /* the smallest GPU's memory on cuda (0: none known) */
    int stop_after;           /* tests: leave the loop after this global step as a crash
                               * would, without a final checkpoint (0: run to steps) */
    const atomic_int *stop;   /* set (nonzero) to stop early: the step in progress finishes,
                               * a checkpoint is written (with ckpt_dir), the metrics and the
                               * trace are flushed, and the run returns OK with
                               * res->interrupted. Read between steps (and between evaluation
                               * batches) by the first rank of each process of the job, so a
                               * request in any process stops every one after the same step;
                               * a signal handler may set it (to the signal: the stop code
                               * below). NULL: none. */
} fsdp_train_config;

typedef struct fsdp_train_result {
    int steps;
    int last_step;            /* the step the run trains to: cfg->steps, or --epochs' */
    int first_step;           /* 0, or the step resumed from (losses[first_step..steps)) */
    float *losses;            /* [steps] global mean loss per step */
    float *grad_norms;        /* [steps] */
    float accuracy;           /* held-out exact-match accuracy, -1 if not measured */
    fsdp_rank_stats *stats;   /* [n_ranks] after the last step */
    float **params;           /* [n_units] unpadded fp32 params if keep_params */
    int n_units;
    int n_ranks;
    double tokens_per_s;      /* mean over steps after the first */
    bool interrupted;         /* stopped early by cfg->stop (in any process of the job) */
    int stop_code;            /* then the smallest stop code any process asked with (0: none
                               * in 1..FSDP_TRAIN_STOP_CODE_MAX); the same in every process */
    int n_skipped;            /* steps whose update was dropped (eng.skip_nonfinite) */
    int ckpt_step;            /* the newest checkpoint this run wrote (its step), or -1 */
    float eval_loss;          /* the last held-out loss on eval_data (NaN: none measured) */
    float best_eval_loss;     /* the lowest one, after step best_eval_step (NaN, 0: none) */
    int best_eval_step;
    bool early_stopped;       /* ended by early_stop before cfg->steps */
} fsdp_train_result;

/* --pack: example rows packed several to a row of --seq, or one per row (padded). */
enum { FSDP_TRAIN_PACK_AUTO = 0, FSDP_TRAIN_PACK_ON, FSDP_TRAIN_PACK_OFF };
extern const fsdp_name_table fsdp_train_pack_names;

/* Pack the example rows of d into rows of T (fsdp_data_pack) as --pack `pack` says: AUTO
 * packs them when model m's attention takes positions (models/model.h's state_positions: a
 * family without them cannot keep packed examples apart), ON always, refusing such a model
 * (`model` names it) and data that is a token stream; *packed says whether it did. */
fsdp_status fsdp_train_pack_rows(const fsdp_model *m, const char *model, fsdp_data *d, int pack,
                                 int T, bool *packed);

/* The default --seq of a pre-trained model (a file or directory) on .jsonl data: at most
 * the cap, and for example rows their longest rounded up to a multiple of the round. */
#define FSDP_TRAIN_SEQ_CAP 2048
#define FSDP_TRAIN_SEQ_ROUND 64

/* The default --seq on data d below a sequence length of T (the model's context, at most
 * the cap): for example rows the longest example's input positions (its tokens less the
 * last, which is only a target) rounded up to a multiple of FSDP_TRAIN_SEQ_ROUND when that
 * is shorter than T; else T. */
int fsdp_train_seq_examples(const fsdp_data *d, int T);

/* Defaults for every field (the `fsdp train` defaults). */
void fsdp_train_config_default(fsdp_train_config *cfg);

/* Run training. On failure the result is partial and the message says
 * which rank failed and why. In a job of several processes every process
 * calls it with the same configuration (and its own procs); the result's
 * losses, figures, parameters and accuracy are process 0's (rank 0's).
 *
 * Outputs are checked before step 1: ckpt_dir is created and must take a
 * file, trace_path and log_path must be writable. Between steps the ranks
 * agree whether to stop (fsdp_engine_or, every process of the job): on
 * cfg->stop, when a write of the metrics file failed, when a data file
 * changed or could not be read. Stopping writes a final checkpoint of the
 * last complete step (with ckpt_dir) before returning the error (or OK
 * with res->interrupted for cfg->stop). A step whose loss or gradient norm
 * is not finite stops the run with NONFINITE naming the step, after a
 * checkpoint of the state before it, or with eng.skip_nonfinite is dropped
 * (its update not applied) and counted in res->n_skipped; a checkpoint of
 * non-finite parameters is never written. A resume from a checkpoint at or
 * past cfg->steps runs nothing (res->first_step == res->steps == its step). */
fsdp_status fsdp_train_run(const fsdp_train_config *cfg, fsdp_train_result *res);
void fsdp_train_result_free(fsdp_train_result *res);

/* Learning rate at `step` (0-based): linear warmup over `warmup` steps to
 * lr, then cfg->schedule's shape down to the floor (min_lr, or
 * lr * lr_min_frac) at the last step (train/schedule.h). */
float fsdp_train_lr(const fsdp_train_config *cfg, int step);

#endif /* FSDP_TRAIN_TRAIN_H */
