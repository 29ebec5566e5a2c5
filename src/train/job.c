/*
 * job.c - the processes of a job agreeing before the first step (job.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
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

/* ---- settings every process must give alike --------------------------------------- */

/* What a process tells the others of one setting. */
struct setting_rec {
    char flag[32];
    char shown[FSDP_JOB_SHOWN_MAX];
    uint64_t key; /* FNV-1a of the compared text */
};

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void setting_rec_fill(struct setting_rec *r, const fsdp_job_setting *s)
{
    snprintf(r->flag, sizeof r->flag, "%s", s->flag);
    size_t len = strlen(s->shown);
    if (len < sizeof r->shown)
        memcpy(r->shown, s->shown, len + 1);
    else
        snprintf(r->shown, sizeof r->shown, "%.*s...", (int)sizeof r->shown - 4, s->shown);
    r->key = fnv1a(s->key ? s->key : s->shown);
}

fsdp_status fsdp_job_same_settings(fsdp_procs *p, fsdp_world *w, const fsdp_job_setting *s,
                                   int n)
{
    if (!p || p->n_processes == 1 || n < 1)
        return FSDP_STATUS_OK;
    int P = p->n_processes;
    size_t bytes = (size_t)n * sizeof(struct setting_rec);
    struct setting_rec *all = calloc((size_t)P + 1, bytes), *mine;
    if (!all)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    mine = all + (size_t)P * n;
    for (int i = 0; i < n; i++)
        setting_rec_fill(&mine[i], &s[i]);
    fsdp_status st = p->iface->exchange(p, w, mine, bytes, all);
    fsdp_sbuf diff = {0};
    for (int i = 0; st == FSDP_STATUS_OK && i < n; i++) {
        const struct setting_rec *a = &all[i];
        for (int q = 1; q < P; q++) {
            const struct setting_rec *b = &all[(size_t)q * n + i];
            if (strncmp(a->flag, b->flag, sizeof a->flag)) {
                st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                    "process %d (host %s) lists its settings differently from "
                                    "process 0 (host %s): run the same fsdp build in every "
                                    "process", q, w->hosts[q], w->hosts[0]);
                break;
            }
            if (a->key == b->key)
                continue;
            fsdp_sbuf_printf(&diff, "%s%.32s: process 0 (host %s) has '%.*s', process %d (host "
                             "%s) has '%.*s'", diff.n ? "; " : "", a->flag, w->hosts[0],
                             (int)sizeof a->shown, a->shown, q, w->hosts[q],
                             (int)sizeof b->shown, b->shown);
            break;
        }
    }
    if (st == FSDP_STATUS_OK && diff.oom)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
    else if (st == FSDP_STATUS_OK && diff.n)
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                            "the job's processes were given different settings, which would "
                            "make their ranks compute different things or issue different "
                            "collectives: %s; give every process the same values (one command "
                            "line for every process)", diff.p);
    free(diff.p);
    free(all);
    return st;
}
