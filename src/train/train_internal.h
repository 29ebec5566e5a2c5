/*
 * train_internal.h - the trainer object that one training run's rank threads
 * share, for the trainer's files (train.c: the loop, progress and the run;
 * train_ckpt.c: the run's checkpoints). Not part of the trainer's API
 * (train.h).
 *
 * Threading: built on the main thread before the ranks start; then rank 0
 * writes the result and the figures (the first rank of each process its
 * res->interrupted and res->stop_code), any rank the stop error (under
 * mu), and every rank reads the rest.
 */
#ifndef FSDP_TRAIN_TRAIN_INTERNAL_H
#define FSDP_TRAIN_TRAIN_INTERNAL_H

#include <pthread.h>
#include <stdio.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/manifest.h"
#include "ckpt/modelfile.h"
#include "core/world.h"
#include "train/adapt.h"
#include "train/heldout.h"
#include "train/outputs.h"
#include "train/schedule.h"
#include "train/train.h"

/* Why the ranks stop early (the bits of the barrier after each step). */
enum {
    STOP_REQUEST = 1u << 0, /* cfg->stop: finish, checkpoint, return OK (with its code in
                             * bits 8..31: fsdp_train_stop_word, train.h) */
    STOP_ERROR = 1u << 1,   /* t->stop_st: the step counts; stop after it */
    STOP_DATA = 1u << 2,    /* a rank could not read this step's batch: it does not count */
    STOP_EARLY = 1u << 3,   /* cfg->early_stop: no new lowest held-out loss for that many
                             * evaluations (decided alike by every rank, train_eval.c) */
};

/* The held-out loss's standing (train_eval.c), on every rank alike: each
 * takes it from the same exchanged values. */
struct eval_track {
    float best;               /* the lowest held-out loss so far (INFINITY: none) */
    int best_step;
    int n_worse;              /* evaluations since then without a lower one */
};

/* One training run: what the rank threads share (train.c). */
struct trainer {
    const fsdp_train_config *cfg; /* &run */
    fsdp_train_config run;    /* the caller's, with what the data decides (train_data.c) */
    FILE *out;                /* t->out on process 0; NULL on the others */
    fsdp_world *world;
    fsdp_engine_shared sh;
    fsdp_model model;
    fsdp_data *data;
    fsdp_train_result *res;
    fsdp_metrics_file log;    /* --log (log.f NULL: none); rank 0 writes */
    const fsdp_metrics_sink *sink; /* cfg->sink once opened (process 0), else NULL */
    bool sink_failed;         /* a write to it failed: the run stops */
    int n_logged;             /* steps logged by this run (rank 0) */
    char oom_hint[192];       /* what a device out-of-memory message suggests */
    pthread_mutex_t mu;       /* guards stop_st and stop_msg */
    fsdp_status stop_st;      /* the error that stops the run early (first wins), or OK */
    char stop_msg[FSDP_ERROR_MSG_MAX];
    double flops_per_token;   /* 6 P + attention, for MFU */
    double peak_flops;        /* per device; 0 = unknown (no MFU) */
    double tok_s_sum;
    int tok_s_n;
    int eval_correct, eval_seen; /* the job's, written by rank 0 */
    fsdp_ckpt_manifest ck_base;   /* run-level part of the manifests this run writes */
    fsdp_ckpt_manifest ck_resume; /* the checkpoint resumed from */
    char ck_path[FSDP_CKPT_PATH_MAX]; /* its directory; "" when starting fresh */
    char tokenizer[FSDP_CKPT_PATH_MAX]; /* the data's tokenizer (--tokenizer or the model
                                           directory's), "" for none: checkpoints record it */
    int start_step;
    fsdp_modelfile *mf;       /* --model FILE: the initial weights, or NULL */
    fsdp_adapt adapt;         /* --lora/--freeze applied to the model (adapt.h) */
    fsdp_ckpt_lock ck_lock;   /* --ckpt-dir held for the run: one run per directory */
    char flight_path[4096 + 32]; /* where a stall writes this process's flight record */
    fsdp_heldout heldout;     /* --eval-data (heldout.data NULL: none) */
    int eval_every;           /* evaluate after every eval_every steps and after the last */
    struct eval_track eval0;  /* the standing the run starts from (a resume: the
                               * checkpoint's, else DIR/BEST's) */
    bool tok_from_ckpt;       /* t->tokenizer is the copy the resumed checkpoint carries */
    char chat_format[FSDP_CKPT_CHAT_FORMAT_MAX]; /* --chat-format, else the one the resumed checkpoint's run
                               * used (its manifest's chat_format), else "": the data's */
};

/* A job of several processes (train_agree.c): every setting that changes
 * what the ranks compute or which collectives they issue is the same in
 * every process, else INVALID_ARG on every process naming each flag and
 * the values that differ. After the world is made, before anything the
 * processes do together depends on the settings. OK in one process. */
fsdp_status fsdp_trainer_agree(struct trainer *t);

/* The run's data once open (train_data.c), before the engine: t->run.eng.seq and
 * ec->seq when the sequence length is the default (cfg->seq_auto), packing
 * (cfg->pack), the refusal of example data with nothing to train, the steps of
 * --epochs (t->run.steps), and the header lines that say so. */
fsdp_status fsdp_trainer_data_rows(struct trainer *t, fsdp_engine_config *ec);

/* Real (not padding) input tokens of step `step`'s global batch: what tokens/s and
 * MFU count. Any thread. */
uint64_t fsdp_trainer_step_tokens(const struct trainer *t, int step);

/* The length step `step` runs at (fsdp_engine_set_len): unpacked example rows, its global
 * batch's longest example (the same on every rank); else, or with cfg->pad_full, --seq.
 * Any thread. */
int fsdp_trainer_step_len(const struct trainer *t, int step);

/* The learning-rate schedule's settings from the run's (train_config.c). */
fsdp_lr_plan fsdp_trainer_lr_plan(const fsdp_train_config *cfg);

/* Checkpoints (train_ckpt.c). Before the ranks start, on the main thread
 * of every process: the manifest base for saves, --ckpt-dir claimed (a
 * fresh run refuses a directory that holds checkpoints) and, with
 * --resume, the checkpoint to start from (t->ck_path, t->ck_resume,
 * t->start_step; "" when there is none). Collective over the job's
 * processes. */
fsdp_status fsdp_trainer_ckpt_prepare(struct trainer *t);

/* --resume without --tokenizer, before the data is opened: the tokenizer.json the newest
 * checkpoint in --ckpt-dir carries (verified against its manifest), into buf, and a header
 * line saying so; *found false (OK) otherwise: no --resume, --tokenizer given, or no
 * checkpoint that carries one. A carried tokenizer that no longer matches its manifest
 * is FORMAT (ckpt_tok.h). */
fsdp_status fsdp_trainer_ckpt_tokenizer(struct trainer *t, char *buf, size_t n, bool *found);
/* t->chat_format: --chat-format, else (--resume) the one the checkpoint's run rendered
 * {"messages"} rows with, said on t->out; else "" (the data's default). */
fsdp_status fsdp_trainer_ckpt_chat_format(struct trainer *t);

/* Write the checkpoint of the state after `done` steps (rank 0 records it
 * in the result and says so). Collective: every rank calls it, with the
 * same `done`. */
fsdp_status fsdp_trainer_ckpt_save(struct trainer *t, fsdp_engine *e, int rank, int done);

/* The held-out set (train_eval.c): --eval-data opened like --data (with
 * the same tokenizer and chat format) once the training data is open, its
 * schedule resolved and said; with --keep-best and --resume the standing
 * recorded in --ckpt-dir/BEST. Main thread, before the ranks start. */
fsdp_status fsdp_trainer_eval_open(struct trainer *t, const fsdp_engine_config *ec);

/* After step `done` counted: when an evaluation is due, the held-out loss
 * into *loss (else NaN), the standing ev updated, *best true when it is a
 * new lowest (rank 0 also records them in the result). Collective (every
 * rank calls it with the same done). */
fsdp_status fsdp_trainer_eval_step(struct trainer *t, fsdp_engine *e, int rank, int done,
                                   struct eval_track *ev, float *loss, bool *best);

/* Rank 0, after the step's progress line: the evaluation's line (none when
 * loss is NaN: no evaluation after this step). */
void fsdp_trainer_eval_print(const struct trainer *t, int done, const struct eval_track *ev,
                             float loss);

/* --keep-best, once the checkpoint of step `done` is complete: rank 0
 * records it in --ckpt-dir/BEST; the other ranks return OK. */
fsdp_status fsdp_trainer_eval_mark_best(struct trainer *t, int rank, int done, float loss);

/* cfg->early_stop reached after step `done` (ev on every rank alike):
 * rank 0 fills the result and says why the run stops. */
void fsdp_trainer_eval_early_stop(struct trainer *t, int rank, int done,
                                  const struct eval_track *ev);

#endif /* FSDP_TRAIN_TRAIN_INTERNAL_H */
