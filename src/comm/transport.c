/*
 * transport.c - the transport table and the one function that picks from
 * it (transport.h).
 *
 * Row order is the order AUTO prefers: host for cpu, then mpi for cpu ranks
 * in several processes, meta for meta, nccl for cuda (in one process or
 * several), then peer for cuda when ranks share a GPU (NCCL refuses two
 * ranks on one GPU), or when the build has no NCCL.
 */
#include <stdio.h>
#include <string.h>

#include "comm/cuda_comm.h"
#include "comm/mpi_coll.h"
#include "comm/transport.h"
#include "core/world.h"

static const fsdp_name kind_names[] = {
    {"auto", FSDP_COMM_AUTO,
     "host on cpu (mpi across processes), meta on meta; on cuda nccl, or peer with "
     "--ranks-per-device > 1 or in a build without NCCL"},
    {"host", FSDP_COMM_HOST, "shared memory among the rank threads (--backend cpu)"},
    {"mpi", FSDP_COMM_MPI,
     "ranks in several processes started by mpirun: shared memory inside a process, MPI "
     "between, sums in the same order as host (--backend cpu)"},
    {"meta", FSDP_COMM_META, "counts bytes, moves nothing (--backend meta)"},
    {"nccl", FSDP_COMM_NCCL,
     "NCCL among the GPUs of every process of the job, one rank per GPU (--backend cuda)"},
    {"peer", FSDP_COMM_PEER,
     "device-to-device copies between the ranks' buffers; several ranks may share a GPU "
     "(--backend cuda)"},
};
const fsdp_name_table fsdp_comm_kind_names = FSDP_NAME_TABLE(kind_names);

const char *fsdp_comm_kind_name(fsdp_comm_kind k)
{
    return fsdp_names_name(&fsdp_comm_kind_names, (int)k);
}

#define SERVES(b) FSDP_NAME_BIT(FSDP_BACKEND_##b)

static const fsdp_transport transports[] = {
    /* kind          serves        share  span   needs  init */
    {FSDP_COMM_HOST, SERVES(CPU), false, false, false, fsdp_comm_host_init_group},
    {FSDP_COMM_MPI, SERVES(CPU), false, true, true, fsdp_comm_mpi_init_group},
    {FSDP_COMM_META, SERVES(META), false, false, false, fsdp_comm_meta_init_group},
    {FSDP_COMM_NCCL, SERVES(CUDA), false, true, false, fsdp_comm_nccl_init_group},
    {FSDP_COMM_PEER, SERVES(CUDA), true, false, false, fsdp_comm_peer_init_group},
};
enum { N_TRANSPORTS = (int)(sizeof transports / sizeof transports[0]) };

/* Transports this build has only as a stub (their init fails at once and
 * says what to rebuild), by kind, with why; NULL: built in. AUTO passes
 * over them; named, they fail at init with the stub's message. */
static const char *const stub_only[FSDP_COMM_KIND_COUNT] = {
#ifndef FSDP_NCCL
    [FSDP_COMM_NCCL] = "this build has no NCCL (built with CUDA=0 or NCCL=0; rebuild with "
                       "NCCL_HOME or NCCL_LIB pointing at NCCL)",
#endif
};

/* What a row lacks for a request (first failing property), or FIT. */
enum misfit { FIT = 0, MISFIT_BACKEND, MISFIT_SHARE, MISFIT_SPAN, MISFIT_ALONE };

static enum misfit misfit(const fsdp_transport *t, const fsdp_transport_req *req)
{
    if (!(t->backends & FSDP_NAME_BIT(req->backend)))
        return MISFIT_BACKEND;
    if (req->ranks_per_device > 1 && !t->shares_device)
        return MISFIT_SHARE;
    if (req->n_processes > 1 && !t->spans_processes)
        return MISFIT_SPAN;
    if (req->n_processes <= 1 && t->needs_processes)
        return MISFIT_ALONE;
    return FIT;
}

/* Which rows have the property a `why` misfit lacks, whatever their
 * backend: "peer on --backend cuda does"; "none does in this build". */
static char *rows_having(enum misfit why, char *buf, size_t n)
{
    size_t len = 0;
    int k = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_TRANSPORTS && len < n; i++) {
        const fsdp_transport *t = &transports[i];
        if ((why == MISFIT_SHARE && !t->shares_device) ||
            (why == MISFIT_SPAN && !t->spans_processes))
            continue;
        char b[64];
        int w = snprintf(buf + len, n - len, "%s%s on --backend %s", k ? "; " : "",
                         fsdp_comm_kind_name(t->kind),
                         fsdp_names_join(&fsdp_backend_names, t->backends, ", ", " or ", b,
                                         sizeof b));
        len += w > 0 ? (size_t)w : 0;
        k++;
    }
    if (k == 0)
        snprintf(buf, n, "none does in this build");
    else if (len < n)
        snprintf(buf + len, n - len, " %s", k == 1 ? "does" : "do");
    return buf;
}

/* Whether AUTO may take the row for req: it fits and is built in. */
static bool fits(const fsdp_transport *t, const fsdp_transport_req *req)
{
    return misfit(t, req) == FIT && !stub_only[t->kind];
}

/* Why no row fits req (called only when none does). */
static fsdp_status no_fit(const fsdp_transport_req *req, const char *head)
{
    enum misfit worst = FIT;
    for (int i = 0; i < N_TRANSPORTS; i++) {
        enum misfit why = misfit(&transports[i], req);
        if (why == FIT) /* it would, but this build has only its stub */
            return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                                  "%s--comm %s would serve --backend %s here, but %s",
                                  head, fsdp_comm_kind_name(transports[i].kind),
                                  fsdp_backend_name(req->backend), stub_only[transports[i].kind]);
        if (why > worst)
            worst = why;
    }
    const char *b = fsdp_backend_name(req->backend);
    char have[256];
    switch (worst) {
    case MISFIT_SHARE:
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%sno transport on --backend %s lets ranks share a device "
                              "(--ranks-per-device %d); %s",
                              head, b, req->ranks_per_device,
                              rows_having(worst, have, sizeof have));
    case MISFIT_SPAN:
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%sno transport on --backend %s connects ranks in several "
                              "processes (%d); %s",
                              head, b, req->n_processes, rows_having(worst, have, sizeof have));
    default:
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "%sno transport serves --backend %s", head,
                              b);
    }
}

fsdp_status fsdp_transport_pick(const fsdp_transport_req *req, const fsdp_transport **out)
{
    *out = NULL;
    if ((unsigned)req->backend >= FSDP_BACKEND_COUNT)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "backend %d is not one of this build's",
                              (int)req->backend);
    if (!fsdp_names_of(&fsdp_comm_kind_names, (int)req->kind))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "transport %d is not one of this build's",
                              (int)req->kind);
    const fsdp_transport *first_fit = NULL, *named = NULL;
    for (int i = 0; i < N_TRANSPORTS; i++) {
        if (!first_fit && fits(&transports[i], req))
            first_fit = &transports[i];
        if (transports[i].kind == req->kind)
            named = &transports[i];
    }
    if (req->kind == FSDP_COMM_AUTO) {
        if (!first_fit)
            return no_fit(req, "");
        *out = first_fit;
        return FSDP_STATUS_OK;
    }
    if (!named)
        return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "--comm %s is not built in",
                              fsdp_comm_kind_name(req->kind));
    enum misfit why = misfit(named, req);
    if (why == FIT) {
        *out = named;
        return FSDP_STATUS_OK;
    }
    char head[192], fit[128];
    const char *k = fsdp_comm_kind_name(req->kind);
    switch (why) {
    case MISFIT_BACKEND:
        snprintf(head, sizeof head, "--comm %s does not run on --backend %s", k,
                 fsdp_backend_name(req->backend));
        break;
    case MISFIT_SHARE:
        snprintf(head, sizeof head, "--comm %s cannot put %d ranks on one device", k,
                 req->ranks_per_device);
        break;
    case MISFIT_ALONE:
        snprintf(head, sizeof head, "--comm %s connects ranks in several processes (started by "
                 "mpirun); this job on --backend %s is one process", k,
                 fsdp_backend_name(req->backend));
        break;
    default:
        snprintf(head, sizeof head, "--comm %s cannot connect ranks in %d processes", k,
                 req->n_processes);
        break;
    }
    if (!first_fit) {
        strncat(head, ": ", sizeof head - strlen(head) - 1);
        return no_fit(req, head);
    }
    unsigned mask = 0;
    for (int i = 0; i < N_TRANSPORTS; i++)
        if (fits(&transports[i], req))
            mask |= FSDP_NAME_BIT(transports[i].kind);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s: use --comm %s or auto", head,
                          fsdp_names_join(&fsdp_comm_kind_names, mask, ", ", " or ", fit,
                                          sizeof fit));
}

fsdp_status fsdp_comm_init_group(fsdp_comm *c, const fsdp_transport_req *req, fsdp_world *w,
                                 fsdp_device *dev, const fsdp_comm_group *g, int rank)
{
    const fsdp_transport *t;
    if (dev && dev->backend != req->backend)
        return fsdp_error_set(FSDP_STATUS_INTERNAL,
                              "rank %d: transport asked for --backend %s on a %s device", rank,
                              fsdp_backend_name(req->backend), fsdp_backend_name(dev->backend));
    FSDP_TRY(fsdp_transport_pick(req, &t));
    return t->init(c, w, dev, g, rank);
}

fsdp_status fsdp_comm_init(fsdp_comm *c, const fsdp_transport_req *req, fsdp_world *w,
                           fsdp_device *dev, int rank)
{
    fsdp_comm_group g = fsdp_comm_group_all(w ? w->n_ranks : 0);
    return fsdp_comm_init_group(c, req, w, dev, &g, rank);
}
