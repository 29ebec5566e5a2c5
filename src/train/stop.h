/*
 * stop.h - a stop request's codes and the words the ranks of a job OR
 * together after each step, so that every process stops after the same
 * step with the same code (the trainer, train.c, and the held-out
 * evaluation, synth_eval.c, both exchange them).
 */
#ifndef FSDP_TRAIN_STOP_H
#define FSDP_TRAIN_STOP_H

/* A stop request's value (fsdp_train_config.stop) in 1..FSDP_TRAIN_STOP_CODE_MAX
 * is a code the run reports back (res->stop_code: `fsdp train` passes the
 * signal that asked); any other nonzero value stops without one. */
#define FSDP_TRAIN_STOP_CODE_MAX 24

/* The word a process's request adds to the ranks' OR after a step (bit 0:
 * stop; bit 7 + code: the code), and the smallest code an OR of such words
 * holds (0: none). */
static inline unsigned fsdp_train_stop_word(int request)
{
    if (!request)
        return 0;
    return 1u | (request > 0 && request <= FSDP_TRAIN_STOP_CODE_MAX ? 1u << (7 + request) : 0u);
}

static inline int fsdp_train_stop_code(unsigned word)
{
    for (int code = 1; code <= FSDP_TRAIN_STOP_CODE_MAX; code++)
        if (word & (1u << (7 + code)))
            return code;
    return 0;
}

#endif /* FSDP_TRAIN_STOP_H */
