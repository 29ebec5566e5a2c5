/*
 * sgd.c - SGD with momentum behind the optimizer interface, with PyTorch's
 * torch.optim.SGD semantics (dampening 0, no Nesterov): L2 weight decay
 * added to the gradient, buf = momentum * buf + g, p -= lr * buf. One state
 * array, "momentum" (zero before the first step, which makes the first
 * buffer the gradient itself, as PyTorch initialises it). The learning rate
 * is used as given: no per-step constants beyond it. Its hyper-parameter,
 * momentum (default 0.9), is declared here and reaches the CLI as
 * --momentum.
 */
#include "core/error.h"
#include "ops/optim_kernels.h"
#include "optim/optim.h"

/* hp->v[], in the order of the table below */
enum { MOMENTUM, N_HPARAMS };

static const fsdp_optim_hparam sgd_hparams[N_HPARAMS] = {
    [MOMENTUM] = {"momentum", 0.9f, 0.0f, 1.0f, false, "momentum"},
};

static fsdp_status sgd_consts(const fsdp_optim_hparams *hp, uint64_t t, float lr, float grad_scale,
                              fsdp_optim_consts *out)
{
    (void)hp;
    if (t < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "sgd: step count t is %llu; the first step is t = 1",
                              (unsigned long long)t);
    *out = (fsdp_optim_consts){.lr = lr, .grad_scale = grad_scale};
    return FSDP_STATUS_OK;
}

static void sgd_device_step(fsdp_op_ctx *ops, const fsdp_optim_hparams *hp,
                            const fsdp_optim_consts *c, const fsdp_optim_range *r)
{
    FSDP_OP(ops, sgd, r->p, r->grad, r->state[0], r->n, c->lr, hp->v[MOMENTUM], r->wd,
            c->grad_scale, r->p_out, r->out_dt);
}

static void sgd_host_step(fsdp_cpu_isa isa, const fsdp_optim_hparams *hp,
                          const fsdp_optim_consts *c, const fsdp_optim_range *r)
{
    fsdp_sgd_cpu(isa, r->p, r->grad, r->state[0], r->n, c->lr, hp->v[MOMENTUM], r->wd,
                 c->grad_scale, r->p_out, r->out_dt);
}

const fsdp_optim fsdp_optim_sgd = {
    /* .name        = */ "sgd",
    /* .help        = */ "SGD with momentum (--momentum), L2 weight decay as PyTorch's SGD "
                         "(state: momentum; 4 bytes/param)",
    /* .n_hparams   = */ N_HPARAMS,
    /* .hparams     = */ sgd_hparams,
    /* .n_state     = */ 1,
    /* .state_names = */ {"momentum"},
    /* .check       = */ NULL, /* the range says it all */
    /* .consts      = */ sgd_consts,
    /* .device_step = */ sgd_device_step,
    /* .host_step   = */ sgd_host_step,
};
