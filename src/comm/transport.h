/*
 * transport.h - the one place that picks the collectives' implementation
 * (the "transport") for a run, NCCL's ncclTransports[] in spirit.
 *
 * A table (transport.c) lists every transport: its kind, the backends it
 * serves, whether several ranks may share one device, whether its ranks may
 * live in several processes, and its per-rank init. fsdp_transport_pick
 * chooses from it for a request (backend, --comm, ranks per device, number
 * of processes); the CLI calls it to refuse a bad combination as a usage
 * error, and the engine calls fsdp_comm_init, which picks the same way and
 * initialises. Nothing else switches on which transports exist.
 *
 * Adding a transport = one enum value, one name entry and one row of the
 * table. Across processes (the request's n_processes > 1): `mpi` for cpu
 * ranks, `nccl` for GPUs (its communicator spans the job's processes).
 */
#ifndef FSDP_COMM_TRANSPORT_H
#define FSDP_COMM_TRANSPORT_H

#include <stdbool.h>

#include "comm/comm.h"
#include "core/names.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_comm_kind {
    FSDP_COMM_AUTO = 0, /* the first transport in the table that fits the request */
    FSDP_COMM_HOST,     /* cpu: shared memory among the rank threads (comm/host.c) */
    FSDP_COMM_META,     /* meta: counts bytes, moves nothing (comm/comm.c) */
    FSDP_COMM_NCCL,     /* cuda: NCCL, one rank per GPU (comm/nccl.cu) */
    FSDP_COMM_PEER,     /* cuda: device-to-device copies, ranks may share a GPU (comm/peer.cu) */
    FSDP_COMM_MPI,      /* cpu: host collectives in a process, MPI between (comm/mpi_coll.c) */
    FSDP_COMM_KIND_COUNT
} fsdp_comm_kind;

/* The --comm values: auto and every transport, with their help lines. */
extern const fsdp_name_table fsdp_comm_kind_names;

/* "auto", "host", ...; "?" for other values. */
const char *fsdp_comm_kind_name(fsdp_comm_kind k);

typedef struct fsdp_transport {
    fsdp_comm_kind kind;
    unsigned backends;     /* FSDP_NAME_BIT(backend) for each backend it serves */
    bool shares_device;    /* several ranks may share one device (ranks_per_device > 1) */
    bool spans_processes;  /* its ranks may live in several processes */
    bool needs_processes;  /* only for jobs of several processes (its own use) */
    /* Per-rank init on the rank's thread, after fsdp_device_init, over the
     * group g (comm.h) that holds global `rank`; all its members call it
     * before the group's first collective. */
    fsdp_status (*init)(fsdp_comm *c, fsdp_world *w, fsdp_device *dev, const fsdp_comm_group *g,
                        int rank);
} fsdp_transport;

/* What a run asks of its transport. */
typedef struct fsdp_transport_req {
    fsdp_backend backend;
    fsdp_comm_kind kind;      /* FSDP_COMM_AUTO: let the table choose */
    int ranks_per_device;     /* <= 1: one rank per device */
    int n_processes;          /* <= 1: every rank in this process (world->n_processes) */
} fsdp_transport_req;

/* The transport for req: the one named, if it serves req->backend with that
 * many ranks per device and processes; for AUTO the first row of the table
 * that does. Otherwise INVALID_ARG with a message naming the transports
 * that would fit ("--comm meta does not run on --backend cpu: use --comm
 * host or auto"). Pure: callable from any thread, before anything exists. */
fsdp_status fsdp_transport_pick(const fsdp_transport_req *req, const fsdp_transport **out);

/* Pick the transport for req (req->backend must be dev->backend) and
 * initialise c with it on the rank's thread. All ranks of w call it with
 * the same request. */
fsdp_status fsdp_comm_init(fsdp_comm *c, const fsdp_transport_req *req, fsdp_world *w,
                           fsdp_device *dev, int rank);
/* The same over group g (comm.h) holding global `rank`: the transport req
 * picks for the job, over the group's ranks (a group inside one process
 * gets that transport's in-process form: mpi's is host). Every transport
 * forms groups (hybrid sharding's); every member calls it. */
fsdp_status fsdp_comm_init_group(fsdp_comm *c, const fsdp_transport_req *req, fsdp_world *w,
                                 fsdp_device *dev, const fsdp_comm_group *g, int rank);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_COMM_TRANSPORT_H */
