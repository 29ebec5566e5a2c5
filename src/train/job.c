/*
 * job.c - the processes of a job agreeing before the first step (job.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/world.h"
#include "train/job.h"

fsdp_status fsdp_job_agree(fsdp_procs *p, fsdp_world *w, fsdp_status st)
{
    if (!p || p->n_processes == 1)
        return st;
    struct rec {
        int32_t st;
        char msg[FSDP_ERROR_MSG_MAX];
    } *all = calloc((size_t)p->n_processes + 1, sizeof *all), *mine;
    if (!all)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    mine = all + p->n_processes;
    mine->st = (int32_t)st;
    if (st != FSDP_STATUS_OK)
        snprintf(mine->msg, sizeof mine->msg, "%s", fsdp_error_msg());
    fsdp_status xst = p->iface->exchange(p, w, mine, sizeof *mine, all);
    for (int q = 0; xst == FSDP_STATUS_OK && q < p->n_processes; q++) {
        if (all[q].st == FSDP_STATUS_OK)
            continue;
        all[q].msg[sizeof all[q].msg - 1] = '\0';
        xst = q == p->process ? st
                              : fsdp_error_set((fsdp_status)all[q].st, "process %d (host %s): %s",
                                               q, w->hosts[q], all[q].msg);
    }
    free(all);
    return xst;
}

fsdp_status fsdp_job_from_process0(fsdp_procs *p, fsdp_world *w, void *buf, size_t bytes)
{
    if (!p || p->n_processes == 1)
        return FSDP_STATUS_OK;
    unsigned char *all = malloc((size_t)p->n_processes * bytes + 1);
    if (!all)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    fsdp_status st = p->iface->exchange(p, w, buf, bytes, all);
    if (st == FSDP_STATUS_OK)
        memcpy(buf, all, bytes);
    free(all);
    return st;
}

fsdp_status fsdp_job_dir_shared(fsdp_procs *p, fsdp_world *w, const char *dir, uint64_t token,
                                const char *what)
{
    if (!p || p->n_processes == 1)
        return FSDP_STATUS_OK;
    char probe[4096 + 64], want[64], got[64] = "";
    snprintf(want, sizeof want, "fsdp job %016llx\n", (unsigned long long)token);
    snprintf(probe, sizeof probe, "%s/.fsdp_shared_%016llx", dir, (unsigned long long)token);
    fsdp_status st = FSDP_STATUS_OK;
    if (w->process == 0) {
        FILE *f = fopen(probe, "w");
        if (!f || fputs(want, f) == EOF || fclose(f) != 0)
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot write '%s' in %s", probe, what);
    }
    FSDP_TRY(fsdp_job_agree(p, w, st));
    if (w->process != 0) {
        FILE *f = fopen(probe, "r");
        if (f) {
            if (!fgets(got, sizeof got, f))
                got[0] = '\0';
            fclose(f);
        }
        if (strcmp(got, want))
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "%s '%s' is not one directory shared by the job's processes: "
                                "process %d (host %s) does not see the file process 0 (host %s) "
                                "wrote in it (%s); every process writes its ranks' files there, "
                                "so give a directory on a file system every node mounts (NFS, "
                                "Lustre, ...)",
                                what, dir, w->process, w->hosts[w->process], w->hosts[0], probe);
    }
    st = fsdp_job_agree(p, w, st);
    if (w->process == 0)
        remove(probe);
    return st;
}
