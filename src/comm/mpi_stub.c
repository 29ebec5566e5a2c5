/*
 * mpi_stub.c - the `mpi` processes of a build without MPI (MPI=0, or no
 * Open MPI found at build time): it exists so callers link. A process
 * started alone by mpirun (-np 1) runs as a job of one process; more is an
 * error saying how to get a build that can.
 */
#include <stdlib.h>

#include "comm/procs.h"

const bool fsdp_procs_mpi_built = false;

fsdp_status fsdp_procs_mpi_init(fsdp_procs **out, const fsdp_procs_opts *o)
{
    (void)o;
    *out = NULL;
    static const char *const size_vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof size_vars / sizeof size_vars[0]; i++) {
        const char *v = getenv(size_vars[i]);
        if (v && atoi(v) == 1)
            return FSDP_STATUS_OK;
    }
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED,
                          "started by an MPI launcher, but this fsdp was built without MPI "
                          "(MPI=0, or Open MPI was not found): install it (tools/install-deps.sh: "
                          "libopenmpi-dev, openmpi-bin) and rebuild, or start each process with "
                          "FSDP_RDV_DIR, FSDP_PROCESS and FSDP_N_PROCESSES (--backend cuda)");
}
