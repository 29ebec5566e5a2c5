/*
 * test_train_errors.c - the trainer's and the engine's error paths: a
 * non-finite step stopped before its update or skipped, a checkpoint of
 * non-finite state refused, a data file changed under a step (poisoned, no
 * update) or truncated between steps (stop with a checkpoint), a stop
 * request (what SIGINT sets), outputs checked before step 1, a metrics
 * file on a full disk, a resume with nothing left to do or another global
 * batch, and the OOM hint. The command's side of the same: test_faults.c.
 */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/modelfile.h"
#include "core/world.h"
#include "file_util.h"
#include "engine/engine.h"
#include "models/registry.h"
#include "testutil.h"
#include "train/train.h"
#include "train_util.h"

/* Runs are train_config_tiny's (train_util.h): 8 micro-batches of one
 * sequence of 16 tokens per step over N devices. */
/* ---- error paths: non-finite steps ----------------------------------------- */

/* Whether two results hold the same final parameters, bit for bit. */
static bool same_params(const fsdp_train_result *a, const fsdp_train_result *b)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    bool same = true;
    for (int u = 0; u < m.n_units && same; u++) {
        ck_assert_ptr_nonnull(a->params[u]);
        ck_assert_ptr_nonnull(b->params[u]);
        same = !memcmp(a->params[u], b->params[u], m.units[u].numel * sizeof(float));
    }
    fsdp_model_free(&m);
    return same;
}

static bool ckpt_exists(const char *dir, int step)
{
    char p[512];
    snprintf(p, sizeof p, "%s/step_%08d", dir, step);
    return fsdp_ckpt_is_complete(p);
}

/* An lr of 1e30 throws the parameters to ~1e30 in step 1; step 2's
 * forward overflows and its loss is NaN. The run stops with NONFINITE
 * naming step 2, the update of step 2 is not applied (the parameters are
 * step 1's, bit for bit), and the final checkpoint holds step 1 - except
 * with offload and no clipping, where updates start in backward before
 * the norm is known: then the message says so and nothing is saved. */
START_TEST(test_nonfinite_stops_before_update)
{
    static const struct {
        bool offload;
        float clip;
        bool applied;
    } v[] = {{false, 1.0f, false}, {true, 1.0f, false}, {false, 0.0f, false}, {true, 0.0f, true}};
    for (size_t k = 0; k < FSDP_TEST_LEN(v); k++) {
        char ck[512];
        fsdp_test_path(ck, sizeof ck, "ck");
        fsdp_train_config c;
        fsdp_train_result one, r;
        train_config_tiny(&c, 2, 1);
        c.lr = 1e30f;
        c.eng.offload = v[k].offload;
        c.eng.clip = v[k].clip;
        c.steps = 1;
        run_ok(&c, &one);
        c.steps = 4;
        c.ckpt_dir = ck;
        fsdp_status st = fsdp_train_run(&c, &r);
        const char *msg = fsdp_error_msg();
        ck_assert_msg(st == FSDP_STATUS_NONFINITE, "variant %zu: %s: %s", k,
                      fsdp_status_name(st), msg);
        ck_assert_msg(strstr(msg, "step 2:") && strstr(msg, "--on-nonfinite skip"),
                      "variant %zu: %s", k, msg);
        ck_assert_int_eq(r.steps, 1);
        ck_assert(!isfinite(r.losses[1]) || r.losses[1] == 0.0f);
        if (v[k].applied) {
            ck_assert_msg(strstr(msg, "had started"), "variant %zu: %s", k, msg);
            ck_assert_int_eq(r.ckpt_step, -1);
            ck_assert(!ckpt_exists(ck, 1));
        } else {
            ck_assert_msg(strstr(msg, "not applied") && strstr(msg, "checkpoint step 1"),
                          "variant %zu: %s", k, msg);
            ck_assert_msg(same_params(&one, &r), "variant %zu: step 2's update was applied", k);
            ck_assert_int_eq(r.ckpt_step, 1);
            ck_assert(ckpt_exists(ck, 1));
        }
        fsdp_train_result_free(&one);
        fsdp_train_result_free(&r);
    }
}
END_TEST

/* With skip_nonfinite every non-finite step is dropped and counted: the
 * run goes on, its parameters stay those of the last finite step (offload
 * without clipping included: its updates then wait for the norm). */
START_TEST(test_nonfinite_skip)
{
    for (int offload = 0; offload < 2; offload++) {
        fsdp_train_config c;
        fsdp_train_result one, r;
        train_config_tiny(&c, 2, 1);
        c.lr = 1e30f;
        c.eng.offload = offload;
        c.eng.clip = 0.0f;
        c.steps = 1;
        run_ok(&c, &one);
        c.steps = 4;
        c.eng.skip_nonfinite = true;
        run_ok(&c, &r);
        ck_assert_int_eq(r.steps, 4);
        ck_assert_int_eq(r.n_skipped, 3);
        for (int s = 1; s < 4; s++)
            ck_assert_msg(!isfinite(r.losses[s]), "offload %d step %d: loss %g", offload, s + 1,
                          r.losses[s]);
        ck_assert_msg(same_params(&one, &r), "offload %d: a non-finite update was applied",
                      offload);
        fsdp_train_result_free(&one);
        fsdp_train_result_free(&r);
    }
}
END_TEST

/* A model file whose weights hold a NaN: every step is non-finite; skipped,
 * the run reaches its end, and the checkpoint of its NaN parameters is
 * refused (NONFINITE naming the unit), so no complete checkpoint exists. */
START_TEST(test_ckpt_refuses_nonfinite_state)
{
    char model[512], ck[512];
    fsdp_test_path(model, sizeof model, "nan.bin");
    fsdp_test_path(ck, sizeof ck, "ck");
    write_nan_tiny_model(model, 1, 7);

    fsdp_train_config c;
    fsdp_train_result r;
    train_config_tiny(&c, 2, 1);
    c.model = model;
    c.steps = 2;
    c.keep_params = false;
    c.ckpt_dir = ck;
    c.eng.skip_nonfinite = true;
    fsdp_status st = fsdp_train_run(&c, &r);
    const char *msg = fsdp_error_msg();
    ck_assert_msg(st == FSDP_STATUS_NONFINITE && strstr(msg, "refusing to write a checkpoint") &&
                      strstr(msg, "unit 'h.0'"),
                  "%s: %s", fsdp_status_name(st), msg);
    ck_assert_int_eq(r.n_skipped, 2);
    uint64_t newest = 0;
    bool found = true;
    ck_assert_int_eq(fsdp_ckpt_latest(ck, &newest, &found), FSDP_STATUS_OK);
    ck_assert_msg(!found, "a checkpoint of NaN parameters was written (step %llu)",
                  (unsigned long long)newest);
    fsdp_train_result_free(&r);
    /* without skipping, step 1 stops the run and nothing is saved either */
    c.eng.skip_nonfinite = false;
    st = fsdp_train_run(&c, &r);
    ck_assert_msg(st == FSDP_STATUS_NONFINITE && strstr(fsdp_error_msg(), "step 1:"), "%s",
                  fsdp_error_msg());
    ck_assert_int_eq(r.ckpt_step, -1);
    fsdp_train_result_free(&r);
}
END_TEST

/* ---- error paths: data that changes under a step ----------------------------- */

/* An llm.c uint16 token shard of n tokens, token i = i % mod. */
static void write_shard(const char *path, int n, int mod)
{
    int32_t h[256] = {20240520, 1, n};
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fwrite(h, sizeof h, 1, f), 1);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i % mod);
        ck_assert_int_eq(fwrite(&t, 2, 1, f), 1);
    }
    ck_assert_int_eq(fclose(f), 0);
}

struct poison_arg {
    fsdp_engine_shared *sh;
    const char *path;
    int n_tokens;
    fsdp_step_result r[2];
    fsdp_status data_st;
    char data_msg[1024];
    bool params_same;
};

/* Step 0; rank 0 rewrites the shard in place (same size, same time stamp,
 * tokens past what the file held at open); step 1 must read them, poison
 * itself and apply no update. */
static fsdp_status poison_rank(fsdp_world *w, int rank, void *p)
{
    struct poison_arg *a = p;
    fsdp_engine *e = NULL;
    fsdp_status st;
    float *before = NULL, *after = NULL;
    size_t n = a->sh->model->units[1].numel;
    FSDP_CHECK(fsdp_engine_init(&e, a->sh, rank));
    fsdp_step_result r0; /* each rank its own: the ranks write their results at once */
    FSDP_CHECK(fsdp_engine_step(e, 0, 1e-2f, &r0));
    if (rank == 0)
        a->r[0] = r0;
    FSDP_CHECK(fsdp_world_barrier(w));
    if (rank == 0) {
        struct stat sb;
        ck_assert_int_eq(stat(a->path, &sb), 0);
        write_shard(a->path, a->n_tokens, 250); /* the file held tokens < 200 */
        struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
        ck_assert_int_eq(utimensat(AT_FDCWD, a->path, ts, 0), 0);
    }
    FSDP_CHECK(fsdp_world_barrier(w));
    before = malloc(n * sizeof(float));
    after = malloc(n * sizeof(float));
    FSDP_CHECK(fsdp_engine_gather_unit(e, 1, before));
    fsdp_step_result r;
    FSDP_CHECK(fsdp_engine_step(e, 1, 1e-2f, &r));
    FSDP_CHECK(fsdp_engine_gather_unit(e, 1, after));
    if (rank == 1) { /* rank 1 reads micro-batch 1 of step 1: poisoned on every rank's data */
        a->r[1] = r;
        const char *msg = NULL;
        a->data_st = fsdp_engine_data_error(e, &msg);
        snprintf(a->data_msg, sizeof a->data_msg, "%s", msg);
        a->params_same = !memcmp(before, after, n * sizeof(float));
    }
    st = FSDP_STATUS_OK;
fail:
    free(before);
    free(after);
    fsdp_engine_free(e);
    return st;
}

START_TEST(test_data_changed_under_a_step)
{
    char path[512];
    fsdp_test_path(path, sizeof path, "shard.bin");
    int n_tokens = 4096;
    write_shard(path, n_tokens, 200);
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, path, 256, 1), FSDP_STATUS_OK);
    fsdp_train_config c;
    train_config_tiny(&c, 2, 1);
    fsdp_world *w = NULL;
    ck_assert_int_eq(fsdp_world_init(&w, 2), FSDP_STATUS_OK);
    fsdp_engine_shared sh;
    ck_assert_int_eq(fsdp_engine_shared_init(&sh, &c.eng, &m, d, w), FSDP_STATUS_OK);
    struct poison_arg a = {.sh = &sh, .path = path, .n_tokens = n_tokens};
    fsdp_status st = fsdp_world_launch(w, poison_rank, &a);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert(a.r[0].finite && a.r[0].applied);
    ck_assert_msg(!a.r[1].finite && !a.r[1].applied, "finite %d applied %d", a.r[1].finite,
                  a.r[1].applied);
    ck_assert_int_eq(a.data_st, FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(a.data_msg, path) && strstr(a.data_msg, "changed while training"), "%s",
                  a.data_msg);
    ck_assert_msg(a.params_same, "the poisoned step updated the parameters");
    /* the data check sees nothing (same size and time stamp): the read did */
    ck_assert_int_eq(fsdp_data_check(d), FSDP_STATUS_OK);
    fsdp_engine_shared_free(&sh);
    fsdp_world_free(w);
    fsdp_data_close(d);
    fsdp_model_free(&m);
}
END_TEST

/* A long tiny run (2 devices, 100000 steps) on its own thread, logging to
 * log and checkpointing into ck, for a test to act on while it trains. */
struct bg_run {
    fsdp_train_config c;
    fsdp_train_result r;
    fsdp_status st;
    char log[512], ck[512];
    char msg[1024];
    pthread_t tid;
};

static void *bg_main(void *p)
{
    struct bg_run *b = p;
    b->st = fsdp_train_run(&b->c, &b->r);
    snprintf(b->msg, sizeof b->msg, "%s", fsdp_error_msg());
    return NULL;
}

/* A run configured but not started; the caller may set more of b->c. */
static struct bg_run *bg_new(void)
{
    struct bg_run *b = calloc(1, sizeof *b);
    ck_assert_ptr_nonnull(b);
    fsdp_test_path(b->log, sizeof b->log, "m.jsonl");
    fsdp_test_path(b->ck, sizeof b->ck, "ck");
    train_config_tiny(&b->c, 2, 1);
    b->c.steps = 100000;
    b->c.keep_params = false;
    b->c.log_path = b->log;
    b->c.ckpt_dir = b->ck;
    return b;
}

/* Wait until the metrics file has k lines (the run logged k steps). */
static void wait_lines(const char *path, int k)
{
    for (int i = 0; i < 60000 && count_lines(path) < k; i++)
        usleep(1000);
    ck_assert_int_ge(count_lines(path), k);
}

/* Start b and return once it has logged 2 steps. */
static void bg_start(struct bg_run *b)
{
    ck_assert_int_eq(pthread_create(&b->tid, NULL, bg_main, b), 0);
    wait_lines(b->log, 2);
}

/* After pthread_join: b stopped before its end with a checkpoint of the
 * last step it ran. Frees b. */
static void bg_stopped_with_checkpoint(struct bg_run *b)
{
    ck_assert_int_lt(b->r.steps, 100000);
    ck_assert_int_eq(b->r.ckpt_step, b->r.steps);
    ck_assert(ckpt_exists(b->ck, b->r.steps));
    fsdp_train_result_free(&b->r);
    free(b);
}

/* The trainer's own check between steps: a data file truncated while it
 * trains stops the run with an error naming it, after a checkpoint of the
 * last step (which loads). */
START_TEST(test_data_truncated_stops_with_checkpoint)
{
    char data[512];
    fsdp_test_path(data, sizeof data, "shard.bin");
    write_shard(data, 1 << 16, 200);
    struct bg_run *b = bg_new();
    b->c.data = data;
    bg_start(b);
    ck_assert_int_eq(truncate(data, 1000), 0);
    pthread_join(b->tid, NULL);
    /* found by the check between steps ("changed while training"), or by a
     * read inside a step when the truncation lands there ("truncated or
     * replaced in place while training"): either way the run stops */
    ck_assert_msg(b->st == FSDP_STATUS_IO && strstr(b->msg, data) &&
                      strstr(b->msg, "while training"),
                  "%s: %s", fsdp_status_name(b->st), b->msg);
    fsdp_modelfile *mf = NULL;
    ck_assert_msg(fsdp_modelfile_open(&mf, b->ck) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    fsdp_modelfile_close(mf);
    bg_stopped_with_checkpoint(b);
}
END_TEST

/* ---- error paths: stopping, outputs, resuming ----------------------------------- */

/* A stop request (what SIGINT sets): the step in progress ends, a checkpoint
 * of it is written, the metrics hold every step run and the trace is
 * written; the run returns OK with interrupted set. */
START_TEST(test_stop_request)
{
    char trace[512];
    fsdp_test_path(trace, sizeof trace, "t.json");
    static atomic_int stop;
    atomic_store(&stop, 0);
    struct bg_run *b = bg_new();
    b->c.trace_path = trace;
    b->c.stop = &stop;
    bg_start(b);
    atomic_store(&stop, 1);
    pthread_join(b->tid, NULL);
    ck_assert_msg(b->st == FSDP_STATUS_OK, "%s", b->msg);
    ck_assert(b->r.interrupted);
    ck_assert_int_eq(count_lines(b->log), b->r.steps);
    char *t = fsdp_test_read_file(trace, NULL);
    ck_assert_msg(!strncmp(t, "{\"displayTimeUnit\"", 18) && strstr(t, "\n]}\n"), "trace: %.80s",
                  t);
    free(t);
    bg_stopped_with_checkpoint(b);
}
END_TEST

/* Outputs that cannot be written fail before step 1, naming them. */
START_TEST(test_outputs_checked_before_step_1)
{
    static const struct {
        const char *ckpt, *trace, *log, *expect;
    } cases[] = {
        {"/proc/nope/ck", NULL, NULL, "--ckpt-dir '/proc/nope/ck'"},
        {"/dev/null/ck", NULL, NULL, "--ckpt-dir '/dev/null/ck'"},
        {NULL, "/nonexistent-dir/t.json", NULL, "--trace '/nonexistent-dir/t.json'"},
        {NULL, "/tmp", NULL, "--trace '/tmp' is a directory"},
        {NULL, NULL, "/proc/nope.jsonl", "--log '/proc/nope.jsonl'"},
    };
    for (size_t k = 0; k < FSDP_TEST_LEN(cases); k++) {
        fsdp_train_config c;
        fsdp_train_result r;
        train_config_tiny(&c, 2, 1);
        c.ckpt_dir = cases[k].ckpt;
        c.trace_path = cases[k].trace;
        c.log_path = cases[k].log;
        fsdp_status st = fsdp_train_run(&c, &r);
        ck_assert_msg(st == FSDP_STATUS_IO && strstr(fsdp_error_msg(), cases[k].expect),
                      "case %zu: %s: %s", k, fsdp_status_name(st), fsdp_error_msg());
        ck_assert_int_eq(r.steps, 0);
        fsdp_train_result_free(&r);
    }
}
END_TEST

/* A metrics file that cannot be written (a full disk) fails the run after
 * a final checkpoint; the run stops at the next step instead of going on. */
START_TEST(test_metrics_write_failure)
{
    if (access("/dev/full", W_OK) != 0)
        return; /* no /dev/full here: nothing to fill */
    char ck[512];
    fsdp_test_path(ck, sizeof ck, "ck");
    fsdp_train_config c;
    fsdp_train_result r;
    train_config_tiny(&c, 2, 1);
    c.steps = 50;
    c.keep_params = false;
    c.log_path = "/dev/full";
    c.ckpt_dir = ck;
    fsdp_status st = fsdp_train_run(&c, &r);
    ck_assert_msg(st == FSDP_STATUS_IO && strstr(fsdp_error_msg(), "metrics file '/dev/full'") &&
                      strstr(fsdp_error_msg(), "step 1"),
                  "%s: %s", fsdp_status_name(st), fsdp_error_msg());
    ck_assert_int_eq(r.steps, 2); /* found after step 1, agreed on after step 2 */
    ck_assert(ckpt_exists(ck, 2));
    fsdp_train_result_free(&r);
}
END_TEST

/* Resuming a finished run loads it and runs nothing; another global batch
 * is refused unless allowed, and then trains on. */
START_TEST(test_resume_nothing_left_and_batch_change)
{
    char ck[512];
    fsdp_test_path(ck, sizeof ck, "ck");
    fsdp_train_config c;
    fsdp_train_result r;
    train_config_tiny(&c, 4, 1); /* batch 2 x 4 devices */
    c.steps = 2;
    c.ckpt_dir = ck;
    c.eval_problems = 8;
    run_ok(&c, &r);
    fsdp_train_result_free(&r);
    c.resume = true;
    run_ok(&c, &r);
    ck_assert_int_eq(r.first_step, 2);
    ck_assert_int_eq(r.steps, 2);
    ck_assert(r.accuracy < 0); /* nothing ran: no evaluation either */
    fsdp_train_result_free(&r);
    train_config_tiny(&c, 2, 1); /* batch 4 x 2 devices: same global batch of 8 */
    c.eng.batch = 1;       /* now 2 */
    c.steps = 4;
    c.ckpt_dir = ck;
    c.resume = true;
    fsdp_status st = fsdp_train_run(&c, &r);
    ck_assert_msg(st == FSDP_STATUS_INVALID_ARG && strstr(fsdp_error_msg(), "--allow-batch-change"),
                  "%s", fsdp_error_msg());
    fsdp_train_result_free(&r);
    c.allow_batch_change = true;
    run_ok(&c, &r);
    ck_assert_int_eq(r.first_step, 2);
    ck_assert_int_eq(r.steps, 4);
    ck_assert(isfinite(r.losses[3]));
    fsdp_train_result_free(&r);
}
END_TEST

/* The OOM hint lists what would lower the peak and is not set already. */
START_TEST(test_oom_hint_names_unset_settings)
{
    fsdp_train_config c;
    fsdp_train_result r;
    train_config_tiny(&c, 4, 1);
    c.model = "small";
    c.eng.device_mem = 2u << 20;
    ck_assert_int_eq(fsdp_train_run(&c, &r), FSDP_STATUS_OOM);
    ck_assert_msg(strstr(fsdp_error_msg(), "try --offload optimizer, --precision bf16"), "%s",
                  fsdp_error_msg());
    fsdp_train_result_free(&r);
    c.eng.offload = true;
    c.eng.compute_dtype = FSDP_DTYPE_BF16;
    c.eng.shard = FSDP_SHARD_FULL;
    c.eng.batch = 1;
    c.eng.grad_accum = 2;
    c.eng.device_mem = 256u << 10;
    ck_assert_int_eq(fsdp_train_run(&c, &r), FSDP_STATUS_OOM);
    const char *msg = fsdp_error_msg();
    ck_assert_msg(strstr(msg, "try more --devices or a larger --device-mem") &&
                      !strstr(msg, "--offload") && !strstr(msg, "--shard") &&
                      !strstr(msg, "--precision") && !strstr(msg, "--batch"),
                  "%s", msg);
    fsdp_train_result_free(&r);
}
END_TEST


int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"errors", 600, .tmpdir = true,
         FSDP_TESTS(test_nonfinite_stops_before_update, test_nonfinite_skip,
                    test_ckpt_refuses_nonfinite_state, test_data_changed_under_a_step,
                    test_data_truncated_stops_with_checkpoint, test_stop_request,
                    test_outputs_checked_before_step_1, test_metrics_write_failure,
                    test_resume_nothing_left_and_batch_change, test_oom_hint_names_unset_settings)},
    };
    return fsdp_test_main("train_errors", tcases, FSDP_TEST_LEN(tcases));
}
