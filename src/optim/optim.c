/*
 * optim.c - the registry of optimizers: one table, read by the CLI's
 * --optimizer parsing and help, by the engine and by the planner; and what
 * every optimizer's hyper-parameters share (defaults, range checks, the
 * CLI's flags and their help, all from the optimizers' declarations).
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

/* ---- hyper-parameters ------------------------------------------------------- */

int fsdp_optim_hparam_index(const fsdp_optim *o, const char *name)
{
    for (int i = 0; name && i < o->n_hparams; i++)
        if (!strcmp(o->hparams[i].name, name))
            return i;
    return -1;
}

static const char *hparam_name(const void *arg, int i)
{
    return ((const fsdp_optim *)arg)->hparams[i].name;
}

fsdp_status fsdp_optim_hparam_set(const fsdp_optim *o, fsdp_optim_hparams *hp, const char *name,
                                  float value)
{
    int i = fsdp_optim_hparam_index(o, name);
    if (i < 0) {
        char names[128];
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "optimizer %s has no hyper-parameter '%s' (it takes: %s)", o->name,
                              name ? name : "(null)",
                              o->n_hparams ? join(names, sizeof names, ", ", o->n_hparams,
                                                  hparam_name, o)
                                           : "none");
    }
    hp->v[i] = value;
    hp->given |= 1u << i;
    return FSDP_STATUS_OK;
}

void fsdp_optim_hparams_resolve(const fsdp_optim *o, const fsdp_optim_hparams *in,
                                fsdp_optim_hparams *out)
{
    *out = *in;
    for (int i = 0; i < o->n_hparams; i++)
        if (!(out->given >> i & 1u))
            out->v[i] = o->hparams[i].def;
    out->given = (1u << o->n_hparams) - 1u;
}

/* "in [0, 1)" or "> 0" (hi infinite: any finite value past lo). */
static const char *range_text(const fsdp_optim_hparam *h, char *buf, size_t n)
{
    if (isinf(h->hi))
        snprintf(buf, n, "%s %g", h->lo_open ? ">" : ">=", (double)h->lo);
    else
        snprintf(buf, n, "in %c%g, %g)", h->lo_open ? '(' : '[', (double)h->lo, (double)h->hi);
    return buf;
}

static bool in_range(const fsdp_optim_hparam *h, float x)
{
    return isfinite(x) && (h->lo_open ? x > h->lo : x >= h->lo) && (isinf(h->hi) || x < h->hi);
}

fsdp_status fsdp_optim_hparams_check(const fsdp_optim *o, const fsdp_optim_hparams *hp)
{
    for (int i = 0; i < o->n_hparams; i++) {
        const fsdp_optim_hparam *h = &o->hparams[i];
        char range[64];
        if (!in_range(h, hp->v[i]))
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s: %s %g must be %s%s", o->name,
                                  h->name, (double)hp->v[i], isinf(h->hi) ? "finite and " : "",
                                  range_text(h, range, sizeof range));
    }
    if (!(hp->weight_decay >= 0.0f) || !isfinite(hp->weight_decay))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s: weight decay %g must be finite and >= 0", o->name,
                              (double)hp->weight_decay);
    return o->check ? o->check(hp) : FSDP_STATUS_OK;
}

/* Whether hyper-parameter k of registry entry i is the first of its name
 * in the registry (entries before i, hyper-parameters before k). */
static bool first_of_name(int i, int k)
{
    const char *name = registry[i]->hparams[k].name;
    for (int j = 0; j <= i; j++) {
        int at = fsdp_optim_hparam_index(registry[j], name);
        if (at >= 0)
            return j == i && at == k;
    }
    return false;
}

/* The `want`-th distinct name (NULL past the last); *count: how many. */
static const char *flag_walk(int want, int *count)
{
    int n = 0;
    const char *found = NULL;
    for (int i = 0; i < N_OPTIM; i++)
        for (int k = 0; k < registry[i]->n_hparams; k++)
            if (first_of_name(i, k) && n++ == want)
                found = registry[i]->hparams[k].name;
    if (count)
        *count = n;
    return found;
}

int fsdp_optim_flag_count(void)
{
    int n;
    flag_walk(-1, &n);
    FSDP_ASSERT(n <= FSDP_OPTIM_MAX_FLAGS);
    return n;
}

const char *fsdp_optim_flag_at(int i) { return i >= 0 ? flag_walk(i, NULL) : NULL; }

const char *fsdp_optim_flag_help(const char *name, char *buf, size_t n)
{
    size_t at = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; i < N_OPTIM && at < n; i++) {
        int k = fsdp_optim_hparam_index(registry[i], name);
        if (k < 0)
            continue;
        const fsdp_optim_hparam *h = &registry[i]->hparams[k];
        char range[64];
        at += (size_t)snprintf(buf + at, n - at, "%s%s of --optimizer %s, %s (default %g)",
                               at ? "; " : "", h->help, registry[i]->name,
                               range_text(h, range, sizeof range), (double)h->def);
    }
    return buf;
}
