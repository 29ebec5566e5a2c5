/*
 * fit.h - `fsdp plan --fit`: the fastest setting of a training run that
 * fits the devices' memory (and the host's, when it is given), found by running candidate
 * settings on the meta backend (train/plan.h, exact to the byte) and
 * ranking the ones that fit by the cost model's step time (train/cost.h,
 * an estimate). Also the check `fsdp train` makes before it allocates.
 *
 * What is searched, for a fixed model, device count, sequence length,
 * precision and global batch G (sequences per optimizer step):
 *   micro-batch b over the divisors of G / devices, grad-accum = G / (devices b)
 *   x accumulation mode (tree; flat when grad-accum > 1, where it differs)
 *   x shard strategy x optimizer offload x prefetch x activation recompute.
 * A dimension can be pinned to one value (the request's masks). At the
 * same estimated speed a tree candidate ranks before a flat one (the tree
 * is exact for any split of the global batch; engine/accum.h).
 *
 * Exact pruning. A candidate is not run when a candidate that needs no
 * more memory was already measured over the device cap (by its engine
 * peak plus the cuda overheads every setting of its micro-batch shares).
 * "Needs no more memory" is a partial order the engine guarantees and
 * test_fit checks: at the same micro-batch and accumulation, the peak
 * does not decrease from shard full to grad-op, from offload optimizer to
 * none, from prefetch off to on, and from a recompute mode to one that
 * keeps more (the modes' memory_rank). NO_SHARD is not ordered against the
 * others: it uses parameters in place, so on one device, or with offload,
 * it can hold less than a sharded strategy. Different micro-batches are
 * never compared: with the global batch fixed, a smaller micro-batch means
 * more accumulation, whose tree of partial sums holds more gradient
 * buffers, so the peak is not monotone along that line. Each micro-batch
 * and accumulation mode is an independent chain; chains are searched in
 * parallel.
 */
#ifndef FSDP_TRAIN_FIT_H
#define FSDP_TRAIN_FIT_H

#include <stdbool.h>

#include "train/cost.h"
#include "train/plan.h"

/* ---- activation recompute: one more dimension, read from this table -------- */

typedef struct fsdp_recompute_mode {
    const char *name;      /* the --recompute value */
    int value;             /* what the engine is told */
    double forward_rerun;  /* forward passes rerun during backward, as a fraction of one
                              forward: the least the mode adds (FLOPs x forward_rerun / 3)
                              whatever the model's own figure says */
    int memory_rank;       /* activation memory order: a lower rank keeps no more */
    const char *help;
} fsdp_recompute_mode;

/* The modes the search can try (the engine's fsdp_recompute values); a
 * mode the engine gains is one row here. */
extern const fsdp_recompute_mode fsdp_fit_recompute_modes[];
extern const int fsdp_fit_n_recompute_modes;

/* ---- the search ------------------------------------------------------------ */

typedef struct fsdp_fit_request {
    /* Model, devices (eng.n_ranks), seq, precision, seed, clip...: as
     * given. eng.batch, grad_accum, shard, offload and prefetch are
     * searched; eng.backend, comm and device_mem are ignored. */
    fsdp_train_config base;
    int global_batch;        /* sequences per optimizer step: a multiple of the devices */
    size_t device_mem;       /* memory of each device, bytes (> 0) */
    size_t host_mem;         /* host memory the run may use, bytes; 0: not limited (the
                                target machine's is not known: nothing is over the host) */
    fsdp_backend backend;    /* the run's: cuda adds fsdp_cuda_overhead to each device;
                                cpu keeps the simulated devices in host memory too */
    size_t cuda_overhead;    /* cuda: replaces the estimate when > 0 (a measured figure) */
    fsdp_machine machine;
    /* values tried, one bit per value (FSDP_NAME_BIT); 0 = all */
    unsigned shard_mask;     /* of fsdp_shard_strategy */
    unsigned offload_mask;   /* bit k: offload value k (none, optimizer, params, both) */
    unsigned prefetch_mask;  /* bit 0: off, bit 1: on */
    unsigned recompute_mask; /* of indices into fsdp_fit_recompute_modes */
    unsigned accum_mask;     /* of fsdp_accum_mode */
    int steps;               /* steps of each meta run (>= 1) */
    int jobs;                /* micro-batches searched at once; 0: online CPUs / devices,
                                at least 1 (each meta run has a thread per device) */
} fsdp_fit_request;

/* Defaults: the train defaults for base, every dimension searched, the
 * machine defaults, backend cuda, 2 steps, jobs 0 (auto), host memory not
 * limited (0: the plan may be for another machine than this one).
 * global_batch and device_mem are left 0 (required). */
void fsdp_fit_request_default(fsdp_fit_request *req);

typedef enum fsdp_fit_verdict {
    FSDP_FIT_FITS = 0,       /* measured: fits both caps (ranked) */
    FSDP_FIT_OVER_DEVICE,    /* measured: a device's peak (+ cuda overhead) over the cap */
    FSDP_FIT_OVER_HOST,      /* measured: fits the devices, but not the host's memory */
    FSDP_FIT_PRUNED,         /* not run: candidate pruned_by needs no more memory and is over */
    FSDP_FIT_INVALID,        /* the model refuses this micro-batch's shape (message in why);
                                a recompute mode it does not implement is not a candidate */
} fsdp_fit_verdict;

typedef struct fsdp_fit_candidate {
    int batch, grad_accum;
    fsdp_shard_strategy shard;
    int offload;              /* fsdp_offload_names' value: bit 0 optimizer, bit 1 params */
    bool prefetch;
    int recompute;            /* index into fsdp_fit_recompute_modes */
    fsdp_accum_mode accum;
    fsdp_fit_verdict verdict;
    int pruned_by;            /* PRUNED (and INVALID found by pruning): the measured one */
    /* measured (FITS, OVER_*): */
    size_t peak_bytes;        /* the engine's largest per-device peak (exact) */
    int peak_device;
    size_t device_bytes;      /* peak_bytes + cuda overhead: compared with device_mem */
    size_t host_bytes;        /* the whole run's host memory (exact): pinned for every
                                 device, plus the simulated devices on cpu */
    size_t grad_bytes;        /* gradients where the accumulation keeps them, at the peak
                                 device's peak: its memory, or with offload its pinned
                                 host memory (FSDP_MEM_GRAD: shards, sums, in flight) */
    fsdp_cuda_overhead cuda;  /* zero unless the backend is cuda */
    fsdp_cost cost;           /* the estimate (measured candidates) */
    double tokens_per_s;      /* global tokens per step / cost.step_s */
    char why[256];            /* INVALID: the model's message */
} fsdp_fit_candidate;

typedef struct fsdp_fit_result {
    fsdp_fit_candidate *cand; /* [n_cand], micro-batch-major */
    int n_cand;
    int *ranked;              /* [n_fits]: the FITS candidates, fastest first */
    int n_fits;
    int best;                 /* ranked[0], or -1 when nothing fits */
    int best_twin;            /* best with the other accumulation mode, measured (-1: none:
                                 nothing fits, grad-accum 1, or a mode pinned) */
    int n_runs;               /* meta runs made */
    double wall_s;            /* time the search took */
    int jobs;                 /* micro-batches searched at once */
    size_t numel;             /* model parameters */
    double flops_per_token;   /* training, no recompute */
    unsigned recompute_refused; /* fsdp_fit_recompute_modes (bits) the model does not
                                   implement: left out of the search */
    char refused_why[256];    /* the engine's message for the first of them */
} fsdp_fit_result;

/* The indices of fsdp_fit_recompute_modes in `mask` (bits; 0: every mode)
 * whose mode the engine refuses to run m with (fsdp_engine_recompute_check:
 * a family without the recompute slots runs only none), as bits; the
 * engine's message for the first of them in why[0..n) ("" when none is). */
unsigned fsdp_fit_recompute_refused(const fsdp_model *m, unsigned mask, char *why, size_t n);

/* Search (see the top of this file). OK with a result whether or not
 * anything fits (best = -1 when nothing does); INVALID_ARG for a request
 * that cannot be searched (global batch not a multiple of the devices, no
 * cap, a mask that allows nothing, only recompute modes the model does not
 * implement, a model that cannot be built); other failures of the meta
 * runs as they are. A recompute mode the model does not implement is left
 * out (recompute_refused) and the other modes are searched. */
fsdp_status fsdp_fit_search(const fsdp_fit_request *req, fsdp_fit_result *out);
void fsdp_fit_free(fsdp_fit_result *r);

/* One line: "fsdp train --model ... --device-mem ..." that runs candidate
 * c (a cuda run's --device-mem is the engine's share: device_mem less the
 * cuda overhead). Words that need it are single-quoted for a POSIX shell. */
void fsdp_fit_command(const fsdp_fit_request *req, const fsdp_fit_candidate *c, char *buf,
                      size_t n);

/* The verdict's name in the JSON report: "fits", "over_device", "over_host",
 * "pruned", "invalid". */
const char *fsdp_fit_verdict_name(fsdp_fit_verdict v);

/* ---- fsdp train's check ------------------------------------------------------ */

/* Before `fsdp train` allocates anything: plan cfg on the meta backend and
 * compare its largest per-device peak with cfg->eng.device_mem (the
 * engine's cap, exact on cpu and cuda), and, when device_total > 0 (a
 * GPU's memory, fsdp_backend_device_total), the peak plus the cuda
 * overhead with device_total, for each of the ranks that share a GPU
 * (--ranks-per-device; one CUDA context among them). OK
 * when it fits or there is nothing to compare with; OOM with the plan's
 * numbers and the `fsdp plan --fit` command that finds a setting that
 * fits; other failures of the plan as they are. */
fsdp_status fsdp_fit_check_train(const fsdp_train_config *cfg, size_t device_total);

#endif /* FSDP_TRAIN_FIT_H */
