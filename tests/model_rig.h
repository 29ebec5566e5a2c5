/*
 * model_rig.h - one rank driving a model through its interface (struct
 * fsdp_model_i) the way the engine does, without the engine: a device, an
 * op context, the whole parameters and fp32 gradients of every unit, and
 * the model's activation state. The model suites (test_model for GPT-2,
 * test_llama for the Llama family) check forward, backward and memory
 * accounting with it. Also the model suites' check of a refused model
 * spec (test_model, test_llama_weights) and the per-unit host buffers
 * many suites fill, write and compare.
 *
 * Linked into every suite (TEST_COMMON in the Makefile). Every helper
 * asserts with Check: call them from the forked test.
 */
#ifndef FSDP_TESTS_MODEL_RIG_H
#define FSDP_TESTS_MODEL_RIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "case_util.h"
#include "device/device.h"
#include "models/gpt2.h"
#include "models/model.h"
#include "ops/ops.h"

typedef struct rig {
    fsdp_device dev;
    fsdp_op_ctx ctx;
    const fsdp_model *m;
    fsdp_model own; /* the model, when rig_init_gpt2 built it */
    void *state;
    void **params; /* per unit, device memory in ctx.dt */
    float **grads; /* per unit, fp32; allocated when training */
    int B, T;
} rig;

/* A device of backend `be`, ops in dt, parameters (and, when training,
 * gradients) for every unit of m (which the rig borrows), and the state
 * for micro-batches of B x T. */
void rig_init(rig *r, fsdp_backend be, const fsdp_model *m, fsdp_dtype dt, int B, int T,
              bool training);
/* The same for a GPT-2 of cfg, which the rig builds and owns. */
void rig_init_gpt2(rig *r, fsdp_backend be, const fsdp_gpt2_config *cfg, fsdp_dtype dt, int B,
                   int T, bool training);
/* Frees everything, asserting that no device or host memory stays in use;
 * the model too when the rig owns it. */
void rig_free(rig *r);

/* Every gradient set to zero (the backward accumulates). */
void rig_zero_grads(rig *r);
/* One micro-step as the engine runs it: forward, the head's loss (scaled
 * by dloss), and backward into the gradients when `train`, done when it
 * returns (the stream synced). Returns the micro-batch loss. */
float rig_step(rig *r, const int *tokens, const int *targets, bool train, float dloss);

/* n fp32 values stored as parameter elements [offset, offset + n) of unit
 * `unit`, in the rig's dtype. */
void rig_put(rig *r, int unit, size_t offset, const float *src, size_t n);
/* Every parameter from whole fp32 unit buffers. */
void rig_put_units(rig *r, float *const *units);

/* ---- model interfaces ------------------------------------------------------------ */

/* Points m at *without: a copy of its interface with the recompute slots
 * removed (a family that runs only recompute none). Returns the interface
 * to put back before fsdp_model_free. */
const struct fsdp_model_i *model_drop_recompute(fsdp_model *m, struct fsdp_model_i *without);

/* ---- per-unit host buffers ----------------------------------------------------- */

/* A zeroed fp32 buffer per unit of m (units_free frees them). */
float **units_alloc(const fsdp_model *m);
/* The same holding m's own initial values for seed (fsdp_model_init_range). */
float **units_init(const fsdp_model *m, uint64_t seed);
void units_free(const fsdp_model *m, float **units);

/* ---- model specs ---------------------------------------------------------------- */

/* For every row: fsdp_model_from_spec(in) fails with INVALID_ARG, its
 * message holding want, and leaves no units behind. */
void expect_specs_rejected(const text_case *bad, size_t n);

#endif /* FSDP_TESTS_MODEL_RIG_H */
