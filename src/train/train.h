/*
 * train.h - the trainer: data -> engine step -> optimizer -> log, on N rank
 * threads. Used by `fsdp train` and by the tests.
 */
#ifndef FSDP_TRAIN_TRAIN_H
#define FSDP_TRAIN_TRAIN_H

#include <stdbool.h>
#include <stdio.h>

#include "fsdp/engine.h"

struct fsdp_procs;

typedef struct fsdp_train_config {
    fsdp_engine_config eng;   /* eng.n_ranks: the job's ranks, every process's */
    struct fsdp_procs *procs; /* the job's processes (comm/procs.h); NULL: one process */
    const char *model;        /* --model: a spec or a model file (fsdp_modelfile_resolve) */
    const char *data;         /* "synthetic", FILE.txt, FILE.jsonl or token shard glob */
    const char *tokenizer;    /* tokenizer.json for .txt/.jsonl data, or NULL (data/data.h) */
    const char *chat_format;  /* messages rows: a chat format name, or NULL (data/chat.h) */
    int steps;
    float lr;                 /* peak learning rate */
    int warmup;               /* linear warmup steps */
    float lr_min_frac;        /* cosine decay ends at lr * lr_min_frac */
    const char *log_path;     /* metrics JSONL, or NULL */
    const char *trace_path;   /* Chrome trace JSON, or NULL */
    int eval_problems;        /* synthetic task: held-out problems to decode (0: none) */
    int n_samples;            /* greedy samples to print at the end */
    bool keep_params;         /* copy final parameters into the result (tests) */
    FILE *out;                /* progress lines (NULL: silent) */
    /* checkpoints (src/fsdp/engine_ckpt.h) */
    const char *ckpt_dir;     /* NULL: no checkpoints */
    int ckpt_every;           /* save every S steps and after the last; 0: after the last only */
    int ckpt_keep;            /* keep the K newest complete checkpoints; 0: all */
    bool resume;              /* start from the newest complete checkpoint in ckpt_dir, if any */
    int stop_after;           /* tests: leave the loop after this global step (0: run to steps) */
} fsdp_train_config;

typedef struct fsdp_train_result {
    int steps;
    int first_step;           /* 0, or the step resumed from (losses[first_step..steps)) */
    float *losses;            /* [steps] global mean loss per step */
    float *grad_norms;        /* [steps] */
    float accuracy;           /* held-out exact-match accuracy, -1 if not measured */
    fsdp_rank_stats *stats;   /* [n_ranks] after the last step */
    float **params;           /* [n_units] unpadded fp32 params if keep_params */
    int n_units;
    int n_ranks;
    double tokens_per_s;      /* mean over steps after the first */
} fsdp_train_result;

/* Defaults for every field (the `fsdp train` defaults). */
void fsdp_train_config_default(fsdp_train_config *cfg);

/* Run training. On failure the result is partial and the message says
 * which rank failed and why. In a job of several processes every process
 * calls it with the same configuration (and its own procs); the result's
 * losses, figures, parameters and accuracy are process 0's (rank 0's). */
fsdp_status fsdp_train_run(const fsdp_train_config *cfg, fsdp_train_result *res);
void fsdp_train_result_free(fsdp_train_result *res);

/* Learning rate at `step` (0-based): linear warmup over `warmup` steps to
 * lr, then cosine decay to lr * lr_min_frac at the last step. */
float fsdp_train_lr(const fsdp_train_config *cfg, int step);

#endif /* FSDP_TRAIN_TRAIN_H */
