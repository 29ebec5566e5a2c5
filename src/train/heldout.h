/*
 * heldout.h - the held-out loss of a training run (--eval-data): a second
 * data source of the same kind as the training data, read in micro-batches
 * of the run's B x T and evaluated forward only on the training engine.
 *
 * Micro-batch m of the held-out set is dealt to rank m % N as training
 * deals its own (data/data.h numbers them globally), each batch's loss is
 * the model's sum over B*T with masked targets adding 0, and the mean over
 * the unmasked targets is taken in the step's tree order
 * (fsdp_engine_mean_loss): the result does not depend on the number of
 * ranks, and on streams equals `fsdp eval` of the same parameters on the
 * same file, batch, sequence length, seed and micro-batch count
 * (train/infer.h). Example rows are read once (fsdp_data_set_one_pass: no
 * example counts twice) and packed when the training rows are (document
 * masking keeps the examples apart), so the loss is the mean over the same
 * targets packed or not.
 */
#ifndef FSDP_TRAIN_HELDOUT_H
#define FSDP_TRAIN_HELDOUT_H

#include <stdint.h>

#include "data/data.h"
#include "engine/engine.h"

#define FSDP_HELDOUT_MAX_DEFAULT 50 /* micro-batches of the whole-file default */

typedef struct fsdp_heldout {
    fsdp_data *data;          /* the held-out set, owned; NULL: none */
    const char *spec;         /* its path (not copied) */
    int n_batches;            /* micro-batches 0 .. n_batches-1 per evaluation */
    uint64_t rows;            /* tokens per micro-batch, B*T */
} fsdp_heldout;

/* Open opts->spec as the held-out set of a run that trains on `train`
 * (opened from train_spec, with the same tokenizer and chat format in
 * opts) in micro-batches of B x T, for a model of vocab_size tokens.
 * n_batches = eval_steps, or (0) the micro-batches that cover the file
 * once (examples: ceil(rows / B), rows packed as train's are; streams:
 * tokens / (B*T), at least 1),
 * at most FSDP_HELDOUT_MAX_DEFAULT. INVALID_ARG when the set is of another
 * kind than the training data (text, token shards, .jsonl text rows,
 * example rows), uses token ids the model does not have, or has no target
 * within T; the data's own errors when it cannot be read. On failure h
 * holds nothing. */
fsdp_status fsdp_heldout_open(fsdp_heldout *h, const fsdp_data_opts *opts, const fsdp_data *train,
                              const char *train_spec, int B, int T, int eval_steps,
                              int vocab_size);

/* The micro-batches of B x T that read d once, at most FSDP_HELDOUT_MAX_DEFAULT (the
 * --eval-steps and `fsdp eval --steps` default): ceil(rows / B) for example rows, over
 * their rows as laid out for T (packed or not; the last batch's rows past the end are
 * padding, fsdp_data_set_one_pass); tokens / (B*T) for streams; at least 1. */
int fsdp_heldout_batches(const fsdp_data *d, int B, int T);

/* The held-out loss of e's current parameters into *loss on every rank:
 * the mean over the unmasked targets of the n_batches micro-batches.
 * Collective over the job's n_ranks ranks (forwards, then one
 * fsdp_engine_exchange); every rank gets the same value. No gradient or
 * optimizer state changes. */
fsdp_status fsdp_heldout_run(const fsdp_heldout *h, fsdp_engine *e, int n_ranks, int rank,
                             float *loss);

void fsdp_heldout_close(fsdp_heldout *h);

#endif /* FSDP_TRAIN_HELDOUT_H */
