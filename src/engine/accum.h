/*
 * accum.h - gradient accumulation over micro-steps: per unit, a binary
 * counter of partial sums held in shard-sized fp32 buffers.
 *
 * Determinism (docs/determinism.md): micro-step j's reduced gradient enters the counter
 * as a level-0 entry; two entries of the same level merge (older on the
 * left), so after A micro-steps the sum is the balanced binary tree over
 * j when A is a power of two, whatever the number of ranks. At most
 * popcount(j) + 1 buffers are live at once (fsdp_accum_depth).
 *
 * The counter's adds run on the op context's stream. The device placement
 * gives it a context on the comm stream, so each add follows, in stream
 * order, the reduce-scatter that wrote its slot, and the reduce-scatter
 * keeps overlapping the next unit's backward (an add on the compute stream
 * would read the slot before the comm stream had written it, unless
 * compute waited for comm at every unit). With `host` (optimizer offload)
 * the buffers are pinned host memory and the context runs the cpu kernels
 * as host work queued on the copy stream, after the copies that fill the
 * slots: the same adds in the same order, so the same bits, and the
 * device keeps no partial sum. Whoever reads the folded sum orders itself
 * after that stream. Buffers are made on first use and kept for later
 * steps, until fsdp_accum_release or the device's own teardown frees them.
 * One rank's engine owns one fsdp_accum; it is used by that rank's thread
 * only.
 */
#ifndef FSDP_ENGINE_ACCUM_H
#define FSDP_ENGINE_ACCUM_H

#include "device/device.h"
#include "ops/ops.h"

#define FSDP_ACCUM_MAX 32

/* One unit's counter: stack[i] = buffer index, level[i] = log2 of how many
 * micro-steps it sums. */
typedef struct fsdp_accum_unit {
    float *buf[FSDP_ACCUM_MAX]; /* (shard_numel,) fp32 device buffers, or NULL */
    int stack[FSDP_ACCUM_MAX];
    int level[FSDP_ACCUM_MAX];
    int depth;
    unsigned busy;              /* bit k: buf[k] holds a live partial sum */
} fsdp_accum_unit;

typedef struct fsdp_accum {
    fsdp_device *dev;
    fsdp_op_ctx *ops;
    fsdp_accum_unit *units;     /* [n_units] */
    int n_units;
    int n_buf;                  /* buffers per unit: fsdp_accum_depth(grad_accum) */
    bool host;                  /* buffers in pinned host memory (see above) */
} fsdp_accum;

/* Buffers needed at once for A micro-steps: max over j < A of popcount(j) + 1. */
int fsdp_accum_depth(int A);

/* Bookkeeping for n_units units and grad_accum micro-steps (no memory
 * yet); host: the buffers are pinned host memory. OOM or INVALID_ARG
 * (grad_accum beyond 2^FSDP_ACCUM_MAX). */
fsdp_status fsdp_accum_init(fsdp_accum *a, fsdp_device *dev, fsdp_op_ctx *ops, int n_units,
                            int grad_accum, bool host);
/* Free the bookkeeping; device buffers go with fsdp_accum_release or the
 * device. */
void fsdp_accum_free(fsdp_accum *a);

/* Use buf as unit u's buffer 0 (the gradient shard itself, so that a
 * single micro-step, or a counter that folds into buffer 0, needs no copy).
 * It is never freed here: do not combine with fsdp_accum_release. */
void fsdp_accum_adopt(fsdp_accum *a, int u, float *buf);

/* A free buffer of numel floats for unit u's next micro-step value, in
 * *buf, and its index in *slot (allocated on first use, FSDP_MEM_GRAD,
 * device or pinned host memory, named after `unit_name`). Fill it (in the
 * order of the op context's stream), then fsdp_accum_push. */
fsdp_status fsdp_accum_slot(fsdp_accum *a, int u, size_t numel, const char *unit_name,
                            float **buf, int *slot);

/* Enter the value in `slot` into unit u's counter, merging equal levels. */
void fsdp_accum_push(fsdp_accum *a, int u, int slot, size_t numel);

/* After the last micro-step: fold what is left (one entry when A is a
 * power of two) and return the buffer holding the sum; the counter is
 * empty again and its buffers reusable. */
float *fsdp_accum_fold(fsdp_accum *a, int u, size_t numel);

/* Free unit u's buffers now (their contents are no longer needed). Frees
 * are stream-ordered (device.h): work already queued that reads them, a
 * copy of the folded sum, may still run. */
void fsdp_accum_release(fsdp_accum *a, int u);

#endif /* FSDP_ENGINE_ACCUM_H */
