/*
 * test_compat.c - checkpoints of earlier formats keep working: the
 * version-1 fixture (tests/fixtures/ckpt_v1_tiny, written before the model
 * registry) loads, resumes, converts and evaluates with exactly the values
 * of a fresh run of the command in its README; a version-2 copy of it
 * behaves identically; version-1 and version-2 manifests read into the same
 * in-memory form, and the lines of either version are checked against each
 * other (a manifest that contradicts itself is refused, issue 15 item 3).
 *
 * The fixture's values depend on the GEMM kernel that wrote it: OpenBLAS's
 * SkylakeX kernel, one thread, for every product. When this CPU can run
 * it, the suite re-executes itself pinned to it (FSDP_CPU_GEMM, which also
 * keeps the fp32 products out of oneDNN) and compares bit for bit; elsewhere the
 * fresh-run comparison is to a relative 1e-5 (the v1-vs-v2 comparisons are
 * exact everywhere: both read the same bytes).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/modelfile.h"
#include "core/error.h"
#include "file_util.h"
#include "model_files_util.h"
#include "testutil.h"
#include "train/infer.h"
#include "train/train.h"
#include "train_util.h"

#define FIXTURE "tests/fixtures/ckpt_v1_tiny"
#define FIXTURE_CKPT FIXTURE "/step_00000002"
#define FIXTURE_MANIFEST FIXTURE_CKPT "/manifest"

static bool exact; /* pinned to the fixture's GEMM kernel */

/* ---- helpers ----------------------------------------------------------------- */

/* a path that lives as long as the test */
typedef struct path {
    char s[512];
} path;

static path path_of(const char *dir, const char *name)
{
    path p;
    snprintf(p.s, sizeof p.s, "%s/%s", dir, name);
    return p;
}

static void run(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    REQUIRE(system(cmd) == 0, "'%s' failed", cmd);
}

/* The README's command: fsdp train --model tiny --devices 2 --steps S
 * --batch 2 --seq 16 --ckpt-dir DIR --eval 0 */
static void readme_config(fsdp_train_config *c, const char *dir, int steps)
{
    train_config_cpu(c, "tiny", 2);
    c->eng.batch = 2;
    c->steps = steps;
    c->n_samples = 0;
    c->ckpt_dir = dir;
}

/* a and b equal: bit for bit when `bits`, else to a relative 1e-5 */
static void same_floats(const float *a, const float *b, size_t n, bool bits, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        bool ok = bits ? !memcmp(&a[i], &b[i], sizeof *a)
                       : fabsf(a[i] - b[i]) <= 1e-5f * fmaxf(1.0f, fabsf(b[i]));
        REQUIRE(ok, "%s: element %zu is %.9g, want %.9g", what, i, (double)a[i], (double)b[i]);
    }
}

static void same_models(const loaded *a, const loaded *b, bool bits, const char *what)
{
    REQUIRE(a->m.family == b->m.family && !strcmp(a->m.config, b->m.config),
            "%s: model %s vs %s", what, a->m.name, b->m.name);
    for (int u = 0; u < a->m.n_units; u++) {
        char w[160];
        snprintf(w, sizeof w, "%s, unit %s", what, a->m.units[u].name);
        same_floats(a->units[u], b->units[u], a->m.units[u].numel, bits, w);
    }
}

static float eval_loss(const char *path)
{
    fsdp_infer_config ic;
    infer_config_cpu(&ic, path, 2);
    fsdp_infer_eval_result res;
    fsdp_status st = fsdp_infer_eval(&ic, "synthetic", 1337, 6, &res);
    REQUIRE(st == FSDP_STATUS_OK, "eval of %s: %s", path, fsdp_error_msg());
    free(res.losses);
    return res.mean;
}

/* Resume the checkpoints under dir to step 4 (keeping the parameters). */
static void resume_to_4(const char *dir, fsdp_train_result *r)
{
    fsdp_train_config c;
    readme_config(&c, dir, 4);
    c.resume = true;
    c.keep_params = true;
    run_ok(&c, r);
    REQUIRE(r->first_step == 2 && r->steps == 4, "%s resumed at step %d to %d", dir,
            r->first_step, r->steps);
}

/* x and y load to the same model and parameters and evaluate to the same
 * loss; a and b hold what was loaded (the caller frees). */
static void same_loads(const char *x, const char *y, bool bits, const char *what, loaded *a,
                       loaded *b)
{
    load_ok(x, a);
    load_ok(y, b);
    same_models(a, b, bits, what);
    float la = eval_loss(x), lb = eval_loss(y);
    char w[160];
    snprintf(w, sizeof w, "eval loss, %s", what);
    same_floats(&la, &lb, 1, bits, w);
}

/* The checkpoints under x and y, resumed to step 4, give the same losses
 * and parameters. */
static void same_resumes(const char *x, const char *y, bool bits, const char *what)
{
    fsdp_train_result ra, rb, *a = &ra, *b = &rb;
    resume_to_4(x, a);
    resume_to_4(y, b);
    char w[160];
    snprintf(w, sizeof w, "%s: losses of steps 3-4", what);
    same_floats(a->losses + 2, b->losses + 2, 2, bits, w);
    for (int u = 0; u < a->n_units; u++) {
        fsdp_model m;
        ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
        snprintf(w, sizeof w, "%s: parameters of unit %d after step 4", what, u);
        same_floats(a->params[u], b->params[u], m.units[u].numel, bits, w);
        fsdp_model_free(&m);
    }
    fsdp_train_result_free(a);
    fsdp_train_result_free(b);
}

/* A version-2 copy of the fixture: the same shard files, the manifest
 * rewritten from what the version-1 reader made of it. */
/* The manifest at path, written in the current version (3), rewritten as
 * version 2 wrote it: no tokenizer line, no checksum line. */
static void downgrade_to_v2(const char *path)
{
    char *text = slurp(path), *v2 = mutate(text, "\nversion 3\n", "\nversion 2\n");
    char *tok = strstr(v2, "\ntokenizer "), *sum = strstr(v2, "\nend\nchecksum ");
    REQUIRE(tok && sum, "not a version-3 manifest:\n%s", text);
    memmove(tok + 1, strchr(tok + 1, '\n') + 1, strlen(strchr(tok + 1, '\n') + 1) + 1);
    strcpy(strstr(v2, "\nend\nchecksum ") + 5, "");
    fsdp_test_write_file(path, v2);
    free(v2);
    free(text);
}

static void v2_copy(const char *dir)
{
    run("mkdir -p '%s/step_00000002' && cp " FIXTURE_CKPT "/rank_0000*.bin " FIXTURE_CKPT
        "/DONE '%s/step_00000002/'", dir, dir);
    fsdp_ckpt_manifest man;
    ck_assert_int_eq(fsdp_ckpt_manifest_read(FIXTURE_MANIFEST, &man), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_manifest_write(path_in(dir, "step_00000002/manifest"), &man),
                     FSDP_STATUS_OK);
    fsdp_ckpt_manifest_free(&man);
    downgrade_to_v2(path_in(dir, "step_00000002/manifest"));
}

/* ---- manifests ------------------------------------------------------------------ */

START_TEST(test_v1_reads_into_the_v2_form)
{
    fsdp_ckpt_manifest v1, v2;
    fsdp_status st = fsdp_ckpt_manifest_read(FIXTURE_MANIFEST, &v1);
    REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    fsdp_model tiny;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &tiny), FSDP_STATUS_OK);
    ck_assert_int_eq(v1.version, 1);
    ck_assert_str_eq(v1.model_family, "gpt2");
    ck_assert_str_eq(v1.model_config, tiny.config);
    /* version 1 predates the optimizer lines: AdamW's arrays */
    ck_assert_str_eq(v1.optimizer, "adamw");
    ck_assert_int_eq(v1.n_optim_state, 2);
    ck_assert_str_eq(v1.optim_state[0], "adam_m");
    ck_assert_str_eq(v1.optim_state[1], "adam_v");
    ck_assert_str_eq(v1.model_name, "tiny");
    ck_assert_int_eq(v1.model_line, 20); /* the 'gpt2' line */
    ck_assert_int_eq(fsdp_ckpt_manifest_check_model(&v1, FIXTURE_MANIFEST, &tiny),
                     FSDP_STATUS_OK);

    /* written back: version 3, the model as family + config only, and a checksum */
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    ck_assert_int_eq(fsdp_ckpt_manifest_write(path_in(dir, "manifest"), &v1), FSDP_STATUS_OK);
    char *text = slurp(path_in(dir, "manifest"));
    REQUIRE(strstr(text, "\nversion 3\n") && strstr(text, "\nmodel_family gpt2\n") &&
                strstr(text, "\nmodel_config layers=2,heads=4,channels=32,vocab=256,"
                             "context=64\n") &&
                strstr(text, "\nend\nchecksum "),
            "rewritten manifest:\n%s", text);
    static const char *const gone[] = {"\ngpt2 ", "\nmodel_spec ", "\nvocab_size ",
                                       "\npadded_vocab_size ", "\nmax_seq_len "};
    for (int i = 0; i < 5; i++)
        REQUIRE(!strstr(text, gone[i]), "version 3 still writes '%s'", gone[i] + 1);
    st = fsdp_ckpt_manifest_read(path_in(dir, "manifest"), &v2);
    REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_eq(v2.version, 3);
    fsdp_ckpt_manifest_free(&v2);
    /* and as version 2 wrote it (no checksum): still read, into the same form */
    downgrade_to_v2(path_in(dir, "manifest"));
    st = fsdp_ckpt_manifest_read(path_in(dir, "manifest"), &v2);
    REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_int_eq(v2.version, 2);
    /* the same in-memory form, field by field */
    ck_assert_str_eq(v2.model_family, v1.model_family);
    ck_assert_str_eq(v2.model_config, v1.model_config);
    ck_assert_str_eq(v2.optimizer, v1.optimizer);
    ck_assert_int_eq(v2.n_optim_state, v1.n_optim_state);
    ck_assert_str_eq(v2.model_name, v1.model_name);
    ck_assert_uint_eq(v2.run_id, v1.run_id);
    ck_assert_uint_eq(v2.step, v1.step);
    ck_assert_uint_eq(v2.adam_t, v1.adam_t);
    ck_assert_uint_eq(v2.data_sequences, v1.data_sequences);
    ck_assert_uint_eq(v2.seed, v1.seed);
    ck_assert_int_eq(v2.world_size, v1.world_size);
    ck_assert_str_eq(v2.shard, v1.shard);
    ck_assert_int_eq(v2.batch * v2.seq * v2.grad_accum * v2.steps_total,
                     v1.batch * v1.seq * v1.grad_accum * v1.steps_total);
    ck_assert_str_eq(v2.data, v1.data);
    expect_same_units(&v2, &v1);
    free(text);
    fsdp_ckpt_manifest_free(&v1);
    fsdp_ckpt_manifest_free(&v2);
    fsdp_model_free(&tiny);
}
END_TEST

/* Each case edits one line of a good manifest; the reader must refuse it
 * with FORMAT naming the file, a line, and what is wrong. */
static void refuse_edits(const char *good_path, const char *const (*cases)[3], int n)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    char *good = slurp(good_path);
    for (int i = 0; i < n; i++) {
        char *t = mutate(good, cases[i][0], cases[i][1]);
        fsdp_test_write_file(path_in(dir, "manifest"), t);
        fsdp_ckpt_manifest r;
        fsdp_status st = fsdp_ckpt_manifest_read(path_in(dir, "manifest"), &r);
        const char *msg = fsdp_error_msg();
        REQUIRE(st == FSDP_STATUS_FORMAT, "'%s' -> '%s': %s (%s)", cases[i][0], cases[i][1],
                fsdp_status_name(st), msg);
        REQUIRE(strstr(msg, dir) && strstr(msg, " line ") && strstr(msg, cases[i][2]),
                "'%s' -> '%s': message '%s' lacks the file, the line or '%s'", cases[i][0],
                cases[i][1], msg, cases[i][2]);
        ck_assert_ptr_null(r.units);
        free(t);
    }
    free(good);
}

START_TEST(test_v1_lines_must_agree)
{
    static const char *const cases[][3] = {
        /* issue 15 item 3: heads changed on the gpt2 line, model_spec still says 4 */
        {"gpt2 layers=2 heads=4", "gpt2 layers=2 heads=2", "describe different models"},
        {"model_spec custom:layers=2,heads=4", "model_spec custom:layers=2,heads=2",
         "describe different models"},
        {"model_spec custom:layers=2,", "model_spec custom:layers=2,,", "does not name a model"},
        {"vocab_size 256\n", "vocab_size 200\n", "disagree"},
        {"max_seq_len 64\n", "max_seq_len 32\n", "disagree"},
        {"gpt2 layers=2 heads=4 channels=32 vocab=256 context=64", "gpt2 -", "no model"},
        {"gpt2 layers=2 heads=4 channels=32", "gpt2 layers=2 heads=3 channels=32", "'gpt2'"},
        /* a channels change is a different model: the unit lines contradict it */
        {"gpt2 layers=2 heads=4 channels=32", "gpt2 layers=2 heads=4 channels=64",
         "describe different models"},
        {"model_spec custom:layers=2,heads=4,channels=32,vocab=256,context=64\n"
         "gpt2 layers=2 heads=4 channels=32",
         "model_spec -\ngpt2 layers=2 heads=4 channels=64", "contradict"},
        {"data synthetic\n", "data synthetic\nmodel_family gpt2\n", "not part of a version-1"},
        {"model_name tiny\n", "model_name tiny\r\n", "CRLF"},
    };
    refuse_edits(FIXTURE_MANIFEST, cases, (int)(sizeof cases / sizeof cases[0]));
}
END_TEST

START_TEST(test_v2_lines_must_agree)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    v2_copy(dir);
    static const char *const cases[][3] = {
        {"model_family gpt2", "model_family mamba", "not in this build"},
        {"model_family gpt2", "model_family gpt/2", "not a family name"},
        {"model_config layers=2,", "model_config layers=3,", "contradict"},
        {"model_config layers=2,", "model_config layers=2,,", "does not build"},
        {"model_config layers=2,heads=4", "model_config layers=2,heads=4,heads=4",
         "given twice"},
        {"param h.0.ln_1.weight", "param h.0.ln_9.weight", "contradict"},
        {"data synthetic\n", "data synthetic\ngpt2 layers=2 heads=4 channels=32 vocab=256 "
                             "context=64\n", "not part of a version-2"},
        {"model_config ", "model_configs ", "unknown key"},
        {"model_family gpt2\n", "", "'model_family' is missing"},
    };
    refuse_edits(path_in(dir, "step_00000002/manifest"), cases, (int)(sizeof cases / sizeof cases[0]));

    /* no header at all (a fuzzer found the version-less case): every key is missing */
    {
        char *full = slurp(path_in(dir, "step_00000002/manifest"));
        fsdp_test_write_file(path_in(dir, "m"), strstr(full, "units 3\n"));
        fsdp_ckpt_manifest r;
        ck_assert_int_eq(fsdp_ckpt_manifest_read(path_in(dir, "m"), &r), FSDP_STATUS_FORMAT);
        REQUIRE(strstr(fsdp_error_msg(), "key 'format' is missing"), "%s", fsdp_error_msg());
        free(full);
    }

    /* heads change no shape: such a manifest reads, and a resume with the
     * real model refuses it, naming the --model that fits */
    char *good = slurp(path_in(dir, "step_00000002/manifest"));
    char *t = mutate(good, "model_config layers=2,heads=4", "model_config layers=2,heads=2");
    fsdp_test_write_file(path_in(dir, "m"), t);
    fsdp_ckpt_manifest r;
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path_in(dir, "m"), &r), FSDP_STATUS_OK);
    fsdp_model tiny;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &tiny), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_manifest_check_model(&r, path_in(dir, "m"), &tiny), FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), "another config") &&
                strstr(fsdp_error_msg(),
                       "--model 'gpt2:layers=2,heads=2,channels=32,vocab=256,context=64'"),
            "%s", fsdp_error_msg());
    fsdp_model_free(&tiny);
    fsdp_ckpt_manifest_free(&r);
    free(t);
    free(good);
}
END_TEST

/* ---- the fixture against a fresh run ----------------------------------------------- */

START_TEST(test_v1_fixture_equals_a_fresh_run)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    path fp = path_of(dir, "fresh"), op = path_of(dir, "old");
    const char *fresh = fp.s, *old = op.s;
    fsdp_train_config c;
    fsdp_train_result r;
    readme_config(&c, fresh, 2);
    run_ok(&c, &r);
    fsdp_train_result_free(&r);

    /* loads to the same model and parameters, evaluates to the same loss */
    loaded a, b;
    same_loads(FIXTURE, fresh, exact, "v1 fixture vs fresh run", &a, &b);
    ck_assert_str_eq(a.m.name, "tiny");

    /* converts to the same files (the model's values, not the run's ids) */
    const char *outs[] = {"a.bin", "b.bin", "a.safetensors", "b.safetensors"};
    for (int k = 0; k < 4; k += 2) {
        fsdp_status st = fsdp_modelfile_write(path_in(dir, outs[k]), fsdp_modelfile_format_of(outs[k]),
                                              &a.m, (const float *const *)a.units,
                                              FSDP_DTYPE_F32);
        REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        st = fsdp_modelfile_write(path_in(dir, outs[k + 1]), fsdp_modelfile_format_of(outs[k + 1]),
                                  &b.m, (const float *const *)b.units, FSDP_DTYPE_F32);
        REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        size_t na, nb;
        char *fa = slurp_n(path_in(dir, outs[k]), &na);
        char *fb = slurp_n(path_in(dir, outs[k + 1]), &nb);
        REQUIRE(na == nb && (!exact || !memcmp(fa, fb, na)), "%s and %s differ", outs[k],
                outs[k + 1]);
        free(fa);
        free(fb);
    }
    /* the command converts it too */
    run(FSDP_BIN " convert --quiet %s '%s/cli.safetensors'", FIXTURE, dir);
    loaded c2;
    load_ok(path_in(dir, "cli.safetensors"), &c2);
    same_models(&a, &c2, true, "fsdp convert of the v1 fixture");
    loaded_free(&c2);

    /* resumes: two more steps from either give the same losses and parameters */
    run("cp -r " FIXTURE " '%s'%s", old, "");
    same_resumes(old, fresh, exact, "resumed v1 fixture vs resumed fresh run");
    /* and the checkpoint the resume wrote is version 2 */
    fsdp_ckpt_manifest man;
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path_in(old, "step_00000004/manifest"), &man),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(man.version, FSDP_CKPT_VERSION);
    fsdp_ckpt_manifest_free(&man);
    loaded_free(&a);
    loaded_free(&b);
}
END_TEST

START_TEST(test_v2_copy_behaves_like_the_v1_fixture)
{
    /* the same shard files under either manifest: everything bit-identical */
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    path p1 = path_of(dir, "v1"), p2 = path_of(dir, "v2");
    const char *v1 = p1.s, *v2 = p2.s;
    run("cp -r " FIXTURE " '%s'%s", v1, "");
    mkdir(v2, 0755);
    v2_copy(v2);
    loaded a, b;
    same_loads(v1, v2, true, "v1 vs v2 manifest", &a, &b);
    same_resumes(v1, v2, true, "resumed from a v1 vs a v2 manifest");
    loaded_free(&a);
    loaded_free(&b);
}
END_TEST

/* The fixture's shards are flat ranges of each unit over 2 files (version 1, before per-parameter
 * shards): resumed on 1, 2 and 4 devices (micro-batches of 1, the global batch of 4 split by
 * accumulation), each rank reading its rows of every parameter out of those ranges, it gives
 * the same losses and parameters bit for bit. */
START_TEST(test_flat_fixture_reshards_by_rows)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    static const int devs[] = {2, 1, 4};
    fsdp_train_result r[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", devs[i]);
        path p = path_of(dir, name);
        run("cp -r " FIXTURE " '%s'%s", p.s, "");
        fsdp_train_config c;
        readme_config(&c, p.s, 4);
        c.eng.n_ranks = devs[i];
        c.eng.batch = 1; /* the same micro-batches on every device count (determinism.md) */
        c.eng.grad_accum = 4 / devs[i];
        c.resume = true;
        c.keep_params = true;
        run_ok(&c, &r[i]);
        REQUIRE(r[i].first_step == 2 && r[i].steps == 4, "%d devices resumed at step %d to %d",
                devs[i], r[i].first_step, r[i].steps);
    }
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec("tiny", &m), FSDP_STATUS_OK);
    for (int i = 1; i < 3; i++) {
        char w[160];
        snprintf(w, sizeof w, "v1 fixture resumed on %d devices vs 2: losses of steps 3-4",
                 devs[i]);
        same_floats(r[i].losses + 2, r[0].losses + 2, 2, true, w);
        for (int u = 0; u < m.n_units; u++) {
            snprintf(w, sizeof w, "v1 fixture resumed on %d devices vs 2: unit %d", devs[i], u);
            same_floats(r[i].params[u], r[0].params[u], m.units[u].numel, true, w);
        }
    }
    fsdp_model_free(&m);
    for (int i = 0; i < 3; i++)
        fsdp_train_result_free(&r[i]);
}
END_TEST

int main(int argc, char **argv)
{
    (void)argc;
    __builtin_cpu_init();
    if (!getenv("FSDP_COMPAT_PINNED") && __builtin_cpu_supports("avx512f")) {
        /* the GEMM libraries are chosen before main: re-exec */
        setenv("FSDP_CPU_GEMM", "openblas:SkylakeX", 1);
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        setenv("FSDP_COMPAT_PINNED", "1", 1);
        execv("/proc/self/exe", argv);
        perror("test_compat: re-exec with a pinned GEMM kernel failed");
        return 1;
    }
    exact = getenv("FSDP_COMPAT_PINNED") != NULL;
    if (!exact)
        printf("test_compat: this CPU cannot run the SkylakeX kernel that wrote the v1 fixture; "
               "the fresh-run comparison is to a relative 1e-5\n");
    const fsdp_test_tcase tcases[] = {
        {"manifest", 60, .tmpdir = true,
         FSDP_TESTS(test_v1_reads_into_the_v2_form, test_v1_lines_must_agree,
                    test_v2_lines_must_agree)},
        {"fixture", 600, .tmpdir = true,
         FSDP_TESTS(test_v1_fixture_equals_a_fresh_run, test_v2_copy_behaves_like_the_v1_fixture,
                    test_flat_fixture_reshards_by_rows)},
    };
    return fsdp_test_main("compat", tcases, FSDP_TEST_LEN(tcases));
}
