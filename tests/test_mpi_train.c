/*
 * test_mpi_train.c - `fsdp train` as a job of several processes, as a user
 * runs it: Open MPI's mpirun on this machine (loopback, --oversubscribe),
 * each process running --devices rank threads of one global world.
 *
 * What a job of P processes x N devices must equal (docs/determinism.md):
 * the same run as 1 process x P*N devices, bit for bit: every step's loss
 * and gradient norm (the metrics log, printed exactly) and the final
 * parameters (the last checkpoint, converted to an llm.c file and compared
 * byte for byte), for every strategy (hybrid too: 2 nodes, a power of
 * two), with offload, accumulation, clipping and bf16, and for LoRA on an
 * NF4 base (its adapters, as `convert --to peft` writes them). Checkpoints written
 * by 2 x 2 resume on 1 x 3 and on 3 x 1 as one written by 1 x 4 does. A
 * rank's failure ends every process within seconds, naming the rank, its
 * process and host, the collective and the unit; so does a process killed
 * with SIGKILL. Progress and metrics come once, from process 0; each
 * process writes the trace of its ranks. The planner's bytes between
 * nodes (fsdp plan --nodes) equal what the job moved between processes. A
 * checkpoint directory that the processes do not share is refused.
 *
 * Also here, without mpirun: the gradient norm's cover of the global tree
 * (engine/norm_cover.h) equals the tree over every block, for many shard
 * maps. The mpirun tests skip, saying why, in a build without MPI or
 * without mpirun; under the sanitizers they run with test_mpi_procs.c's
 * allowances for Open MPI's own code.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "comm/procs.h"
#include "core/rng.h"
#include "engine/norm_cover.h"
#include "models/registry.h"
#include "mpirun_util.h"
#include "testutil.h"

/* The model and data of every run: the tiny GPT on the synthetic task,
 * 3 steps, global batch 16 (4 devices x batch 2 x accumulation 2). */
#define RUN_ARGS "--model tiny --seq 16 --batch 2 --steps 3 --eval 0 --lr 1e-2 --deterministic"

/* The fsdp binary by its absolute path: jobs run in their own directories. */
static char fsdp_bin[4096];

/* `mpirun -np P fsdp train ARGS` in dir; exit code, output in out. */
static int train_job(char *out, size_t cap, const char *dir, int P, double *secs,
                     const char *args)
{
    char pre[512];
    return shell(out, cap, 120, secs, "cd %s && %s -np %d %s train %s", dir,
                 mpirun_prefix(pre, sizeof pre), P, fsdp_bin, args);
}

/* train_job that must succeed; its output (a static buffer), *secs (if
 * not NULL) how long it ran. */
static const char *train_job_ok(const char *dir, int P, double *secs, const char *args)
{
    static char out[1 << 16];
    double s;
    int rc = train_job(out, sizeof out, dir, P, &s, args);
    ck_assert_msg(rc == 0, "mpirun -np %d fsdp train %s: exit %d after %.1f s:\n%s", P, args, rc,
                  s, out);
    if (secs)
        *secs = s;
    return out;
}

/* `fsdp train ARGS` in one process, in dir; asserts it succeeds. */
static void train_here(const char *dir, const char *args)
{
    static char out[1 << 16];
    int rc = shell(out, sizeof out, 120, NULL, "cd %s && %s train %s", dir, fsdp_bin, args);
    ck_assert_msg(rc == 0, "fsdp train %s: exit %d:\n%s", args, rc, out);
}

/* A fresh directory for one run. */
static char *run_dir(char *buf, size_t n, const char *name)
{
    fsdp_test_path(buf, n, name);
    ck_assert_int_eq(mkdir(buf, 0755), 0);
    return buf;
}

/* The steps of a metrics log as `step, loss, lr, grad_norm` text, exactly
 * as written (floats with 9 significant digits: exact round trips). */
static char *log_steps(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *text = fsdp_test_read_file(path, NULL);
    char *out = calloc(strlen(text) + 1, 1);
    ck_assert_ptr_nonnull(out);
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        ck_assert_ptr_nonnull(nl);
        char *end = strstr(line, ",\"tokens\"");
        ck_assert_msg(end && end < nl, "metrics line without tokens: %.*s", (int)(nl - line),
                      line);
        strncat(out, line, (size_t)(end - line));
        strcat(out, "\n");
    }
    free(text);
    return out;
}

/* The final parameters: the newest checkpoint in dir/ck as an llm.c file. */
static char *final_params(const char *dir, size_t *len)
{
    static char out[1 << 14];
    int rc = shell(out, sizeof out, 60, NULL, "cd %s && %s convert ck params.bin", dir,
                   fsdp_bin);
    ck_assert_msg(rc == 0, "convert in %s: exit %d:\n%s", dir, rc, out);
    char path[4200];
    snprintf(path, sizeof path, "%s/params.bin", dir);
    return fsdp_test_read_file(path, len);
}

/* The runs in a and b logged the same steps, as a's text (the caller frees it). */
static char *assert_same_steps(const char *a, const char *b, const char *what)
{
    char *la = log_steps(a), *lb = log_steps(b);
    ck_assert_msg(!strcmp(la, lb), "%s: losses or norms differ:\n%s\nvs\n%s", what, la, lb);
    ck_assert_msg(strlen(la) > 0, "%s: empty metrics", what);
    free(lb);
    return la;
}

/* The runs in a and b took the same steps and ended with the same bytes. */
static void assert_same_run(const char *a, const char *b, const char *what)
{
    free(assert_same_steps(a, b, what));
    size_t na, nb;
    char *pa = final_params(a, &na), *pb = final_params(b, &nb);
    ck_assert_msg(na == nb && !memcmp(pa, pb, na), "%s: final parameters differ", what);
    free(pa), free(pb);
}

/* One run written twice: `fsdp train <common> <here>` in one process in
 * a fresh run_dir ref, and `<common> <job>` as a job of 2 processes in a
 * fresh run_dir a (both (n,) buffers). */
static void train_ref_and_job(char *ref, char *a, size_t n, const char *common, const char *here,
                              const char *job)
{
    run_dir(ref, n, "ref");
    run_dir(a, n, "a");
    char args[1024];
    snprintf(args, sizeof args, "%s %s", common, here);
    train_here(ref, args);
    snprintf(args, sizeof args, "%s %s", common, job);
    train_job_ok(a, 2, NULL, args);
}

/* `fsdp train <common> <extra>` here in ref and in a, and the two runs
 * are the same (what names them in a failure). */
static void train_both_here_same(const char *ref, const char *a, const char *common,
                                 const char *extra, const char *what)
{
    char args[1024];
    snprintf(args, sizeof args, "%s %s", common, extra);
    train_here(ref, args);
    train_here(a, args);
    assert_same_run(ref, a, what);
}

/* ---- 2 processes x 2 devices = 1 x 4, bit for bit ------------------------------------ */

static const struct strategy {
    const char *name, *args;
    bool bf16;
} strategies[] = {
    {"full, accumulation", "--shard full --grad-accum 2", false},
    {"grad-op, offload", "--shard grad-op --offload optimizer --grad-accum 2", false},
    {"none, no prefetch", "--shard none --prefetch off --grad-accum 2", false},
    {"hybrid, offload", "--shard hybrid --offload optimizer --grad-accum 2", false},
    {"full, bf16", "--shard full --precision bf16 --grad-accum 2", true},
};

START_TEST(test_2x2_equals_1x4)
{
    SKIP_UNLESS_MPIRUN();
    const struct strategy *s = &strategies[_i];
    char ref[4096], job[4096], args[1024];
    run_dir(ref, sizeof ref, "ref");
    run_dir(job, sizeof job, "job");
    /* the reference: one process of 4 devices, full sharding */
    snprintf(args, sizeof args, "%s --devices 4 --grad-accum 2%s --log m.jsonl --ckpt-dir ck",
             RUN_ARGS, s->bf16 ? " --precision bf16" : "");
    train_here(ref, args);
    snprintf(args, sizeof args, "%s --devices 2 %s --log m.jsonl --ckpt-dir ck", RUN_ARGS,
             s->args);
    double secs;
    const char *out = train_job_ok(job, 2, &secs, args);
    assert_same_run(ref, job, s->name);
    /* one process printed: one header, one line per step */
    const char *first = strstr(out, "step     1/3");
    ck_assert_msg(first && !strstr(first + 1, "step     1/3") &&
                      strstr(out, "4 x cpu device(s)"), "%s: progress not printed once:\n%s",
                  s->name, out);
    printf("mpirun 2 x 2 %s: bit-identical to 1 x 4 in %.1f s\n", s->name, secs);
}
END_TEST

/* ---- checkpoints across process layouts ---------------------------------------------- */

/* Written by 2 processes x 2 devices, resumed by 1 x 3 and by 3 x 1 (global
 * batch 12 = 4 x 3 = 3 x 4): the same as resuming one written by 1 x 4. */
START_TEST(test_checkpoint_2x2_resumes_on_1x3_and_3x1)
{
    SKIP_UNLESS_MPIRUN();
    static char out[1 << 16];
    char ref[4096], a[4096], b[4096];
    const char *common = "--model tiny --seq 16 --batch 2 --eval 0 --lr 1e-2 --log m.jsonl "
                         "--ckpt-dir ck";
    train_ref_and_job(ref, a, sizeof ref, common, "--devices 4 --grad-accum 3 --steps 2",
                      "--devices 2 --grad-accum 3 --steps 2");
    fsdp_test_path(b, sizeof b, "b");
    int rc = shell(out, sizeof out, 30, NULL, "cp -r %s %s", a, b);
    ck_assert_int_eq(rc, 0);
    /* every rank's file, one manifest */
    char path[4200];
    for (int r = 0; r < 4; r++) {
        snprintf(path, sizeof path, "%s/ck/step_00000002/rank_%05d.bin", a, r);
        ck_assert_msg(access(path, R_OK) == 0, "no %s", path);
    }
    train_both_here_same(ref, a, common, "--devices 3 --grad-accum 4 --steps 4 --resume",
                         "2 x 2 resumed on 1 x 3");
    char args[1024];
    snprintf(args, sizeof args, "%s --devices 1 --grad-accum 4 --steps 4 --resume", common);
    const char *resumed = train_job_ok(b, 3, NULL, args);
    ck_assert_msg(strstr(resumed, "resuming from ck/step_00000002"), "mpirun 3 x 1 --resume:\n%s",
                  resumed);
    assert_same_run(ref, b, "2 x 2 resumed on 3 x 1");
}
END_TEST

/* Hybrid sharding writes the first node's files; they resume anywhere. */
START_TEST(test_hybrid_checkpoint_resumes_full)
{
    SKIP_UNLESS_MPIRUN();
    char ref[4096], a[4096];
    const char *common = "--model tiny --seq 16 --batch 2 --eval 0 --lr 1e-2 --log m.jsonl "
                         "--ckpt-dir ck --grad-accum 2";
    train_ref_and_job(ref, a, sizeof ref, common, "--devices 4 --steps 2",
                      "--devices 2 --shard hybrid --steps 2");
    char path[4200];
    snprintf(path, sizeof path, "%s/ck/step_00000002/manifest", a);
    char *man = fsdp_test_read_file(path, NULL);
    ck_assert_msg(strstr(man, "shard hybrid\n") && strstr(man, "shard_ranks 2\n") &&
                      strstr(man, "world_size 4\n"), "%s", man);
    free(man);
    snprintf(path, sizeof path, "%s/ck/step_00000002/rank_00002.bin", a);
    ck_assert_msg(access(path, F_OK) != 0, "the second node wrote %s", path);
    train_both_here_same(ref, a, common, "--devices 4 --steps 3 --resume",
                         "hybrid 2 x 2 resumed on 1 x 4 full");
}
END_TEST

/* ---- LoRA on a frozen NF4 base across processes ---------------------------------------- */

/* The adapters of the newest checkpoint in dir/ck as the safetensors bytes
 * of a PEFT directory, written to dir/peft_<k> (the frozen base is not in a
 * LoRA checkpoint's parameters). */
static char *final_adapters(const char *dir, int k, size_t *len)
{
    static char out[1 << 14];
    int rc = shell(out, sizeof out, 60, NULL, "cd %s && %s convert ck peft_%d --to peft", dir,
                   fsdp_bin, k);
    ck_assert_msg(rc == 0, "convert --to peft in %s: exit %d:\n%s", dir, rc, out);
    char path[4200];
    snprintf(path, sizeof path, "%s/peft_%d/adapter_model.safetensors", dir, k);
    return fsdp_test_read_file(path, len);
}

/* QLoRA written by 2 processes x 2 devices (optimizer offload,
 * accumulation) is 1 x 4's run bit for bit, and both resume on 1 x 1 alike:
 * the same losses and norms, the same adapters. */
START_TEST(test_lora_2x2_equals_1x4_and_resumes_on_1x1)
{
    SKIP_UNLESS_MPIRUN();
    char ref[4096], a[4096], args[1024];
    const char *common = "--model llama-tiny --lora 4 --quantize nf4 --seq 16 --batch 2 --eval 0 "
                         "--lr 1e-2 --deterministic --offload optimizer --log m.jsonl "
                         "--ckpt-dir ck";
    train_ref_and_job(ref, a, sizeof ref, common, "--devices 4 --grad-accum 2 --steps 2",
                      "--devices 2 --grad-accum 2 --steps 2");
    for (int k = 0; k < 2; k++) {
        if (k == 1) { /* global batch 16 = 2 x 4 x 2 = 2 x 1 x 8 */
            snprintf(args, sizeof args, "%s --devices 1 --grad-accum 8 --steps 3 --resume",
                     common);
            train_here(ref, args);
            train_here(a, args);
        }
        const char *what = k ? "LoRA 2 x 2 resumed on 1 x 1" : "LoRA 2 x 2 against 1 x 4";
        char *la = assert_same_steps(ref, a, what);
        ck_assert_msg(strstr(la, k ? "\"step\":3," : "\"step\":2,"), "%s: %s", what, la);
        size_t na, nb;
        char *pa = final_adapters(ref, k, &na), *pb = final_adapters(a, k, &nb);
        ck_assert_msg(na > 0 && na == nb && !memcmp(pa, pb, na), "%s: the adapters differ",
                      what);
        free(la), free(pa), free(pb);
    }
}
END_TEST

/* Processes that do not see one directory cannot checkpoint together:
 * each runs in its own working directory with a relative --ckpt-dir. */
START_TEST(test_unshared_checkpoint_dir_is_refused)
{
    SKIP_UNLESS_MPIRUN();
    static char out[1 << 16];
    char a[4096], b[4096], pre[512];
    run_dir(a, sizeof a, "a");
    run_dir(b, sizeof b, "b");
    const char *args = RUN_ARGS " --devices 1 --ckpt-dir ck";
    int rc = shell(out, sizeof out, 60, NULL, "%s -np 1 --wdir %s %s train %s : -np 1 --wdir %s "
                   "%s train %s", mpirun_prefix(pre, sizeof pre), a, fsdp_bin, args, b, fsdp_bin,
                   args);
    ck_assert_msg(rc != 0 && rc != 124 && strstr(out, "is not one directory shared by the job's "
                                                 "processes"), "exit %d:\n%s", rc, out);
    ck_assert_msg(strstr(out, "process 1 (host"), "%s", out);
}
END_TEST

/* ---- failures ------------------------------------------------------------------------ */

/* Rank 3 (process 1) fails in a collective: every process ends within
 * seconds; the error names the rank, process, host, step, unit and
 * collective. */
START_TEST(test_rank_failure_ends_the_job)
{
    SKIP_UNLESS_MPIRUN();
    static char out[1 << 16];
    char dir[4096], args[1024];
    run_dir(dir, sizeof dir, "fail");
    snprintf(args, sizeof args, "%s --devices 2 --steps 50", RUN_ARGS);
    char pre[512];
    double secs;
    int rc = shell(out, sizeof out, 120, &secs, "cd %s && %s -np 2 -x FSDP_FAULT=3:collective:14 "
                   "%s train %s", dir, mpirun_prefix(pre, sizeof pre), fsdp_bin, args);
    char host[FSDP_HOST_MAX], want[256];
    gethostname(host, sizeof host);
    snprintf(want, sizeof want, "rank 3 (process 1 of 2, host %.64s): step 2: unit 'h.0' "
             "all-gather: rank 3: injected failure in collective 14 (all_gather)", host);
    ck_assert_msg(rc != 0 && rc != 124 && strstr(out, want), "exit %d, want '%s':\n%s", rc, want,
                  out);
    ck_assert_msg(strstr(out, "ending every process of the job"), "%s", out);
    ck_assert_msg(secs < 15 * MPIRUN_SLACK, "the job took %.1f s to end:\n%s", secs, out);
}
END_TEST

/* The pid of the `fsdp` process of MPI rank `which` under mpirun `parent`
 * (its environment names its rank), or -1. */
static pid_t find_rank(pid_t parent, int which)
{
    char cmd[256], out[256];
    snprintf(cmd, sizeof cmd, "pgrep -P %d", (int)parent);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    pid_t found = -1;
    while (fgets(out, sizeof out, f) && found < 0) {
        pid_t pid = (pid_t)atoi(out);
        char path[64], env[1 << 15];
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        FILE *e = fopen(path, "r");
        if (!e)
            continue;
        size_t n = fread(env, 1, sizeof env - 1, e);
        fclose(e);
        char want[64];
        int wl = snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", which);
        for (size_t i = 0; i + (size_t)wl < n; i += strlen(env + i) + 1)
            if (!strcmp(env + i, want))
                found = pid;
    }
    pclose(f);
    return found;
}

/* Process 1 dies (SIGKILL) mid-run: process 0 ends within seconds. */
START_TEST(test_killed_process_ends_the_job)
{
    SKIP_UNLESS_MPIRUN();
    char dir[4096], log[4200], pre[512], cmd[8192];
    run_dir(dir, sizeof dir, "kill");
    snprintf(log, sizeof log, "%s/out.txt", dir);
    snprintf(cmd, sizeof cmd, "cd %s && exec env %s -np 2 %s train %s --devices 2 --steps 100000 "
             "--log m.jsonl > %s 2>&1", dir, mpirun_prefix(pre, sizeof pre), fsdp_bin,
             RUN_ARGS, log);
    pid_t mpirun = fork();
    ck_assert_int_ge(mpirun, 0);
    if (mpirun == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    /* wait for training to run: the metrics log has lines */
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/m.jsonl", dir);
    pid_t victim = -1;
    for (int i = 0; i < 600 && victim < 0; i++) {
        struct stat st;
        usleep(100 * 1000);
        if (stat(mpath, &st) == 0 && st.st_size > 0)
            victim = find_rank(mpirun, 1);
    }
    if (victim < 0)
        kill(mpirun, SIGKILL);
    ck_assert_msg(victim > 0, "process 1 of the job not found (or training never started)");
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    double t0 = now_s();
    int ws = 0;
    pid_t got = 0;
    while ((got = waitpid(mpirun, &ws, WNOHANG)) == 0 && now_s() - t0 < 30)
        usleep(50 * 1000);
    if (got == 0) {
        kill(mpirun, SIGKILL);
        waitpid(mpirun, &ws, 0);
    }
    double secs = now_s() - t0;
    char *out = fsdp_test_read_file(log, NULL);
    ck_assert_msg(got == mpirun && !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0),
                  "mpirun did not fail after process 1 died:\n%s", out);
    ck_assert_msg(secs < 10 * MPIRUN_SLACK, "process 0 outlived process 1 by %.1f s:\n%s", secs, out);
    ck_assert_msg(strstr(out, "signal 9"), "%s", out);
    free(out);
}
END_TEST

/* ---- what the job prints and writes --------------------------------------------------- */

/* Metrics once (process 0), traces per process, the plan's bytes between
 * nodes equal to the bytes the job moved between processes. */
static void inter_bytes_match_plan(const char *shard)
{
    char dir[4096], args[1024];
    run_dir(dir, sizeof dir, "inter");
    snprintf(args, sizeof args, "%s --devices 2 --shard %s --log m.jsonl --trace t.json",
             RUN_ARGS, shard);
    train_job_ok(dir, 2, NULL, args);
    char path[4200];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    char *log = fsdp_test_read_file(path, NULL);
    int lines = 0;
    for (const char *p = log; (p = strchr(p, '\n')); p++)
        lines++;
    ck_assert_msg(lines == 3, "%d metrics lines for 3 steps:\n%s", lines, log);
    /* the last step's bytes from other nodes, per device */
    const char *last = strstr(log, "{\"step\":3"), *ib = last ? strstr(last, "\"inter_bytes\":[")
                                                              : NULL;
    ck_assert_msg(ib, "no inter_bytes:\n%s", log);
    long dev[4];
    ck_assert_int_eq(sscanf(ib, "\"inter_bytes\":[%ld,%ld,%ld,%ld]", &dev[0], &dev[1], &dev[2],
                            &dev[3]), 4);
    free(log);
    /* the traces: process 0's ranks in t.json, process 1's in t.1.json */
    for (int q = 0; q < 2; q++) {
        snprintf(path, sizeof path, "%s/t%s.json", dir, q ? ".1" : "");
        char *tr = fsdp_test_read_file(path, NULL);
        for (int r = 0; r < 4; r++) {
            char want[32];
            snprintf(want, sizeof want, "\"name\":\"rank %d\"", r);
            ck_assert_msg(!strstr(tr, want) == (r / 2 != q), "%s: rank %d's track", path, r);
        }
        free(tr);
    }
    /* the plan of the same job in one process */
    snprintf(args, sizeof args, "plan --model tiny --seq 16 --batch 2 --devices 2 --nodes 2 "
             "--shard %s --steps 3 --json", shard);
    static char plan[1 << 17];
    int rc = fsdp_test_cli(plan, sizeof plan, "%s", args);
    ck_assert_msg(rc == 0, "fsdp %s: exit %d:\n%s", args, rc, plan);
    for (int q = 0; q < 2; q++) {
        char want[64];
        snprintf(want, sizeof want, "\"inter_recv_bytes\":%ld,", dev[2 * q] + dev[2 * q + 1]);
        const char *node = strstr(plan, q ? "{\"node\":1" : "{\"node\":0");
        ck_assert_msg(node && strstr(node, want), "%s: node %d: the job moved %ld bytes, the "
                      "plan says:\n%s", shard, q, dev[2 * q] + dev[2 * q + 1], node);
    }
    ck_assert_msg(dev[0] + dev[1] > 0, "%s: no bytes between processes", shard);
    printf("shard %s, 2 x 2: %ld bytes received from the other node per step, as planned\n",
           shard, dev[0] + dev[1]);
}

START_TEST(test_metrics_traces_and_planned_inter_bytes)
{
    SKIP_UNLESS_MPIRUN();
    inter_bytes_match_plan("full");
    inter_bytes_match_plan("hybrid");
}
END_TEST

/* Commands that run in one process refuse to run as several; --nodes must
 * agree with the processes. */
START_TEST(test_usage_across_processes)
{
    SKIP_UNLESS_MPIRUN();
    static char out[1 << 16];
    char dir[4096], pre[512];
    run_dir(dir, sizeof dir, "usage");
    int rc = shell(out, sizeof out, 60, NULL, "cd %s && %s -np 2 %s plan --model tiny", dir,
                   mpirun_prefix(pre, sizeof pre), fsdp_bin);
    ck_assert_msg(rc != 0 && strstr(out, "fsdp plan: runs in one process, but it was started as "
                                    "one of 2"), "exit %d:\n%s", rc, out);
    rc = train_job(out, sizeof out, dir, 2, NULL, RUN_ARGS " --devices 1 --nodes 3");
    ck_assert_msg(rc != 0 && strstr(out, "--nodes 3, but the job has 2 processes"), "exit %d:\n%s",
                  rc, out);
}
END_TEST

/* ---- the norm's cover of the global tree ----------------------------------------------- */

/* Every owner's record from random block sums; the cover's total is
 * fsdp_tree_sum over the blocks in docs/determinism.md's order, bit for bit. */
static void cover_matches_tree(const fsdp_model *m, int n_ranks, int n_nodes,
                               fsdp_shard_strategy s, uint64_t seed)
{
    fsdp_shardmap sm;
    ck_assert_int_eq(fsdp_shardmap_init_nodes(&sm, m, n_ranks, n_nodes, s), FSDP_STATUS_OK);
    fsdp_norm_cover nc;
    ck_assert_int_eq(fsdp_norm_cover_init(&nc, &sm), FSDP_STATUS_OK);
    int K = sm.shard_ranks;
    size_t n_local = 0;
    for (int u = 0; u < sm.n_units; u++)
        n_local += sm.units[u].n_blocks;
    float *blocks = calloc((size_t)K * n_local + 1, sizeof *blocks);
    float *recs = calloc((size_t)K * nc.record_len + 1, sizeof *recs);
    float *order = calloc(nc.n_blocks + 1, sizeof *order);
    ck_assert(blocks && recs && order);
    /* owner k's blocks, unit by unit and parameter by parameter from its block_off
     * (place.h's fsdp_place_sumsq layout), and the global order: unit by unit,
     * trainable parameter by parameter, block by block */
    size_t g = 0, base = 0;
    for (int u = 0; u < sm.n_units; u++) {
        const fsdp_shard_unit *su = &sm.units[u];
        for (int i = 0; i < su->seg_first[FSDP_SEG_TRAIN + 1]; i++) {
            const fsdp_shard_param *sp = &su->params[i];
            size_t nb = (sp->spec->numel + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
            size_t per = (fsdp_shard_param_span(sp) + FSDP_NORM_BLOCK - 1) / FSDP_NORM_BLOCK;
            for (size_t b = 0; b < nb; b++) {
                int k = (int)(b / per);
                uint64_t x = fsdp_rng_mix(seed ^ (g << 8));
                float v = (float)(x >> 40) * 1e-3f + (float)(x & 0xff);
                blocks[(size_t)k * n_local + base + sp->block_off + b % per] = v;
                order[g++] = v;
            }
        }
        base += su->n_blocks;
    }
    ck_assert_uint_eq(g, nc.n_blocks);
    for (int k = 0; k < K; k++)
        fsdp_norm_cover_record(&nc, k, blocks + (size_t)k * n_local, recs + k * nc.record_len);
    float want = fsdp_tree_sum(order, (int)g), got = fsdp_norm_cover_total(&nc, recs,
                                                                              nc.record_len);
    ck_assert_msg(!memcmp(&want, &got, sizeof got), "%d ranks on %d node(s), shard %s: cover "
                  "%a, tree %a", n_ranks, n_nodes, fsdp_shard_strategy_name(s), (double)got,
                  (double)want);
    /* a record is a few floats per unit, not a block per block */
    ck_assert_uint_le(nc.record_len, (size_t)sm.n_units * 64);
    free(blocks), free(recs), free(order);
    fsdp_norm_cover_free(&nc);
    fsdp_shardmap_free(&sm);
}

START_TEST(test_norm_cover_equals_tree)
{
    static const char *const models[] = {
        "tiny", "custom:layers=3,heads=2,channels=96,vocab=1000,context=64"};
    static const int ranks[] = {1, 2, 3, 4, 5, 6, 8};
    for (size_t i = 0; i < FSDP_TEST_LEN(models); i++) {
        fsdp_model m;
        ck_assert_int_eq(fsdp_model_from_spec(models[i], &m), FSDP_STATUS_OK);
        for (size_t j = 0; j < FSDP_TEST_LEN(ranks); j++)
            for (int s = 0; s < FSDP_SHARD_COUNT; s++) {
                int N = ranks[j];
                cover_matches_tree(&m, N, s == FSDP_SHARD_HYBRID && N % 2 == 0 ? 2 : 1,
                                   (fsdp_shard_strategy)s, 7 * i + j);
            }
        fsdp_model_free(&m);
    }
}
END_TEST

/* ---- planning several nodes in one process ---------------------------------------------- */

/* fsdp plan --nodes: the bytes between nodes (hybrid: the all-reduce alone
 * leaves a node), and --fit tries hybrid for cpu and cuda runs. */
START_TEST(test_plan_and_fit_know_nodes)
{
    static char out[1 << 17];
    int rc = fsdp_test_cli(out, sizeof out, "plan --model tiny --seq 16 --batch 2 --devices 2 "
                           "--nodes 2 --shard hybrid --node-gbs 1");
    ck_assert_msg(rc == 0 && strstr(out, "4 device(s) (2 nodes x 2)") &&
                      strstr(out, "between nodes, per step and node") &&
                      strstr(out, "only the all-reduce of gradient shards"),
                  "exit %d:\n%s", rc, out);
    const char *row = strstr(out, "between nodes");
    row = row ? strstr(row, "\n  0..1 ") : NULL; /* then the all_gather column */
    ck_assert_msg(row && !strncmp(row + 8 + strspn(row + 8, " "), "0 B / 0 B", 9),
                  "hybrid's gathers left the node:\n%s", out);
    rc = fsdp_test_cli(out, sizeof out, "plan --fit --target cpu --model tiny --seq 16 --devices 2 "
                       "--nodes 2 --global-batch 8 --device-mem 1GiB --json");
    ck_assert_msg(rc == 0 && strstr(out, "\"shard\":\"hybrid\""), "exit %d:\n%.2000s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "plan --fit --target cuda --model tiny --seq 16 --devices "
                       "2 --nodes 2 --global-batch 8 --device-mem 80GiB --json");
    ck_assert_msg(rc == 0 && strstr(out, "\"shard\":\"hybrid\""), "exit %d:\n%.2000s", rc,
                  out); /* nccl forms the groups too */
    rc = fsdp_test_cli(out, sizeof out, "plan --fit --target cpu --model tiny --seq 16 --devices 2 "
                       "--nodes 2 --global-batch 8 --device-mem 1GiB --shard full");
    ck_assert_msg(rc == 0 && strstr(out, "mpirun -np 2 fsdp train --backend cpu --model tiny "
                                    "--devices 2 "), "exit %d:\n%.3000s", rc, out);
}
END_TEST

int main(void)
{
    if (!realpath(FSDP_BIN, fsdp_bin)) {
        perror("test_mpi_train: " FSDP_BIN);
        return 1;
    }
    const fsdp_test_tcase tcases[] = {
        {"cover", 30, FSDP_TESTS(test_norm_cover_equals_tree, test_plan_and_fit_know_nodes)},
        {"mpirun", FSDP_TEST_TSAN || FSDP_TEST_ASAN ? 600 : 120, .tmpdir = true,
         FSDP_TESTS(FSDP_TEST_LOOP(test_2x2_equals_1x4, (int)FSDP_TEST_LEN(strategies)),
                    test_checkpoint_2x2_resumes_on_1x3_and_3x1, test_hybrid_checkpoint_resumes_full,
                    test_lora_2x2_equals_1x4_and_resumes_on_1x1,
                    test_unshared_checkpoint_dir_is_refused, test_rank_failure_ends_the_job,
                    test_killed_process_ends_the_job, test_metrics_traces_and_planned_inter_bytes,
                    test_usage_across_processes)},
    };
    return fsdp_test_main("mpi_train", tcases, FSDP_TEST_LEN(tcases));
}
