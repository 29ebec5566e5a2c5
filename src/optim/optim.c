/*
 * optim.c - the registry of optimizers: one table, read by the CLI's
 * --optimizer parsing and help, by the engine and by the planner.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "optim/optim.h"

/* Entry 0 is the default. */
static const fsdp_optim *const registry[] = {
    &fsdp_optim_adamw,
    &fsdp_optim_sgd,
};
#define N_OPTIM ((int)(sizeof registry / sizeof registry[0]))

int fsdp_optim_count(void) { return N_OPTIM; }

const fsdp_optim *fsdp_optim_at(int i) { return i >= 0 && i < N_OPTIM ? registry[i] : NULL; }

const fsdp_optim *fsdp_optim_or_default(const fsdp_optim *o) { return o ? o : registry[0]; }

static const char *join(char *buf, size_t n, const char *sep, int count,
                        const char *(*item)(const void *, int), const void *arg)
{
    size_t at = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; i < count && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", i ? sep : "", item(arg, i));
    return buf;
}

static const char *registry_name(const void *arg, int i)
{
    (void)arg;
    return registry[i]->name;
}

static const char *state_name(const void *arg, int i)
{
    return ((const fsdp_optim *)arg)->state_names[i];
}

const char *fsdp_optim_names(char *buf, size_t n, const char *sep)
{
    return join(buf, n, sep, N_OPTIM, registry_name, NULL);
}

const char *fsdp_optim_state_list(const fsdp_optim *o, char *buf, size_t n, const char *sep)
{
    if (o->n_state == 0) {
        snprintf(buf, n, "none");
        return buf;
    }
    return join(buf, n, sep, o->n_state, state_name, o);
}

fsdp_status fsdp_optim_find(const char *name, const fsdp_optim **out)
{
    for (int i = 0; i < N_OPTIM; i++)
        if (name && !strcmp(name, registry[i]->name)) {
            *out = registry[i];
            return FSDP_STATUS_OK;
        }
    char names[128];
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown optimizer '%s' (expected %s)",
                          name ? name : "(null)", fsdp_optim_names(names, sizeof names, ", "));
}

fsdp_status fsdp_optim_check_weight_decay(const char *name, const fsdp_optim_hparams *hp)
{
    if (!(hp->weight_decay >= 0.0f) || !isfinite(hp->weight_decay))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s: weight decay %g must be finite and >= 0",
                              name, (double)hp->weight_decay);
    return FSDP_STATUS_OK;
}
