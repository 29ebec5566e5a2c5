/*
 * procs.c - the one place that decides how a job's processes meet
 * (procs.h) and the world they share. The waits on other processes are
 * the implementations' (procs_wait.c).
 *
 * Which launcher started us is read from the variables it exports
 * (launcher_vars below), not from fsdp's own settings: mpirun sets them in
 * every process it starts, so `mpirun -np 2 fsdp train` needs no flag.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/procs.h"
#include "core/log.h"

static const fsdp_name kind_names[] = {
    {"auto", FSDP_PROCS_AUTO,
     "mpi when started by mpirun, dir when FSDP_RDV_DIR is set, else one process"},
    {"single", FSDP_PROCS_SINGLE, "one process: every rank is a thread of it"},
    {"mpi", FSDP_PROCS_MPI, "processes started by mpirun (Open MPI) meet through MPI"},
    {"dir", FSDP_PROCS_DIR,
     "processes meet through files in a shared directory (NCCL's id; no collective data)"},
};
const fsdp_name_table fsdp_procs_kind_names = FSDP_NAME_TABLE(kind_names);

/* Variables an MPI launcher exports to the processes it starts: Open MPI's
 * mpirun, PMI (MPICH, Slurm's srun --mpi=pmi2) and PMIx. */
static const char *const launcher_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};

int fsdp_procs_launched_size(void)
{
    for (size_t i = 0; i < 2; i++) { /* the variables that hold the job's size */
        const char *v = getenv(launcher_vars[i]);
        if (v && atoi(v) > 0)
            return atoi(v);
    }
    return 1;
}

bool fsdp_procs_mpi_launched(void)
{
    for (size_t i = 0; i < sizeof launcher_vars / sizeof launcher_vars[0]; i++)
        if (getenv(launcher_vars[i]))
            return true;
    return false;
}

/* A non-negative number from setting `key` into *out; "" leaves *out. */
static fsdp_status env_number(fsdp_env_key key, const char *name, double max, double *out)
{
    const char *v = fsdp_env_get(key);
    if (!*v)
        return FSDP_STATUS_OK;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= 0) || x > max)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s='%s': expected a number in 0..%g",
                              name, v, max);
    *out = x;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_procs_opts_env(fsdp_procs_opts *o)
{
    memset(o, 0, sizeof *o);
    o->kind = FSDP_PROCS_AUTO;
    o->process = -1;
    o->n_processes = -1;
    const char *dir = fsdp_env_get(FSDP_ENV_RDV_DIR);
    o->dir = *dir ? dir : NULL;
    double proc = -1, n_proc = -1;
    FSDP_TRY(env_number(FSDP_ENV_PROCESS, "FSDP_PROCESS", FSDP_MAX_RANKS - 1, &proc));
    FSDP_TRY(env_number(FSDP_ENV_N_PROCESSES, "FSDP_N_PROCESSES", FSDP_MAX_RANKS, &n_proc));
    if ((proc >= 0 && proc != (int)proc) || (n_proc >= 0 && n_proc != (int)n_proc))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "FSDP_PROCESS and FSDP_N_PROCESSES must be whole numbers");
    o->process = (int)proc;
    o->n_processes = (int)n_proc;
    o->timeout_s = 600;
    o->abort_grace_s = 10;
    FSDP_TRY(env_number(FSDP_ENV_PEER_TIMEOUT, "FSDP_PEER_TIMEOUT", 1e9, &o->timeout_s));
    FSDP_TRY(env_number(FSDP_ENV_ABORT_GRACE, "FSDP_ABORT_GRACE", 1e6, &o->abort_grace_s));
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_procs_init(fsdp_procs **out, const fsdp_procs_opts *opts)
{
    *out = NULL;
    fsdp_procs_opts o;
    if (opts)
        o = *opts;
    else
        FSDP_TRY(fsdp_procs_opts_env(&o));
    if (o.kind == FSDP_PROCS_AUTO)
        o.kind = fsdp_procs_mpi_launched() ? FSDP_PROCS_MPI
                 : o.dir                   ? FSDP_PROCS_DIR
                                           : FSDP_PROCS_SINGLE;
    switch (o.kind) {
    case FSDP_PROCS_SINGLE:
        return FSDP_STATUS_OK;
    case FSDP_PROCS_MPI:
        if (o.dir)
            FSDP_WARN(FSDP_SUB_COMM, "started by an MPI launcher: FSDP_RDV_DIR=%s is not used",
                      o.dir);
        return fsdp_procs_mpi_init(out, &o);
    case FSDP_PROCS_DIR:
        if (!o.dir || !*o.dir || o.n_processes < 1 || o.process < 0 ||
            o.process >= o.n_processes)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "processes meeting in a directory need FSDP_RDV_DIR (a "
                                  "directory every process sees), FSDP_N_PROCESSES (the job's "
                                  "processes) and FSDP_PROCESS (0..FSDP_N_PROCESSES-1, different "
                                  "in each); got dir '%s', process %d of %d",
                                  o.dir ? o.dir : "", o.process, o.n_processes);
        return fsdp_procs_dir_init(out, &o);
    default:
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "unknown kind of processes %d",
                              (int)o.kind);
    }
}

/* ---- the world ---------------------------------------------------------------- */

static void span_fail(void *ctx, fsdp_world *w, int rank, fsdp_status st, const char *msg)
{
    fsdp_procs *p = ctx;
    p->iface->fail(p, w, rank, st, msg);
}

static void span_detach(void *ctx, fsdp_world *w)
{
    fsdp_procs *p = ctx;
    if (p->iface->detach)
        p->iface->detach(p, w);
}

/* What each process tells the others about itself. */
struct world_rec {
    int n_local;
    int process;
    char host[FSDP_HOST_MAX];
};

fsdp_status fsdp_procs_world_init(fsdp_world **out, fsdp_procs *p, int n_local)
{
    *out = NULL;
    if (!p)
        return fsdp_world_init(out, n_local);
    fsdp_status st = FSDP_STATUS_OK;
    int n = p->n_processes;
    struct world_rec me = {.n_local = n_local, .process = p->process}, *all = NULL;
    const char **hosts = NULL;
    snprintf(me.host, sizeof me.host, "%s", p->host);
    all = calloc((size_t)n, sizeof *all);
    hosts = calloc((size_t)n, sizeof *hosts);
    if (!all || !hosts) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory meeting %d processes", n);
        goto fail;
    }
    FSDP_CHECK(p->iface->exchange(p, NULL, &me, sizeof me, all));
    for (int q = 0; q < n; q++) {
        all[q].host[FSDP_HOST_MAX - 1] = '\0';
        hosts[q] = all[q].host;
        if (all[q].process != q) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL,
                                "process %d: the record exchanged as process %d's says %d",
                                p->process, q, all[q].process);
            goto fail;
        }
        if (all[q].n_local != n_local) {
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "process %d (host %s) runs %d rank(s) but process %d (host %s) "
                                "runs %d: give every process the same --devices",
                                p->process, p->host, n_local, q, all[q].host, all[q].n_local);
            goto fail;
        }
    }
    fsdp_world_span span = {
        .process = p->process,
        .n_processes = n,
        .hosts = hosts,
        .fail = span_fail,
        .detach = span_detach,
        .ctx = p,
    };
    st = fsdp_world_init_span(out, n_local, &span);
    if (st == FSDP_STATUS_OK && p->iface->attach)
        p->iface->attach(p, *out);
fail:
    free(all);
    free(hosts);
    return st;
}

fsdp_status fsdp_procs_fini(fsdp_procs *p, fsdp_status st)
{
    if (!p)
        return FSDP_STATUS_OK;
    return p->iface->fini(p, st);
}
