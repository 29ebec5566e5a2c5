/*
 * accum.h - gradient accumulation over micro-steps, in one of two modes
 * (--accum, fsdp_accum_names): tree, per unit a binary counter of partial
 * sums held in shard-sized fp32 buffers; flat, one running sum per unit.
 *
 * Tree (the default; docs/determinism.md): micro-step j's reduced gradient enters the counter
 * as a level-0 entry; two entries of the same level merge (older on the
 * left), so after A micro-steps the sum is the balanced binary tree over
 * j when A is a power of two, whatever the number of ranks. At most
 * popcount(j) + 1 buffers are live at once (fsdp_accum_depth).
 *
 * Flat: micro-step 0's reduced gradient lands in the unit's buffer 0 and
 * each later one in a scratch buffer that one rank's counter shares among
 * its units (the largest unit's shard, made on first use), then is added
 * to buffer 0 at once: ((g0 + g1) + g2) + ... in micro-step order. The
 * memory is one shard per unit plus the scratch, whatever A; the sum is
 * the same run to run and for any device count with the same A, but not
 * the tree's for A >= 4, so another split of the same global batch (batch
 * 8 x A 2 against batch 16 x A 1) gives other bits. For A <= 3 both modes
 * add in the same order: the same bits. The scratch is reused by the next
 * unit's reduction in the order of the op context's stream, which also
 * runs the add that reads it (see below), so one scratch serves them all.
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

#include "core/names.h"
#include "device/device.h"
#include "ops/ops.h"

#define FSDP_ACCUM_MAX 32

/* The --accum values. */
typedef enum fsdp_accum_mode {
    FSDP_ACCUM_TREE = 0, /* binary counter: exact for any split of the global batch */
    FSDP_ACCUM_FLAT,     /* running sum in micro-step order: memory independent of A */
    FSDP_ACCUM_MODE_COUNT
} fsdp_accum_mode;

/* The names of fsdp_accum_mode, with their one-line help (--help, plan). */
extern const fsdp_name_table fsdp_accum_names;

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
    int n_buf;                  /* buffers per unit: fsdp_accum_buffers(mode, grad_accum) */
    bool host;                  /* buffers in pinned host memory (see above) */
    fsdp_accum_mode mode;
    float *scratch;             /* flat: (max_numel,) the later micro-steps' values, or NULL */
    size_t max_numel;           /* flat: the largest unit's shard */
} fsdp_accum;

/* Buffers needed at once for A micro-steps: max over j < A of popcount(j) + 1. */
int fsdp_accum_depth(int A);

/* Shard-sized buffers per unit that `mode` keeps for A micro-steps: the
 * tree's fsdp_accum_depth(A); flat's 1 (its scratch, one per rank, comes
 * on top when A > 1). What the planner's formula counts. */
int fsdp_accum_buffers(fsdp_accum_mode mode, int A);

/* Bookkeeping for n_units units and grad_accum micro-steps in `mode` (no
 * memory yet); host: the buffers are pinned host memory; max_numel: the
 * largest unit's shard (the size of flat's scratch). OOM or INVALID_ARG
 * (grad_accum beyond 2^FSDP_ACCUM_MAX, a mode out of range). */
fsdp_status fsdp_accum_init(fsdp_accum *a, fsdp_device *dev, fsdp_op_ctx *ops, int n_units,
                            int grad_accum, fsdp_accum_mode mode, size_t max_numel, bool host);
/* Free the bookkeeping; device buffers go with fsdp_accum_release or the
 * device. */
void fsdp_accum_free(fsdp_accum *a);

/* Use buf as unit u's buffer 0 (the gradient shard itself, so that a
 * single micro-step, or a counter that folds into buffer 0, needs no copy).
 * It is never freed here: do not combine with fsdp_accum_release. */
void fsdp_accum_adopt(fsdp_accum *a, int u, float *buf);

/* A free buffer of numel floats for unit u's next micro-step value, in
 * *buf, and its index in *slot (allocated on first use, FSDP_MEM_GRAD,
 * device or pinned host memory, named after `unit_name`; flat: buffer 0
 * for a unit's first micro-step, else the shared scratch). Fill it (in the
 * order of the op context's stream), then fsdp_accum_push. */
fsdp_status fsdp_accum_slot(fsdp_accum *a, int u, size_t numel, const char *unit_name,
                            float **buf, int *slot);

/* Enter the value in `slot` into unit u's counter, merging equal levels
 * (flat: add the scratch to buffer 0). */
void fsdp_accum_push(fsdp_accum *a, int u, int slot, size_t numel);

/* After the last micro-step: fold what is left (one entry when A is a
 * power of two) and return the buffer holding the sum; the counter is
 * empty again and its buffers reusable. */
float *fsdp_accum_fold(fsdp_accum *a, int u, size_t numel);

/* Free unit u's buffers now (their contents are no longer needed; flat's
 * shared scratch goes with the device). Frees
 * are stream-ordered (device.h): work already queued that reads them, a
 * copy of the folded sum, may still run. */
void fsdp_accum_release(fsdp_accum *a, int u);

#endif /* FSDP_ENGINE_ACCUM_H */
