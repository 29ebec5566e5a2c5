/*
 * test_golden.c - the trainer's exact trajectory, pinned to a file written
 * by an earlier tree: per-step loss and gradient norm (as bit patterns) and
 * a hash of the final parameters for a matrix of configurations (device
 * counts, strategies, offload, bf16, clipping, accumulation, a resume from
 * a checkpoint), plus the planner's per-device peaks for GPT-2 shapes.
 *
 * Restructuring must not change a single bit: the fixture
 * tests/fixtures/trajectory_golden.txt was produced before the model and
 * optimizer registries existed, and this suite fails on any difference.
 * The GEMM kernel is part of the math: the cpu backend picks the widest one
 * the CPU allows, and different kernels sum in different orders. So that
 * the fixture holds on any AVX2 machine (CI's included), the suite
 * re-executes itself with FSDP_CPU_GEMM=openblas:Haswell (OpenBLAS's AVX2
 * kernel for every dtype, ops/cpu/blas.h) before any test runs. Threads
 * per device need no pinning: they never change the bits.
 * A change that is meant to alter the math regenerates it on purpose:
 *   FSDP_GOLDEN_WRITE=tests/fixtures/trajectory_golden.txt build/tests/test_golden
 * and says why in its commit.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "models/registry.h"
#include "testutil.h"
#include "train/plan.h"
#include "train/train.h"
#include "train_util.h"

#define GOLDEN_PATH "tests/fixtures/trajectory_golden.txt"

typedef struct golden_case {
    const char *name;
    int devices, accum, batch;
    fsdp_shard_strategy shard;
    bool offload, bf16, prefetch;
    float clip;
    int resume_at; /* > 0: stop after this step with a checkpoint, resume to the end */
} golden_case;

static const golden_case cases[] = {
    {"d1_full", 1, 8, 1, FSDP_SHARD_FULL, false, false, true, 0.0f, 0},
    {"d2_full", 2, 4, 1, FSDP_SHARD_FULL, false, false, true, 0.0f, 0},
    {"d4_gradop_noprefetch", 4, 2, 1, FSDP_SHARD_GRAD_OP, false, false, false, 0.0f, 0},
    {"d8_none", 8, 1, 1, FSDP_SHARD_NONE, false, false, true, 0.0f, 0},
    {"d2_full_clip", 2, 2, 2, FSDP_SHARD_FULL, false, false, true, 0.5f, 0},
    {"d4_full_offload", 4, 2, 1, FSDP_SHARD_FULL, true, false, true, 0.0f, 0},
    {"d2_gradop_offload_clip", 2, 4, 1, FSDP_SHARD_GRAD_OP, true, false, true, 0.5f, 0},
    {"d2_full_bf16", 2, 1, 4, FSDP_SHARD_FULL, false, true, true, 1.0f, 0},
    {"d2_full_bf16_offload", 2, 1, 4, FSDP_SHARD_FULL, true, true, true, 0.0f, 0},
    {"d3_full_accum3", 3, 3, 1, FSDP_SHARD_FULL, false, false, true, 0.0f, 0},
    {"d2_full_resume", 2, 4, 1, FSDP_SHARD_FULL, false, false, true, 0.5f, 3},
    {"d2_full_offload_resume", 2, 4, 1, FSDP_SHARD_FULL, true, false, true, 0.0f, 3},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))
#define STEPS 6

typedef struct golden_plan {
    const char *name, *model;
    int devices, batch, seq;
    fsdp_shard_strategy shard;
    bool offload, bf16;
} golden_plan;

static const golden_plan plans[] = {
    {"plan_gpt2_d4_full", "gpt2", 4, 2, 1024, FSDP_SHARD_FULL, false, false},
    {"plan_gpt2_d4_full_offload", "gpt2", 4, 2, 1024, FSDP_SHARD_FULL, true, false},
    {"plan_gpt2_d8_gradop_bf16", "gpt2", 8, 1, 1024, FSDP_SHARD_GRAD_OP, false, true},
    {"plan_gpt2_d3_none_offload_bf16", "gpt2", 3, 1, 512, FSDP_SHARD_NONE, true, true},
    {"plan_small_d5_full", "small", 5, 16, 14, FSDP_SHARD_FULL, false, false},
};
#define N_PLANS ((int)(sizeof plans / sizeof plans[0]))

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

static uint32_t bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    return b;
}

static void base_config(fsdp_train_config *c, const golden_case *g)
{
    train_config_cpu(c, "tiny", g->devices);
    c->eng.grad_accum = g->accum;
    c->eng.batch = g->batch;
    c->eng.shard = g->shard;
    c->eng.offload = g->offload;
    c->eng.prefetch = g->prefetch;
    c->eng.clip = g->clip;
    c->eng.deterministic = true;
    c->eng.compute_dtype = g->bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    c->eng.optim_hp.weight_decay = 0.1f;
    c->steps = STEPS;
    c->warmup = 2;
    c->lr = 1e-2f;
    c->n_samples = 0;
    c->keep_params = true;
}

/* Append the case's lines ("name key value") to buf. */
static void run_case(const golden_case *g, char *buf, size_t cap)
{
    fsdp_train_config c;
    fsdp_train_result r;
    char dir[] = "/tmp/fsdp_golden_XXXXXX";
    base_config(&c, g);
    if (g->resume_at > 0) {
        ck_assert_ptr_nonnull(mkdtemp(dir));
        c.ckpt_dir = dir;
        c.ckpt_every = g->resume_at;
        c.stop_after = g->resume_at;
        fsdp_train_result first;
        ck_assert_msg(fsdp_train_run(&c, &first) == FSDP_STATUS_OK, "%s (first half): %s",
                      g->name, fsdp_error_msg());
        fsdp_train_result_free(&first);
        c.stop_after = 0;
        c.resume = true;
    }
    ck_assert_msg(fsdp_train_run(&c, &r) == FSDP_STATUS_OK, "%s: %s", g->name,
                  fsdp_error_msg());
    size_t n = strlen(buf);
    for (int s = r.first_step; s < r.steps; s++)
        n += (size_t)snprintf(buf + n, cap - n, "%s step%d %08" PRIx32 " %08" PRIx32 "\n",
                              g->name, s + 1, bits(r.losses[s]), bits(r.grad_norms[s]));
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    ck_assert_int_eq(r.n_units, m.n_units);
    for (int u = 0; u < r.n_units; u++) {
        ck_assert_ptr_nonnull(r.params[u]);
        uint64_t h = fnv(1469598103934665603ull, r.params[u], m.units[u].numel * sizeof(float));
        n += (size_t)snprintf(buf + n, cap - n, "%s params.%s %016" PRIx64 "\n", g->name,
                              m.units[u].name, h);
    }
    fsdp_model_free(&m);
    fsdp_train_result_free(&r);
    if (g->resume_at > 0) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        ck_assert_int_eq(system(cmd), 0);
    }
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

/* Compare line by line, naming the first line that differs. */
static void compare(const char *want, const char *got)
{
    int line = 1;
    while (*want || *got) {
        const char *we = strchr(want, '\n'), *ge = strchr(got, '\n');
        size_t wn = we ? (size_t)(we - want) : strlen(want);
        size_t gn = ge ? (size_t)(ge - got) : strlen(got);
        ck_assert_msg(wn == gn && !memcmp(want, got, wn),
                      "trajectory differs from " GOLDEN_PATH " at line %d:\n  want %.*s\n  got  %.*s",
                      line, (int)wn, want, (int)gn, got);
        want += wn + (we ? 1 : 0);
        got += gn + (ge ? 1 : 0);
        line++;
    }
}

START_TEST(test_trajectories_and_plans)
{
    size_t cap = 1 << 20;
    char *buf = calloc(1, cap);
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < N_CASES; i++)
        run_case(&cases[i], buf, cap);
    for (int i = 0; i < N_PLANS; i++) {
        const golden_plan *p = &plans[i];
        fsdp_train_config c;
        fsdp_train_config_default(&c);
        c.model = p->model;
        c.eng.n_ranks = p->devices;
        c.eng.batch = p->batch;
        c.eng.seq = p->seq;
        c.eng.shard = p->shard;
        c.eng.offload = p->offload;
        c.eng.compute_dtype = p->bf16 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
        c.out = NULL;
        fsdp_plan plan;
        ck_assert_msg(fsdp_plan_run(&c, 2, &plan) == FSDP_STATUS_OK, "%s: %s", p->name,
                      fsdp_error_msg());
        size_t n = strlen(buf);
        for (int r = 0; r < plan.n_ranks; r++) {
            const fsdp_plan_rank *pr = &plan.ranks[r];
            size_t sent = 0, recv = 0;
            for (int k = 0; k < FSDP_COLL_KIND_COUNT; k++) {
                sent += pr->sent_bytes[k];
                recv += pr->recv_bytes[k];
            }
            n += (size_t)snprintf(buf + n, cap - n, "%s rank%d peak %zu host %zu sent %zu recv %zu\n",
                                  p->name, r, pr->mem.peak_bytes, pr->host.peak_bytes, sent, recv);
        }
        fsdp_plan_free(&plan);
    }
    const char *out = getenv("FSDP_GOLDEN_WRITE");
    if (out && *out) {
        FILE *f = fopen(out, "wb");
        ck_assert_ptr_nonnull(f);
        fputs(buf, f);
        ck_assert_int_eq(fclose(f), 0);
        fprintf(stderr, "golden: wrote %s (%zu bytes)\n", out, strlen(buf));
    } else {
        char *want = read_file(GOLDEN_PATH);
        ck_assert_msg(want != NULL, "cannot read " GOLDEN_PATH " (run from the repository root)");
        compare(want, buf);
        free(want);
    }
    free(buf);
}
END_TEST

int main(int argc, char **argv)
{
    (void)argc;
    if (!getenv("FSDP_GOLDEN_PINNED")) {
        /* the GEMM library is loaded before main: re-exec */
        setenv("FSDP_CPU_GEMM", "openblas:Haswell", 1);
        setenv("FSDP_GOLDEN_PINNED", "1", 1);
        execv("/proc/self/exe", argv);
        perror("test_golden: re-exec with a pinned GEMM kernel failed");
        return 1;
    }
    const fsdp_test_tcase tcases[] = {
        {"golden", 600, FSDP_TESTS(test_trajectories_and_plans)},
    };
    return fsdp_test_main("golden", tcases, FSDP_TEST_LEN(tcases));
}
