/*
 * test_mpi_procs.c - jobs of real processes: the rendezvous directory
 * (processes forked here, no MPI) and Open MPI (jobs started with mpirun
 * on loopback, 2 processes x 2 ranks and 4 x 1 on one machine).
 *
 * Under mpirun this same binary is the job's program: `test_mpi_procs
 * --worker MODE N_LOCAL` runs one process of a job (worker_main) instead
 * of the suite; the suite launches it and checks what the job printed, its
 * exit code and how long it took:
 *   sweep    every collective and dtype on the mpi transport, checked
 *            against the tree on every rank; the digests of the outputs,
 *            printed per rank, must equal those of the host transport with
 *            the same number of ranks in one process;
 *   fail     rank 3's third collective fails: both processes end, the first
 *            error is printed, naming rank, process, host and collective;
 *   kill     process 1 SIGKILLs itself mid-run: process 0 ends within
 *            seconds (mpirun sees the death and ends the job);
 *   stuck    rank 3 fails while rank 2 of its process keeps computing and
 *            never returns: the abort watchdog ends the job after
 *            FSDP_ABORT_GRACE seconds;
 *   devices  the processes run different numbers of ranks: both refuse.
 * (`--env` prints the settings read from the environment, for one test;
 * `--worker bench N` times the collectives: a measurement, not a test.)
 * The multi-process tests skip, saying why, in a build without MPI or
 * without mpirun. Under the sanitizers they run with two allowances for
 * Open MPI's own code, never ours: ASan's leak check is off in the workers
 * (Open MPI's plugins leave ~3000 allocations at exit), and under TSan the
 * job uses shared memory only (--mca btl self,vader: TSan reports a lock
 * order inversion inside Open MPI's TCP transport during MPI_Init). A job
 * whose output mentions a sanitizer fails its test.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "case_util.h"
#include "coll_sweep.h"
#include "comm/cuda_comm.h"
#include "comm/procs.h"
#include "comm/transport.h"
#include "core/world.h"
#include "device/device.h"
#include "file_util.h"
#include "mpirun_util.h"
#include "testutil.h"

static const size_t sweep_sizes[] = {1, 7, 2049, 30001};
static const int n_sweep_sizes = (int)FSDP_TEST_LEN(sweep_sizes);

/* ---- one process of a job under mpirun --------------------------------------- */

struct worker {
    const char *mode;
    uint64_t digest[FSDP_MAX_RANKS];
};

/* Time the collectives on fp32 buffers of 4 MiB and 64 MiB (the full
 * buffer S; reduce_scatter's send and all_gather's recv are S), 5 runs
 * after a warm-up; rank 0 prints the mean time, the algorithm bandwidth
 * (the logical bytes of comm.h per rank / time) and the bytes its process
 * moved to other processes. Not part of the suite: a measurement. */
static fsdp_status bench_rank(fsdp_world *w, fsdp_comm *c, int rank)
{
    static const size_t sizes[] = {1u << 20, 16u << 20}; /* elements of S */
    fsdp_status st = FSDP_STATUS_OK;
    int N = w->n_ranks;
    for (size_t i = 0; i < FSDP_TEST_LEN(sizes) && st == FSDP_STATUS_OK; i++) {
        size_t S = sizes[i] / (size_t)N * (size_t)N, chunk = S / (size_t)N;
        float *a = calloc(S, sizeof *a), *b = calloc(S, sizeof *b);
        if (!a || !b)
            st = fsdp_error_set(FSDP_STATUS_OOM, "bench buffers");
        for (int k = 0; k < 3 && st == FSDP_STATUS_OK; k++) {
            double t = 0;
            for (int it = 0; it < 6 && st == FSDP_STATUS_OK; it++) {
                fsdp_comm_reset_stats(c);
                double t0 = now_s();
                if (k == 0)
                    st = fsdp_comm_all_reduce(c, a, b, S, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
                else if (k == 1)
                    st = fsdp_comm_reduce_scatter(c, a, b, chunk, FSDP_DTYPE_F32,
                                                  FSDP_REDUCE_SUM, NULL);
                else
                    st = fsdp_comm_all_gather(c, a, b, chunk, FSDP_DTYPE_F32, NULL);
                if (it > 0) /* the first is a warm-up */
                    t += now_s() - t0;
            }
            fsdp_coll_kind kind = k == 0   ? FSDP_COLL_ALL_REDUCE
                                  : k == 1 ? FSDP_COLL_REDUCE_SCATTER
                                           : FSDP_COLL_ALL_GATHER;
            t /= 5;
            if (rank == 0 && st == FSDP_STATUS_OK)
                printf("bench %d x %d %-14s %6.1f MiB  %8.2f ms  algbw %6.2f GB/s  inter-process "
                       "%6.1f MiB sent by process 0\n", w->n_processes, w->n_local,
                       fsdp_coll_kind_name(kind), (double)S * 4 / (1 << 20), t * 1e3,
                       (double)c->bytes_sent[kind] / t / 1e9,
                       (double)c->bytes_inter_sent[kind] / (1 << 20));
        }
        free(a);
        free(b);
    }
    return st;
}

static fsdp_status worker_rank(fsdp_world *w, int rank, void *arg)
{
    struct worker *k = arg;
    fsdp_device dev;
    fsdp_comm c;
    fsdp_transport_req req = {.backend = FSDP_BACKEND_CPU, .kind = FSDP_COMM_AUTO,
                              .n_processes = w->n_processes};
    FSDP_TRY(fsdp_device_init(&dev, FSDP_BACKEND_CPU, w, rank, rank - w->rank_offset, 0));
    fsdp_status st = fsdp_comm_init(&c, &req, w, &dev, rank);
    if (st != FSDP_STATUS_OK) {
        fsdp_device_fini(&dev);
        return st;
    }
    if (!strcmp(k->mode, "sweep")) {
        st = coll_sweep_rank(&c, sweep_sizes, n_sweep_sizes, &k->digest[rank]);
    } else if (!strcmp(k->mode, "bench")) {
        st = bench_rank(w, &c, rank);
    } else {
        if (!strcmp(k->mode, "fail") || !strcmp(k->mode, "stuck"))
            if (rank == 3)
                fsdp_world_set_fault(w, FSDP_FAULT_COLLECTIVE, 3, 3);
        float buf[256] = {0}, out[256];
        for (int i = 0; i < 400 && st == FSDP_STATUS_OK; i++) {
            if (!strcmp(k->mode, "kill") && w->process == 1 && i == 20)
                raise(SIGKILL);
            if (!strcmp(k->mode, "stuck") && rank == 2 && i == 2)
                sleep(60); /* a long computation that never looks at the abort flag */
            st = fsdp_comm_all_reduce(&c, buf, out, 256, FSDP_DTYPE_F32, FSDP_REDUCE_SUM, NULL);
            if (!strcmp(k->mode, "kill"))
                usleep(20 * 1000);
        }
    }
    fsdp_comm_fini(&c);
    fsdp_device_fini(&dev);
    return st;
}

/* What `fsdp` main does: meet, run, report, end (a failure ends the job). */
static int worker_main(const char *mode, int n_local)
{
    fsdp_procs *p = NULL;
    fsdp_world *w = NULL;
    struct worker k = {.mode = mode};
    fsdp_status st = fsdp_procs_init(&p, NULL);
    if (st == FSDP_STATUS_OK && !p)
        st = fsdp_error_set(FSDP_STATUS_INTERNAL, "not started by mpirun");
    if (st == FSDP_STATUS_OK && !strcmp(mode, "devices"))
        n_local += p->process;
    if (st == FSDP_STATUS_OK)
        st = fsdp_procs_world_init(&w, p, n_local);
    if (st == FSDP_STATUS_OK)
        st = fsdp_world_launch(w, worker_rank, &k);
    if (st == FSDP_STATUS_OK && !strcmp(mode, "sweep"))
        for (int r = w->rank_offset; r < w->rank_offset + w->n_local; r++)
            printf("digest %d %016llx\n", r, (unsigned long long)k.digest[r]);
    else if (st != FSDP_STATUS_OK)
        fprintf(stderr, "fsdp: %s\n", fsdp_error_msg());
    fflush(stdout);
    fsdp_world_free(w);
    fsdp_procs_fini(p, st); /* with a failure: MPI_Abort, no return */
    return st == FSDP_STATUS_OK ? 0 : 1;
}

/* ---- launching jobs ------------------------------------------------------------ */

/* Run `mpirun -np P <this binary> --worker mode L` (env before it), at
 * most limit_s seconds; output in out. Returns the exit code (124: timed
 * out); *secs how long it ran. */
static int mpirun(char *out, size_t cap, int P, const char *mode, int L, const char *env,
                  int limit_s, double *secs)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = '\0';
    char mpi[512], cmd[8192];
    pathf(cmd, sizeof cmd, MPIRUN_ENV " %s timeout -k 5 %d %s -np %d %s --worker %s %d 2>&1",
          env ? env : "", limit_s, mpirun_cmd(mpi, sizeof mpi), P, self, mode, L);
    return run_captured(cmd, out, cap, secs);
}

static void sweep_job(int P, int L)
{
    const char *why = mpirun_skip_reason();
    if (why) {
        printf("SKIP: mpirun %d x %d: %s\n", P, L, why);
        return;
    }
    static char out[1 << 16];
    double secs;
    int rc = mpirun(out, sizeof out, P, "sweep", L, NULL, 60, &secs);
    ck_assert_msg(rc == 0, "mpirun -np %d, %d rank(s) each: exit %d after %.1f s:\n%s", P, L, rc,
                  secs, out);
    uint64_t host[FSDP_MAX_RANKS] = {0};
    ck_assert_msg(coll_sweep_host_digests(P * L, sweep_sizes, n_sweep_sizes, host) ==
                      FSDP_STATUS_OK, "%s", fsdp_error_msg());
    for (int r = 0; r < P * L; r++) {
        char want[64];
        snprintf(want, sizeof want, "digest %d %016llx\n", r, (unsigned long long)host[r]);
        ck_assert_msg(strstr(out, want), "%d x %d: rank %d's outputs differ from the host "
                      "transport's with %d ranks in one process (want '%.*s'):\n%s", P, L, r,
                      P * L, (int)strlen(want) - 1, want, out);
    }
    printf("mpirun %d x %d: every collective bit-identical to 1 x %d in %.1f s\n", P, L, P * L,
           secs);
}

START_TEST(test_mpirun_2x2_matches_1x4) { sweep_job(2, 2); }
END_TEST

START_TEST(test_mpirun_4x1_matches_1x4) { sweep_job(4, 1); }
END_TEST

/* A job of 2 processes x L ranks running worker `mode` (env before it)
 * that must fail by itself, not be ended by the 60 s limit. Its output
 * (a static buffer); *secs how long it ran. */
static const char *failing_job(const char *mode, int L, const char *env, double *secs)
{
    static char out[1 << 16];
    int rc = mpirun(out, sizeof out, 2, mode, L, env, 60, secs);
    ck_assert_msg(rc != 0 && rc != 124, "%s job: exit %d after %.1f s:\n%s", mode, rc, *secs, out);
    return out;
}

START_TEST(test_mpirun_rank_failure_ends_job)
{
    SKIP_UNLESS_MPIRUN();
    double secs;
    const char *out = failing_job("fail", 2, NULL, &secs);
    char host[FSDP_HOST_MAX];
    gethostname(host, sizeof host);
    char want[256];
    snprintf(want, sizeof want, "rank 3 (process 1 of 2, host %.64s): injected failure in "
             "collective 3 (all_reduce)", host);
    ck_assert_msg(strstr(out, want), "no '%s' in:\n%s", want, out);
    ck_assert_msg(strstr(out, "ending every process of the job"), "%s", out);
    ck_assert_msg(secs < 15 * MPIRUN_SLACK, "the job took %.1f s to end:\n%s", secs, out);
}
END_TEST

/* Jobs that end by themselves, each for its own reason: the output must
 * hold every fragment, and the job must end within max_secs (why: what
 * the time bounds). */
static const struct {
    const char *mode;
    int L;
    const char *env;
    const char *expect[2]; /* the second may be NULL */
    double max_secs;
    const char *why;
} ending_jobs[] = {
    /* a killed process: the other ends too */
    {"kill", 2, NULL, {"signal 9"}, 12,
     "process 0 outlived process 1 (which dies after ~20 collectives of 20 ms) by too much"},
    /* a rank stuck after another failed: the watchdog ends its process */
    {"stuck", 2, "FSDP_ABORT_GRACE=1",
     {"injected failure in collective 3", "did not end within 1 s"}, 15,
     "rank 2 sleeps 60 s"},
    /* processes that disagree on --devices */
    {"devices", 1, NULL, {"give every process the same --devices"}, 60, "the job's limit"},
};

START_TEST(test_mpirun_job_ends_by_itself)
{
    SKIP_UNLESS_MPIRUN();
    double secs;
    const char *out = failing_job(ending_jobs[_i].mode, ending_jobs[_i].L, ending_jobs[_i].env,
                                  &secs);
    for (int k = 0; k < 2 && ending_jobs[_i].expect[k]; k++)
        ck_assert_msg(strstr(out, ending_jobs[_i].expect[k]), "%s job: no '%s' in:\n%s",
                      ending_jobs[_i].mode, ending_jobs[_i].expect[k], out);
    ck_assert_msg(secs < ending_jobs[_i].max_secs * MPIRUN_SLACK, "%s job took %.1f s (%s):\n%s",
                  ending_jobs[_i].mode, secs, ending_jobs[_i].why, out);
}
END_TEST

/* ---- the rendezvous directory, with forked processes ---------------------------- */

/* Child process `me` of a dir job: meet, run fn on n_local ranks, end.
 * Writes its status and message to <dir>/../result.<me>; exit code 0 if
 * the launch returned `expect`. */
struct dir_case {
    const char *dir;
    int P, n_local;
    double dead_s;
    int fail_rank;   /* fails in its 3rd exchange; -1: none */
    int kill_proc;   /* SIGKILLs itself after the world init; -1: none */
};

static fsdp_status dir_rank(fsdp_world *w, int rank, void *arg)
{
    const struct dir_case *dc = arg;
    fsdp_comm_rdv *r;
    FSDP_TRY(fsdp_comm_rdv_attach(w, &r));
    fsdp_status st = FSDP_STATUS_OK;
    for (int k = 0; k < 6 && st == FSDP_STATUS_OK; k++) {
        if (rank == dc->fail_rank && k == 2) {
            st = fsdp_error_set(FSDP_STATUS_OOM, "rank %d ran out of memory on purpose", rank);
            break;
        }
        long mine[2] = {rank, k}, all[64][2];
        st = fsdp_comm_rdv_exchange(r, w, rank, mine, sizeof mine, all, true);
        for (int q = 0; q < w->n_ranks && st == FSDP_STATUS_OK; q++)
            if (all[q][0] != q || all[q][1] != k)
                st = fsdp_error_set(FSDP_STATUS_INTERNAL, "rank %d: record %d of exchange %d "
                                    "is {%ld, %ld}", rank, q, k, all[q][0], all[q][1]);
    }
    fsdp_comm_rdv_detach(w, r);
    return st;
}

static void dir_child(const struct dir_case *dc, int me, const char *result)
{
    fsdp_procs_opts o = {.kind = FSDP_PROCS_DIR, .dir = dc->dir, .process = me,
                         .n_processes = dc->P, .timeout_s = 30, .dead_s = dc->dead_s};
    fsdp_procs *p = NULL;
    fsdp_world *w = NULL;
    fsdp_status st = fsdp_procs_init(&p, &o);
    if (st == FSDP_STATUS_OK)
        st = fsdp_procs_world_init(&w, p, dc->n_local);
    if (st == FSDP_STATUS_OK && me == dc->kill_proc)
        raise(SIGKILL);
    if (st == FSDP_STATUS_OK && w->hosts[(me + 1) % dc->P][0] == '?')
        st = fsdp_error_set(FSDP_STATUS_INTERNAL, "host of process %d unknown", (me + 1) % dc->P);
    if (st == FSDP_STATUS_OK)
        st = fsdp_world_launch(w, dir_rank, (void *)dc);
    char msg[FSDP_ERROR_MSG_MAX + 32];
    int n = snprintf(msg, sizeof msg, "%d %s", (int)st, fsdp_error_msg());
    fsdp_world_free(w);
    fsdp_procs_fini(p, st);
    FILE *f = fopen(result, "w");
    if (f) {
        fwrite(msg, 1, (size_t)n, f);
        fclose(f);
    }
    _exit(0);
}

/* Run a dir job of dc->P forked processes; results[p] = "<status> <msg>". */
static double dir_job(struct dir_case *dc, char results[][FSDP_ERROR_MSG_MAX + 32])
{
    char dir[4096], res[8][4096];
    fsdp_test_path(dir, sizeof dir, "rdv");
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    dc->dir = dir;
    pid_t pids[8];
    double t0 = now_s();
    for (int p = 0; p < dc->P; p++) {
        fsdp_test_path(res[p], sizeof res[p], "result");
        pids[p] = fork();
        ck_assert_int_ge(pids[p], 0);
        if (pids[p] == 0)
            dir_child(dc, p, res[p]);
    }
    for (int p = 0; p < dc->P; p++) {
        int ws;
        ck_assert_int_eq(waitpid(pids[p], &ws, 0), pids[p]);
        results[p][0] = '\0';
        FILE *f = fopen(res[p], "r");
        if (f) {
            size_t n = fread(results[p], 1, FSDP_ERROR_MSG_MAX + 31, f);
            results[p][n] = '\0';
            fclose(f);
        }
    }
    return now_s() - t0;
}

START_TEST(test_dir_job_exchanges_and_leaves_dir_empty)
{
    struct dir_case dc = {.P = 3, .n_local = 2, .fail_rank = -1, .kill_proc = -1};
    char results[3][FSDP_ERROR_MSG_MAX + 32];
    dir_job(&dc, results);
    for (int p = 0; p < 3; p++)
        ck_assert_msg(results[p][0] == '0', "process %d: %s", p, results[p]);
    ck_assert_int_eq(count_entries(dc.dir), 0);
}
END_TEST

START_TEST(test_dir_job_failure_reaches_every_process)
{
    struct dir_case dc = {.P = 3, .n_local = 2, .fail_rank = 3, .kill_proc = -1};
    char results[3][FSDP_ERROR_MSG_MAX + 32];
    double secs = dir_job(&dc, results);
    char host[FSDP_HOST_MAX], want[256];
    gethostname(host, sizeof host);
    snprintf(want, sizeof want, "rank 3 (process 1 of 3, host %.64s): rank 3 ran out of memory "
             "on purpose", host);
    for (int p = 0; p < 3; p++)
        ck_assert_msg(atoi(results[p]) == FSDP_STATUS_OOM && strstr(results[p], want),
                      "process %d: %s (want '%s')", p, results[p], want);
    ck_assert_msg(secs < 10 * MPIRUN_SLACK, "took %.1f s", secs);
}
END_TEST

START_TEST(test_dir_job_notices_a_dead_process)
{
    struct dir_case dc = {.P = 3, .n_local = 1, .dead_s = 1.5, .fail_rank = -1,
                          .kill_proc = 2};
    char results[3][FSDP_ERROR_MSG_MAX + 32];
    double secs = dir_job(&dc, results);
    for (int p = 0; p < 2; p++)
        ck_assert_msg(atoi(results[p]) != 0 && strstr(results[p], "process 2 stopped: its "
                                                                  "heartbeat"),
                      "process %d: %s", p, results[p]);
    ck_assert_msg(secs < 10 * MPIRUN_SLACK, "took %.1f s", secs);
}
END_TEST

START_TEST(test_dir_refuses_a_used_directory)
{
    char dir[4096], path[4200];
    fsdp_test_path(dir, sizeof dir, "used");
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(path, sizeof path, "%s/abort", dir);
    fsdp_test_write_file(path, "rank 0 process 0 status 2\nold\n");
    fsdp_procs_opts o = {.kind = FSDP_PROCS_DIR, .dir = dir, .process = 0, .n_processes = 2};
    fsdp_procs *p;
    ck_assert_int_eq(fsdp_procs_init(&p, &o), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "give each job an empty directory"));
    o.process = 2; /* out of range */
    ck_assert_int_eq(fsdp_procs_init(&p, &o), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "FSDP_PROCESS"));
    o.process = 0;
    o.dir = "/nonexistent/fsdp-rdv";
    ck_assert_int_eq(fsdp_procs_init(&p, &o), FSDP_STATUS_IO);
}
END_TEST

/* Not under a launcher and no directory: one process, no procs. */
START_TEST(test_single_process_needs_nothing)
{
    fsdp_procs_opts o = {.kind = FSDP_PROCS_AUTO};
    fsdp_procs *p = (fsdp_procs *)1;
    if (fsdp_procs_mpi_launched()) {
        printf("SKIP: %s: this suite itself runs under an MPI launcher\n", __func__);
        return;
    }
    ck_assert_int_eq(fsdp_procs_init(&p, &o), FSDP_STATUS_OK);
    ck_assert_ptr_null(p);
    fsdp_world *w;
    ck_assert_int_eq(fsdp_procs_world_init(&w, NULL, 3), FSDP_STATUS_OK);
    ck_assert_int_eq(w->n_ranks, 3);
    ck_assert_int_eq(w->n_processes, 1);
    fsdp_world_free(w);
    ck_assert_int_eq(fsdp_procs_fini(NULL, FSDP_STATUS_IO), FSDP_STATUS_OK);
}
END_TEST

/* ---- settings from the environment (read once per process: a fresh one) --------- */

/* `test_mpi_procs --env`: meet as the environment says, alone, and print
 * what was read ("kind process/n timeout grace") or the error. */
static int env_main(void)
{
    fsdp_procs_opts o;
    fsdp_status st = fsdp_procs_opts_env(&o);
    if (st != FSDP_STATUS_OK) {
        printf("error %s\n", fsdp_error_msg());
        return 1;
    }
    fsdp_procs *p = NULL;
    st = fsdp_procs_init(&p, NULL);
    if (st != FSDP_STATUS_OK) {
        printf("error %s\n", fsdp_error_msg());
        return 1;
    }
    printf("%s %d/%d timeout %g grace %g\n",
           p ? fsdp_names_name(&fsdp_procs_kind_names, (int)p->kind) : "single",
           p ? p->process : 0, p ? p->n_processes : 1, o.timeout_s, o.abort_grace_s);
    return fsdp_procs_fini(p, FSDP_STATUS_OK) == FSDP_STATUS_OK ? 0 : 1;
}

START_TEST(test_settings_from_the_environment)
{
    if (fsdp_procs_mpi_launched()) {
        printf("SKIP: %s: this suite itself runs under an MPI launcher\n", __func__);
        return;
    }
    char self[4096], dir[4096], out[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = '\0';
    fsdp_test_path(dir, sizeof dir, "envdir");
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    static const text_case cases[] = {
        {"", "single 0/1 timeout 600 grace 10"},
        {"FSDP_PEER_TIMEOUT=5 FSDP_ABORT_GRACE=2.5", "single 0/1 timeout 5 grace 2.5"},
        {"FSDP_RDV_DIR=%s FSDP_PROCESS=0 FSDP_N_PROCESSES=1", "dir 0/1 timeout 600"},
        {"FSDP_RDV_DIR=%s FSDP_N_PROCESSES=2", "error processes meeting in a directory need"},
        {"FSDP_PROCESS=x", "error FSDP_PROCESS='x': expected a number"},
        {"FSDP_PEER_TIMEOUT=-1", "error FSDP_PEER_TIMEOUT='-1'"},
        {"FSDP_N_PROCESSES=1.5", "error FSDP_PROCESS and FSDP_N_PROCESSES must be whole"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        char env[4400], cmd[9000];
        snprintf(env, sizeof env, cases[i].in, dir);
        snprintf(cmd, sizeof cmd, "env -u OMPI_COMM_WORLD_SIZE -u PMI_SIZE -u PMIX_RANK "
                 "-u FSDP_RDV_DIR -u FSDP_PROCESS -u FSDP_N_PROCESSES -u FSDP_PEER_TIMEOUT "
                 "-u FSDP_ABORT_GRACE %s %s --env 2>&1", env, self);
        FILE *f = popen(cmd, "r");
        ck_assert_ptr_nonnull(f);
        size_t len = fread(out, 1, sizeof out - 1, f);
        out[len] = '\0';
        pclose(f);
        ck_assert_msg(strstr(out, cases[i].want), "%s: got '%s', want '%s'", env, out,
                      cases[i].want);
    }
    ck_assert_int_eq(count_entries(dir), 0); /* the job of one left its directory empty */
}
END_TEST

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--worker"))
        return worker_main(argv[2], atoi(argv[3]));
    if (argc == 2 && !strcmp(argv[1], "--env"))
        return env_main();
    const fsdp_test_tcase tcases[] = {
        {"dir", 60, .tmpdir = true,
         FSDP_TESTS(test_single_process_needs_nothing, test_settings_from_the_environment,
                    test_dir_refuses_a_used_directory, test_dir_job_exchanges_and_leaves_dir_empty,
                    test_dir_job_failure_reaches_every_process,
                    test_dir_job_notices_a_dead_process)},
        {"mpirun", 90,
         FSDP_TESTS(test_mpirun_2x2_matches_1x4, test_mpirun_4x1_matches_1x4,
                    test_mpirun_rank_failure_ends_job,
                    FSDP_TEST_LOOP(test_mpirun_job_ends_by_itself,
                                   (int)FSDP_TEST_LEN(ending_jobs)))},
    };
    return fsdp_test_main("mpi_procs", tcases, FSDP_TEST_LEN(tcases));
}
