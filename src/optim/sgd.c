/*
 * sgd.c - SGD with momentum behind the optimizer interface, with PyTorch's
 * torch.optim.SGD semantics (dampening 0, no Nesterov): L2 weight decay
 * added to the gradient, buf = momentum * buf + g, p -= lr * buf. One state
 * array, "momentum" (zero before the first step, which makes the first
 * buffer the gradient itself, as PyTorch initialises it). The learning rate
 * is used as given: no per-step constants beyond it.
 */
#include "core/error.h"
#include "optim/optim.h"

static fsdp_status sgd_check(const fsdp_optim_hparams *hp)
{
    if (!(hp->momentum >= 0.0f && hp->momentum < 1.0f))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "sgd: momentum %g must be in [0, 1)",
                              (double)hp->momentum);
    return fsdp_optim_check_weight_decay("sgd", hp);
}

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
    FSDP_OP(ops, sgd, r->p, r->grad, r->state[0], r->n, c->lr, hp->momentum, r->wd,
            c->grad_scale, r->p_out, r->out_dt);
}

static void sgd_host_step(fsdp_cpu_isa isa, const fsdp_optim_hparams *hp,
                          const fsdp_optim_consts *c, const fsdp_optim_range *r)
{
    fsdp_sgd_cpu(isa, r->p, r->grad, r->state[0], r->n, c->lr, hp->momentum, r->wd,
                 c->grad_scale, r->p_out, r->out_dt);
}

const fsdp_optim fsdp_optim_sgd = {
    /* .name        = */ "sgd",
    /* .help        = */ "SGD with momentum (--momentum), L2 weight decay as PyTorch's SGD "
                         "(state: momentum; 4 bytes/param)",
    /* .uses        = */ FSDP_OPTIM_USES_MOMENTUM,
    /* .n_state     = */ 1,
    /* .state_names = */ {"momentum"},
    /* .check       = */ sgd_check,
    /* .consts      = */ sgd_consts,
    /* .device_step = */ sgd_device_step,
    /* .host_step   = */ sgd_host_step,
};
