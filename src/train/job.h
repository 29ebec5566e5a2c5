/*
 * job.h - what the processes of a job agree on before the first step
 * (a job of several processes: comm/procs.h, one per node): a common
 * outcome of each step of the set-up, values decided by process 0, and
 * that a directory they write into together is one they all see.
 *
 * Main thread only, before the ranks start (the procs' exchange is then
 * the only caller). A job of one process (p NULL) agrees with itself.
 */
#ifndef FSDP_TRAIN_JOB_H
#define FSDP_TRAIN_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "comm/procs.h"

/* Every process's outcome of one step of the set-up (st, with this
 * thread's message): OK when all are OK, else on every process the first
 * failing process's status and message, naming the process and host. */
fsdp_status fsdp_job_agree(fsdp_procs *p, fsdp_world *w, fsdp_status st);

/* Process 0's `bytes` of buf, in every process. */
fsdp_status fsdp_job_from_process0(fsdp_procs *p, fsdp_world *w, void *buf, size_t bytes);

/* Whether every process sees directory `dir` (which exists) as process 0
 * does: process 0 leaves a file named after `token` in it, the others look
 * for it, process 0 removes it. INVALID_ARG on every process, naming the
 * first that does not see it and `what` ("--ckpt-dir"), otherwise. */
fsdp_status fsdp_job_dir_shared(fsdp_procs *p, fsdp_world *w, const char *dir, uint64_t token,
                                const char *what);

/* Longest value of a setting shown in messages (longer ones are cut, and
 * still compared whole). */
#define FSDP_JOB_SHOWN_MAX 160

/* A setting the processes of a job must give alike: its flag, what a
 * message shows of it and what is compared (key; NULL: the value shown, in
 * full). Both strings are the caller's. */
typedef struct fsdp_job_setting {
    const char *flag;  /* "--steps" */
    const char *shown; /* "600" */
    const char *key;   /* compared instead of shown when they differ in form */
} fsdp_job_setting;

/* Whether every process gave the same settings s[0..n) (every process
 * passes the same flags in the same order): OK, else INVALID_ARG on every
 * process naming each flag that differs with process 0's value and the
 * first other process's that differs, and their hosts. Collective over the
 * processes (one exchange). */
fsdp_status fsdp_job_same_settings(fsdp_procs *p, fsdp_world *w, const fsdp_job_setting *s,
                                   int n);

#endif /* FSDP_TRAIN_JOB_H */
