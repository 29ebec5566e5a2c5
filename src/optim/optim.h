/*
 * optim.h - the optimizer interface and the registry of optimizers by name.
 *
 * An optimizer is a table (struct fsdp_optim): its name, the
 * hyper-parameters it takes (name, default, valid range, help), the fp32
 * state arrays it keeps per parameter (named: checkpoints store them under
 * these names), the constants of step t (AdamW's bias corrections), a
 * device step through the op table and a host step (the vectorised CPU
 * kernel; optim/host_step.h runs it on the worker pool for optimizer
 * offload). The engine (src/engine) drives whichever one the configuration
 * names through this table and never names one itself; the configuration
 * carries the hyper-parameters as one block (fsdp_optim_hparams) that only
 * the optimizer reads.
 *
 * Who owns what: the arithmetic of each update rule is in src/ops (the cpu
 * reference and vector kernels in ops/optim_kernels.h, the CUDA kernels
 * in ops/cuda); this layer decides which kernel a rule uses, with which
 * constants, on which state arrays. This header names no backend: the
 * optimizers' files (adamw.c, sgd.c) and host_step.c include the cpu
 * kernels they call.
 *
 * Adding an optimizer: its kernels in src/ops (cpu reference + vectorised,
 * a CUDA kernel, an op slot), one file here filling a struct fsdp_optim,
 * and one line in the registry (optim.c). The CLI's --optimizer parsing and
 * help, its hyper-parameter flags (--beta1, --momentum...) with their
 * checks and help, the planner's byte counts and the checkpoint format
 * follow from the table.
 */
#ifndef FSDP_OPTIM_OPTIM_H
#define FSDP_OPTIM_OPTIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops/isa.h"
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_OPTIM_MAX_STATE 4  /* state arrays per parameter, at most */
#define FSDP_OPTIM_NAME_MAX 24  /* optimizer and state array names, with the NUL */

#define FSDP_OPTIM_MAX_HPARAMS 4 /* hyper-parameters an optimizer declares, at most */
#define FSDP_OPTIM_MAX_FLAGS 16  /* distinct hyper-parameter names in the registry, at most */

/* A hyper-parameter an optimizer declares: the optimizer's table is the one
 * place its name, default, valid range and help live. The CLI offers each
 * name as a flag (--beta1) and builds the flag's help from this; the range
 * check (fsdp_optim_hparams_check) and its message come from it too. */
typedef struct fsdp_optim_hparam {
    const char *name;          /* "beta1": the flag --beta1 and the name in messages */
    float def;                 /* the value when none is given */
    float lo, hi;              /* valid: lo <= x < hi; hi INFINITY: any finite x >= lo */
    bool lo_open;              /* lo itself is refused (x > lo) */
    const char *help;          /* what it is, a noun phrase: "first-moment decay" */
} fsdp_optim_hparam;

/* The hyper-parameters of a run, as the engine configuration carries them:
 * the optimizer's own, in the order its table declares them, and the
 * weight decay every optimizer takes. Entries whose `given` bit is clear
 * take the optimizer's defaults (fsdp_optim_hparams_resolve), so a zeroed
 * block is the optimizer at its defaults with no weight decay. The check,
 * consts and step slots take a resolved block. */
typedef struct fsdp_optim_hparams {
    float v[FSDP_OPTIM_MAX_HPARAMS]; /* v[i]: hyper-parameter i of the optimizer's table */
    unsigned given;                  /* bit i: v[i] was set */
    float weight_decay;              /* for the parameters that decay (the model marks them) */
} fsdp_optim_hparams;

/* The constants of one step, the same for every element of every shard:
 * computed once per step by the optimizer's consts slot. */
typedef struct fsdp_optim_consts {
    float lr;
    float grad_scale;          /* multiplies every gradient (global-norm clipping) */
    float k[2];                /* optimizer-specific (AdamW: 1 - beta1^t, 1 - beta2^t) */
} fsdp_optim_consts;

/* A contiguous run of one shard's parameters that share a weight decay:
 * what a step updates. Pointers are device memory for device_step and host
 * memory for host_step. */
typedef struct fsdp_optim_range {
    float *p;                               /* (n,) fp32 master parameters, in place */
    const float *grad;                      /* (n,) fp32 gradient; aliases nothing written */
    float *state[FSDP_OPTIM_MAX_STATE];     /* (n,) each: the optimizer's arrays, in its order */
    void *p_out;                            /* (n,) the new parameters again in out_dt, or NULL */
    fsdp_dtype out_dt;                      /* fp32 or bf16 (p_out may alias p only for fp32) */
    size_t n;
    float wd;                               /* weight decay of these parameters (0: none) */
} fsdp_optim_range;

typedef struct fsdp_optim {
    const char *name;                       /* "adamw": --optimizer, manifests */
    const char *help;                       /* one line for --help */
    int n_hparams;                          /* hyper-parameters beyond lr and weight decay */
    const fsdp_optim_hparam *hparams;       /* [n_hparams]: hp->v[i] is hparams[i]'s value */
    int n_state;                            /* fp32 state arrays per parameter */
    const char *state_names[FSDP_OPTIM_MAX_STATE]; /* checkpoints store them by these names */
    /* Optional (NULL: the ranges of hparams say it all): what the ranges
     * cannot, e.g. a relation between two hyper-parameters; INVALID_ARG
     * naming them. Called after the range checks pass. */
    fsdp_status (*check)(const fsdp_optim_hparams *hp);
    /* The constants of step t (1-based) at learning rate lr; INVALID_ARG
     * if t is out of range. */
    fsdp_status (*consts)(const fsdp_optim_hparams *hp, uint64_t t, float lr, float grad_scale,
                          fsdp_optim_consts *out);
    /* One step on device memory through the op table, asynchronous on
     * ops' stream (a no-op on meta). */
    void (*device_step)(fsdp_op_ctx *ops, const fsdp_optim_hparams *hp,
                        const fsdp_optim_consts *c, const fsdp_optim_range *r);
    /* One step on host memory on the calling thread with the kernel of isa
     * (FSDP_CPU_ISA_COUNT: the best; others must be supported), bit-identical
     * to device_step on the cpu backend. */
    void (*host_step)(fsdp_cpu_isa isa, const fsdp_optim_hparams *hp, const fsdp_optim_consts *c,
                      const fsdp_optim_range *r);
} fsdp_optim;

extern const fsdp_optim fsdp_optim_adamw;
extern const fsdp_optim fsdp_optim_sgd;

/* The registry, in --help order; entry 0 is the default (AdamW). */
int fsdp_optim_count(void);
const fsdp_optim *fsdp_optim_at(int i);

/* o, or the default when o is NULL (a zeroed configuration means AdamW). */
const fsdp_optim *fsdp_optim_or_default(const fsdp_optim *o);

/* The optimizer called `name`; INVALID_ARG listing the known names if none. */
fsdp_status fsdp_optim_find(const char *name, const fsdp_optim **out);

/* The known names joined by sep ("adamw|sgd"), for help texts; truncated
 * to fit n. Returns buf. */
const char *fsdp_optim_names(char *buf, size_t n, const char *sep);

/* ---- hyper-parameters -------------------------------------------------------- */

/* Index of o's hyper-parameter `name` in o->hparams (and hp->v), or -1. */
int fsdp_optim_hparam_index(const fsdp_optim *o, const char *name);

/* Set o's hyper-parameter `name` to value in hp and mark it given.
 * INVALID_ARG naming the ones o takes when it has none of that name. */
fsdp_status fsdp_optim_hparam_set(const fsdp_optim *o, fsdp_optim_hparams *hp, const char *name,
                                  float value);

/* *out = *in with o's defaults in the entries not given; every entry of o
 * is given in *out. out may be in. */
void fsdp_optim_hparams_resolve(const fsdp_optim *o, const fsdp_optim_hparams *in,
                                fsdp_optim_hparams *out);

/* Check a resolved block: each hyper-parameter within its declared range
 * ("<optimizer>: <name> X must be in [0, 1)"), the weight decay finite and
 * >= 0 ("<optimizer>: weight decay X must be finite and >= 0"), then o's
 * own check if it has one. INVALID_ARG with that message. */
fsdp_status fsdp_optim_hparams_check(const fsdp_optim *o, const fsdp_optim_hparams *hp);

/* The distinct hyper-parameter names of the registry, in registry order
 * (adamw's beta1, beta2, eps, then sgd's momentum...): each is a CLI flag
 * (--NAME) that the optimizers declaring it read. */
int fsdp_optim_flag_count(void);
const char *fsdp_optim_flag_at(int i);

/* The help of flag --NAME, from every optimizer that declares it: "<help>
 * of --optimizer <o>, in [0, 1) (default 0.9)", joined by "; ". Truncated
 * to fit n. Returns buf. */
const char *fsdp_optim_flag_help(const char *name, char *buf, size_t n);

/* Bytes of optimizer state per parameter (fp32 arrays). */
static inline size_t fsdp_optim_state_bytes(const fsdp_optim *o)
{
    return (size_t)o->n_state * sizeof(float);
}

/* Bytes a host step moves per element, for cost models: it reads the
 * parameter and the gradient, reads and writes each state array, and
 * writes the parameter (AdamW 28, SGD 20); a p_out copy adds its element
 * size. */
static inline size_t fsdp_optim_step_bytes(const fsdp_optim *o)
{
    return 3 * sizeof(float) + 2 * fsdp_optim_state_bytes(o);
}

/* The state names joined by sep ("adam_m, adam_v"); "none" without state. */
const char *fsdp_optim_state_list(const fsdp_optim *o, char *buf, size_t n, const char *sep);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPTIM_OPTIM_H */
