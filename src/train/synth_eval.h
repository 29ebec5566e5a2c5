/*
 * synth_eval.h - held-out accuracy on the synthetic task (data/data.h:
 * fsdp_synth_problem) by greedy decoding, at the end of `fsdp train`.
 *
 * Every rank of the job calls it together on its own engine (each forward
 * all-gathers); the problems are dealt to ranks as micro-batches are, so
 * the job decodes each held-out problem once whatever its size.
 */
#ifndef FSDP_TRAIN_SYNTH_EVAL_H
#define FSDP_TRAIN_SYNTH_EVAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "engine/engine.h"
#include "train/stop.h"

typedef struct fsdp_synth_eval {
    int n_problems;           /* held-out problems to decode */
    int n_samples;            /* rank 0 prints the first ones (with out) */
    FILE *out;                /* rank 0's sample lines, or NULL */
    const atomic_int *stop;   /* a stop request (nonzero; stop.h's codes) ends the
                               * evaluation at the next batch: read by the ranks given one
                               * (the trainer gives it to the first rank of each process);
                               * NULL: none */
    /* results: on rank 0 */
    int correct, seen;        /* the job's totals */
    /* on every rank */
    unsigned stop_word;       /* ended by a stop request: the OR of the requests' words
                               * (fsdp_train_stop_word), 0 when it ran to the end */
} fsdp_synth_eval;

/* Decode ev->n_problems held-out problems greedily on e, whose
 * configuration is ec: rank r takes rows (k * N + r) * B + b of batch k (N
 * ranks, B the batch; problems drawn with ec->seed); every rank runs the
 * same number of forwards and leaves at the same batch (the stop decision
 * is the job's). A problem is right when the decoded text starts with its
 * answer. Rank 0 fills ev's results (the job's totals, through
 * fsdp_engine_exchange) and prints samples. */
fsdp_status fsdp_synth_eval_run(fsdp_engine *e, int rank, const fsdp_engine_config *ec,
                                const fsdp_model *m, fsdp_synth_eval *ev);

#endif /* FSDP_TRAIN_SYNTH_EVAL_H */
