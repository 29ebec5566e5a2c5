/*
 * adamw.c - AdamW (decoupled weight decay, Loshchilov & Hutter) behind the
 * optimizer interface: state m and v ("adam_m", "adam_v": the names
 * checkpoints have always used), bias corrections 1 - beta^t per step, the
 * device step through the op table's adamw slot and the host step through
 * the vectorised kernels (both bit-identical to fsdp_adamw_ref). Its
 * hyper-parameters, beta1, beta2 and eps, are declared here (defaults 0.9,
 * 0.95, 1e-8) and reach the CLI as --beta1, --beta2 and --eps.
 */
#include <math.h>

#include "core/error.h"
#include "ops/optim_kernels.h"
#include "optim/optim.h"

/* hp->v[], in the order of the table below */
enum { BETA1, BETA2, EPS, N_HPARAMS };

static const fsdp_optim_hparam adamw_hparams[N_HPARAMS] = {
    [BETA1] = {"beta1", 0.9f, 0.0f, 1.0f, false, "first-moment decay"},
    [BETA2] = {"beta2", 0.95f, 0.0f, 1.0f, false, "second-moment decay"},
    [EPS] = {"eps", 1e-8f, 0.0f, INFINITY, true, "denominator epsilon"},
};

/* k[0] = 1 - beta1^t, k[1] = 1 - beta2^t, in double, rounded once. */
static fsdp_status adamw_consts(const fsdp_optim_hparams *hp, uint64_t t, float lr,
                                float grad_scale, fsdp_optim_consts *out)
{
    if (t < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "adamw: step count t is %llu; the first step is t = 1 (its bias "
                              "corrections 1 - beta^t must be > 0)", (unsigned long long)t);
    out->lr = lr;
    out->grad_scale = grad_scale;
    out->k[0] = (float)(1.0 - pow((double)hp->v[BETA1], (double)t));
    out->k[1] = (float)(1.0 - pow((double)hp->v[BETA2], (double)t));
    return FSDP_STATUS_OK;
}

static void adamw_device_step(fsdp_op_ctx *ops, const fsdp_optim_hparams *hp,
                              const fsdp_optim_consts *c, const fsdp_optim_range *r)
{
    FSDP_OP(ops, adamw, r->p, r->grad, r->state[0], r->state[1], r->n, c->lr, hp->v[BETA1],
            hp->v[BETA2], hp->v[EPS], r->wd, c->k[0], c->k[1], c->grad_scale, r->p_out,
            r->out_dt);
}

static void adamw_host_step(fsdp_cpu_isa isa, const fsdp_optim_hparams *hp,
                            const fsdp_optim_consts *c, const fsdp_optim_range *r)
{
    fsdp_adamw_cpu(isa, r->p, r->grad, r->state[0], r->state[1], r->n, c->lr, hp->v[BETA1],
                   hp->v[BETA2], hp->v[EPS], r->wd, c->k[0], c->k[1], c->grad_scale, r->p_out,
                   r->out_dt);
}

const fsdp_optim fsdp_optim_adamw = {
    /* .name        = */ "adamw",
    /* .help        = */ "AdamW, decoupled weight decay (state: adam_m, adam_v; 8 bytes/param)",
    /* .n_hparams   = */ N_HPARAMS,
    /* .hparams     = */ adamw_hparams,
    /* .n_state     = */ 2,
    /* .state_names = */ {"adam_m", "adam_v"},
    /* .check       = */ NULL, /* the ranges say it all */
    /* .consts      = */ adamw_consts,
    /* .device_step = */ adamw_device_step,
    /* .host_step   = */ adamw_host_step,
};
