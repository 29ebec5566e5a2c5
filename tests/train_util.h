/*
 * train_util.h - what the suites that train through fsdp_train_run share:
 * a cpu configuration that only trains (no evaluation, no output), a run
 * that must succeed, one that must fail with a given status and message,
 * and the check that two checkpoint manifests describe the same units.
 * Each suite sets what its runs need on top of the base.
 *
 * Linked into every suite (TEST_COMMON in the Makefile). The assertions
 * are Check's: call these from the forked test, never from rank threads.
 */
#ifndef FSDP_TESTS_TRAIN_UTIL_H
#define FSDP_TESTS_TRAIN_UTIL_H

#include "ckpt/manifest.h"
#include "core/error.h"
#include "train/train.h"

/* fsdp_train_config_default, then: the cpu backend on `devices` ranks,
 * sequences of 16 tokens of synthetic data, `model`, no evaluation
 * problems, no output stream. Samples, batch, steps and the rest stay the
 * defaults for the caller to set. */
void train_config_cpu(fsdp_train_config *c, const char *model, int devices);

/* A tiny deterministic run (test_engine, test_train_errors): 3 steps of a
 * global batch of 8 micro-batches of one sequence over `devices` devices
 * (accum 0: 8 / devices micro-steps each, else that many of batch
 * 8 / (devices * accum)), warm-up 1, lr 1e-2, the final parameters kept. */
void train_config_tiny(fsdp_train_config *c, int devices, int accum);

/* a and b (runs of `model`, a spec, with keep_params) are the same bit for
 * bit: every step's loss and gradient norm, and the final parameters of
 * every unit; a difference names `what`, the step or unit. */
void expect_identical_runs(const fsdp_train_result *a, const fsdp_train_result *b,
                           const char *model, const char *what);
/* The same for runs of model m (as the engine lays it out: adapters added, say). */
void expect_identical_runs_of(const fsdp_train_result *a, const fsdp_train_result *b,
                              const struct fsdp_model *m, const char *what);

/* fsdp_train_run(c, r), which must succeed; a failure names the model, the
 * status and the message. */
void run_ok(const fsdp_train_config *c, fsdp_train_result *r);
/* The same, the failure naming `what` instead of the model. */
void run_ok_as(const fsdp_train_config *c, fsdp_train_result *r, const char *what);

/* The activation-recompute memory contract for a model of L blocks: c
 * run once per recompute mode (one step, parameters not kept) saves, against
 * none, (L - 1) * block_drop activation bytes with block and
 * (L - 1) * elem_drop with elementwise (one copy stays), and its peak falls
 * by exactly as much. c's recompute, steps and keep_params are changed. */
void expect_recompute_savings(fsdp_train_config *c, int L, size_t block_drop, size_t elem_drop);

/* A model file at path (its format from the name) of the tiny model whose
 * weights are zeros but element `index` of unit `unit`, a NaN: every step
 * from it is non-finite. */
void write_nan_tiny_model(const char *path, int unit, size_t index);

/* fsdp_train_run(c, ...) must fail with `want`, its message holding a and
 * b (either NULL: not checked); the result is freed. */
void run_fail(const fsdp_train_config *c, fsdp_status want, const char *a, const char *b);

/* got's units and parameters are want's, in order: unit names, shard and
 * padded numels, parameter counts, and each parameter's name, offset in
 * its unit, rank and first dimension (how two manifests of one model must
 * agree, whichever version or run wrote them). */
void expect_same_units(const fsdp_ckpt_manifest *got, const fsdp_ckpt_manifest *want);

#endif /* FSDP_TESTS_TRAIN_UTIL_H */
