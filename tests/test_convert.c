/*
 * test_convert.c - model files end to end: bit-exact round trips
 * checkpoint -> .bin -> checkpoint and checkpoint -> .safetensors ->
 * checkpoint from a real 3-device training run, a converted checkpoint
 * that resumes, hostile llm.c files, checkpoints and FIFOs rejected with
 * messages naming the file, the tokenizer file, eval's loss against the
 * trainer's, fine-tuning from a file, deterministic sampling on any number
 * of devices, and the commands (convert, eval, sample).
 *
 * Runs from the repository root (fixtures in tests/fixtures). Each test
 * works in a directory of its own in the suite's scratch directory
 * (testutil.h), removed even when a test fails.
 */
#include <check.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "ckpt/modelfile.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "model_files_util.h"
#include "testutil.h"
#include "train/infer.h"
#include "train/plan.h"
#include "train/train.h"

/* ---- round trips through a real training checkpoint ------------------------------ */

/* Train BYTE_SPEC on 3 devices for 3 steps with checkpoints in dir/ckpt;
 * returns the final parameters. */
static void trained_checkpoint(const char *dir, fsdp_train_result *res)
{
    fsdp_train_config c;
    train_config(&c, BYTE_SPEC, 3, 3);
    c.ckpt_dir = path_in(dir, "ckpt");
    c.keep_params = true;
    run_ok(&c, res);
}

START_TEST(test_roundtrip_ckpt_bin_ckpt)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    fsdp_train_result res;
    trained_checkpoint(dir, &res);
    loaded a, b, c;
    load_ok(path_in(dir, "ckpt"), &a); /* the newest checkpoint of the dir */
    int u = -1;
    long i = units_diff(&a.m, a.units, res.params, &u);
    REQUIRE(i < 0, "checkpoint unit %d element %ld differs from the trained parameters", u, i);
    write_loaded(path_in(dir, "m.bin"), "llmc", &a, FSDP_DTYPE_F32);
    load_ok(path_in(dir, "m.bin"), &b);
    require_same(&a, &b, "checkpoint -> .bin");
    write_loaded(path_in(dir, "back"), "ckpt", &b, FSDP_DTYPE_F32);
    load_ok(path_in(dir, "back"), &c);
    require_same(&a, &c, "checkpoint -> .bin -> checkpoint");
    /* bf16 llm.c export: version 5, rounded */
    loaded_free(&c);
    expect_bf16_export(path_in(dir, "m16.bin"), "llmc", &a, &c, "bf16 .bin");
    /* a checkpoint directory is never overwritten */
    fsdp_status st = fsdp_modelfile_write(path_in(dir, "back"), FMT("ckpt"), &b.m,
                                          (const float *const *)b.units, FSDP_DTYPE_F32);
    expect_error(st, FSDP_STATUS_INVALID_ARG, "writing into a checkpoint dir", "already holds",
                 NULL);
    loaded_free(&a);
    loaded_free(&b);
    loaded_free(&c);
    fsdp_train_result_free(&res);
}
END_TEST

START_TEST(test_roundtrip_ckpt_safetensors_ckpt)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    fsdp_train_result res;
    trained_checkpoint(dir, &res);
    char step[512];
    ck_assert_int_eq(fsdp_ckpt_step_path(step, sizeof step, path_in(dir, "ckpt"), 3, ""),
                     FSDP_STATUS_OK);
    loaded a, b, c;
    load_ok(step, &a); /* one checkpoint named directly */
    write_loaded(path_in(dir, "m.safetensors"), "safetensors", &a, FSDP_DTYPE_F32);
    load_ok(path_in(dir, "m.safetensors"), &b);
    require_same(&a, &b, "checkpoint -> .safetensors");
    write_loaded(path_in(dir, "back"), "ckpt", &b, FSDP_DTYPE_F32);
    load_ok(path_in(dir, "back"), &c);
    require_same(&a, &c, "checkpoint -> .safetensors -> checkpoint");
    int u = -1;
    REQUIRE(units_diff(&a.m, c.units, res.params, &u) < 0, "round trip lost the trained values");
    loaded_free(&a);
    loaded_free(&b);
    loaded_free(&c);
    fsdp_train_result_free(&res);
}
END_TEST

START_TEST(test_converted_ckpt_resumes)
{
    /* a checkpoint written from a model file resumes like training from
     * the file: same losses, bit for bit */
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    write_init_model(path_in(dir, "m.safetensors"), BYTE_SPEC, 99);
    loaded l;
    load_ok(path_in(dir, "m.safetensors"), &l);
    write_loaded(path_in(dir, "ck"), "ckpt", &l, FSDP_DTYPE_F32);
    fsdp_train_config c;
    fsdp_train_result r1, r2;
    /* the converted checkpoint records a 1-device run of batch 8, seq 16 (the
     * model's context) and seed 1337; resuming needs the same global batch */
    train_config(&c, path_in(dir, "m.safetensors"), 2, 2);
    c.eng.batch = 4;
    run_ok(&c, &r1);
    train_config(&c, BYTE_SPEC, 1, 2);
    c.eng.batch = 8;
    c.ckpt_dir = path_in(dir, "ck");
    c.resume = true;
    run_ok(&c, &r2);
    ck_assert_int_eq(r2.first_step, 0);
    for (int s = 0; s < 2; s++)
        REQUIRE(!memcmp(&r1.losses[s], &r2.losses[s], 4), "step %d: %.9g from the file, %.9g "
                "resumed from the converted checkpoint", s, (double)r1.losses[s],
                (double)r2.losses[s]);
    fsdp_train_result_free(&r1);
    fsdp_train_result_free(&r2);
    loaded_free(&l);
}
END_TEST

/* ---- hostile files ------------------------------------------------------------------ */

START_TEST(test_hostile_model_files)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    fsdp_modelfile *mf = NULL;
    size_t n;
    /* llm.c file truncated */
    unsigned char *b = read_file(FIXTURE_BIN, &n);
    write_file(path_in(dir, "cut.bin"), b, n - 8);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "cut.bin")), FSDP_STATUS_FORMAT,
                 "truncated .bin", "cut.bin", "truncated", NULL);
    free(b);
    /* a safetensors file on disk is validated the same way */
    b = read_file(FIXTURE_ST, &n);
    write_file(path_in(dir, "cut.safetensors"), b, n / 2);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "cut.safetensors")), FSDP_STATUS_FORMAT,
                 "truncated .safetensors", "cut.safetensors", NULL);
    free(b);
    ck_assert_ptr_null(mf);
    /* not a model at all */
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "nothing")), FSDP_STATUS_IO, "missing",
                 "nothing", NULL);
    /* a FIFO with no writer is refused at once, never waited on (issue 15 item 11) */
    static const char *const fifos[] = {"fifo.bin", "fifo.safetensors"};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(mkfifo(path_in(dir, fifos[i]), 0600), 0);
        expect_error(fsdp_modelfile_open(&mf, path_in(dir, fifos[i])), FSDP_STATUS_IO, fifos[i],
                     "not a regular file", NULL);
    }
    mkdir(path_in(dir, "fifo_ckpt"), 0755);
    ck_assert_int_eq(mkfifo(path_in(dir, "fifo_ckpt/manifest"), 0600), 0);
    write_file(path_in(dir, "fifo_ckpt/DONE"), "done\n", 5);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "fifo_ckpt")), FSDP_STATUS_FORMAT,
                 "fifo manifest", "not a regular file", NULL);
    /* checkpoints: none complete, incomplete, a rank file missing or corrupted */
    loaded l;
    load_ok(FIXTURE_BIN, &l);
    write_loaded(path_in(dir, "ck"), "ckpt", &l, FSDP_DTYPE_F32);
    mkdir(path_in(dir, "empty"), 0755);
    expect_error(fsdp_modelfile_open(&mf, path_in(dir, "empty")), FSDP_STATUS_FORMAT,
                 "empty ckpt dir", "no complete checkpoint", NULL);
    char step[512], p[600];
    ck_assert_int_eq(fsdp_ckpt_step_path(step, sizeof step, path_in(dir, "ck"), 0, ""),
                     FSDP_STATUS_OK);
    snprintf(p, sizeof p, "%s/DONE", step);
    ck_assert_int_eq(unlink(p), 0);
    expect_error(fsdp_modelfile_open(&mf, step), FSDP_STATUS_FORMAT, "no DONE", "incomplete",
                 NULL);
    write_file(p, "done\n", 5);
    ck_assert_int_eq(fsdp_modelfile_open(&mf, step), FSDP_STATUS_OK);
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_build(fsdp_modelfile_family(mf), fsdp_modelfile_config(mf), &m),
                     FSDP_STATUS_OK);
    /* the last unit's payload ends the file: master, Adam m, Adam v */
    size_t s2 = (m.units[2].numel + 1023) / 1024 * 1024;
    snprintf(p, sizeof p, "%s/rank_00000.bin", step);
    b = read_file(p, &n);
    b[n - 3 * 4 * s2 + 40] ^= 1; /* a master byte: its block checksum catches it */
    write_file(p, b, n);
    fsdp_status st = fsdp_modelfile_bind(mf, &m);
    float *all = malloc(m.units[2].numel * sizeof *all);
    if (st == FSDP_STATUS_OK)
        st = fsdp_modelfile_read_range(mf, 2, 0, m.units[2].numel, all);
    expect_error(st, FSDP_STATUS_FORMAT, "corrupted shard", "rank_00000.bin", "checksum", NULL);
    unlink(p);
    expect_error(fsdp_modelfile_bind(mf, &m), FSDP_STATUS_FORMAT, "missing shard",
                 "rank_00000.bin", NULL);
    fsdp_modelfile_close(mf);
    /* a model of another shape is refused before reading */
    ck_assert_int_eq(fsdp_modelfile_open(&mf, FIXTURE_ST), FSDP_STATUS_OK);
    fsdp_model other;
    ck_assert_int_eq(fsdp_model_from_spec(BYTE_SPEC, &other), FSDP_STATUS_OK);
    expect_error(fsdp_modelfile_bind(mf, &other), FSDP_STATUS_INVALID_ARG, "other model",
                 "tiny_gpt2.safetensors", NULL);
    fsdp_modelfile_close(mf);
    free(all);
    free(b);
    fsdp_model_free(&m);
    fsdp_model_free(&other);
    loaded_free(&l);
}
END_TEST

/* ---- tokenizer ------------------------------------------------------------------------ */

/* 256 byte tokens, then "ab", "abc", "the" (version 2, eot = 258). */
static unsigned char *make_tokenizer(size_t *n)
{
    unsigned char *b = calloc(1, 1024 + 256 * 2 + 3 + 4 + 4);
    uint32_t h[4] = {20240328, 2, 259, 258};
    memcpy(b, h, sizeof h);
    size_t at = 1024;
    for (int i = 0; i < 256; i++) {
        b[at++] = 1;
        b[at++] = (unsigned char)i;
    }
    const char *extra[3] = {"ab", "abc", "the"};
    for (int i = 0; i < 3; i++) {
        b[at++] = (unsigned char)strlen(extra[i]);
        memcpy(b + at, extra[i], strlen(extra[i]));
        at += strlen(extra[i]);
    }
    *n = at;
    return b;
}

START_TEST(test_tokenizer)
{
    size_t n;
    unsigned char *b = make_tokenizer(&n);
    fsdp_tokenizer *t = NULL;
    ck_assert_int_eq(fsdp_tokenizer_parse(&t, "tok.bin", b, n), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_tokenizer_vocab(t), 259);
    ck_assert_int_eq(fsdp_tokenizer_eot(t), 258);
    size_t len;
    const uint8_t *s = fsdp_tokenizer_decode(t, 257, &len);
    ck_assert(s && len == 3 && !memcmp(s, "abc", 3));
    ck_assert_ptr_null(fsdp_tokenizer_decode(t, 259, &len));
    int *ids, k;
    ck_assert_int_eq(fsdp_tokenizer_encode(t, "abcab the x", &ids, &k), FSDP_STATUS_OK);
    int want[] = {257, 256, ' ', 258, ' ', 'x'};
    ck_assert_int_eq(k, 6);
    for (int i = 0; i < k; i++)
        ck_assert_int_eq(ids[i], want[i]);
    free(ids);
    fsdp_tokenizer_free(t);

    unsigned char *c = malloc(n + 8);
#define BAD(what, mutate, len_, frag)                                                   \
    do {                                                                                \
        memcpy(c, b, n);                                                                \
        mutate;                                                                         \
        expect_error(fsdp_tokenizer_parse(&t, "tok.bin", c, len_), FSDP_STATUS_FORMAT,  \
                     what, "tok.bin", frag, NULL);                                      \
        ck_assert_ptr_null(t);                                                          \
    } while (0)
    uint32_t v;
    BAD("short", (void)0, 100, "shorter");
    BAD("magic", (v = 20240327, memcpy(c, &v, 4)), n, "magic");
    BAD("version", (v = 3, memcpy(c + 4, &v, 4)), n, "version");
    BAD("vocab 0", (v = 0, memcpy(c + 8, &v, 4)), n, "declares 0");
    BAD("vocab huge", (v = 1u << 30, memcpy(c + 8, &v, 4)), n, "declares");
    BAD("eot", (v = 259, memcpy(c + 12, &v, 4)), n, "end-of-text");
    BAD("truncated", (void)0, n - 2, "token 258");
    BAD("empty token", c[1024 + 2 * 5] = 0, n, "token 5");
    BAD("long token", c[1024 + 2 * 255] = 200, n, "token 255");
    BAD("trailing", (c[n] = 1, c[n + 1] = 'z'), n + 2, "after its 259 tokens");
#undef BAD
    free(c);
    free(b);
}
END_TEST

/* ---- eval, fine-tuning, sampling -------------------------------------------------------- */

START_TEST(test_eval_equals_train_loss)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    const char *model = path_in(dir, "m.bin");
    write_init_model(model, BYTE_SPEC, 5);
    /* the trainer's first step: micro-batches 0..3 (2 devices x accum 2) */
    fsdp_train_config c;
    fsdp_train_result r;
    train_config(&c, model, 2, 1);
    c.eng.grad_accum = 2;
    run_ok(&c, &r);
    for (int N = 1; N <= 3; N++) {
        fsdp_infer_config ic;
        infer_config_cpu(&ic, model, N);
        fsdp_infer_eval_result res;
        fsdp_status st = fsdp_infer_eval(&ic, "synthetic", c.eng.seed, 4, &res);
        REQUIRE(st == FSDP_STATUS_OK, "eval on %d devices: %s", N, fsdp_error_msg());
        REQUIRE(!memcmp(&res.mean, &r.losses[0], 4), "eval on %d devices: %.9g, trainer %.9g",
                N, (double)res.mean, (double)r.losses[0]);
        REQUIRE(res.n_batches == 4 && res.n_data == 4 && res.losses[0] != res.losses[1],
                "%d batches, %d with data; batches 0 and 1 give the same loss", res.n_batches,
                res.n_data);
        free(res.losses);
    }
    fsdp_train_result_free(&r);
}
END_TEST

/* Issue 15 item 16: eval allocates parameters (in the compute dtype) and
 * activations only, no optimizer state or gradients; and the planner's
 * inference run predicts its peak to the byte. */
START_TEST(test_infer_allocates_no_training_state)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    const char *model = path_in(dir, "m.safetensors");
    write_init_model(model, BYTE_SPEC, 5);
    fsdp_model m;
    ck_assert_int_eq(fsdp_modelfile_resolve(model, &m, NULL), FSDP_STATUS_OK);
    fsdp_dtype dts[2] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (int N = 1; N <= 3; N += 2) {
            fsdp_mem_stats mem[3];
            memset(mem, 0, sizeof mem);
            fsdp_infer_config ic;
            infer_config_cpu(&ic, model, N);
            ic.compute_dtype = dts[d];
            ic.mem_out = mem;
            fsdp_infer_eval_result res;
            REQUIRE(fsdp_infer_eval(&ic, "synthetic", 1, 2, &res) == FSDP_STATUS_OK,
                    "eval: %s", fsdp_error_msg());
            free(res.losses);
            fsdp_shardmap sm;
            ck_assert_int_eq(fsdp_shardmap_init(&sm, &m, N, FSDP_SHARD_FULL), FSDP_STATUS_OK);
            size_t params = 0;
            for (int u = 0; u < sm.n_units; u++)
                params += sm.units[u].shard_numel * fsdp_dtype_size(dts[d]);
            fsdp_shardmap_free(&sm);
            fsdp_train_config c;
            train_config(&c, model, N, 1);
            c.eng.compute_dtype = dts[d];
            c.eng.inference = true;
            fsdp_plan plan;
            REQUIRE(fsdp_plan_run(&c, 2, &plan) == FSDP_STATUS_OK, "plan: %s", fsdp_error_msg());
            for (int r = 0; r < N; r++) {
                const fsdp_mem_stats *s = &mem[r];
                REQUIRE(s->peak_bytes > 0, "rank %d reported no memory", r);
                REQUIRE(s->peak_kind_bytes[FSDP_MEM_OPTIM] == 0 &&
                        s->peak_kind_bytes[FSDP_MEM_GRAD] == 0 && s->kind_bytes[FSDP_MEM_GRAD] == 0,
                        "%s on %d devices: rank %d holds optimizer state (%zu) or gradients "
                        "(%zu)", fsdp_dtype_name(dts[d]), N, r,
                        s->peak_kind_bytes[FSDP_MEM_OPTIM], s->peak_kind_bytes[FSDP_MEM_GRAD]);
                REQUIRE(s->kind_bytes[FSDP_MEM_PARAM] == params, "%s on %d devices: rank %d "
                        "holds %zu parameter bytes, not its shards' %zu", fsdp_dtype_name(dts[d]),
                        N, r, s->kind_bytes[FSDP_MEM_PARAM], params);
                REQUIRE(plan.ranks[r].mem.peak_bytes == s->peak_bytes, "%s on %d devices: the "
                        "plan says %zu bytes at the peak of rank %d, eval reached %zu",
                        fsdp_dtype_name(dts[d]), N, plan.ranks[r].mem.peak_bytes, r,
                        s->peak_bytes);
            }
            fsdp_plan_free(&plan);
        }
    fsdp_model_free(&m);
}
END_TEST

START_TEST(test_train_from_file_equals_same_init)
{
    /* weights written from the RNG init of seed S, loaded by every rank from
     * the file, train exactly like a run initialised from seed S */
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    const char *files[2] = {path_in(dir, "m.bin"), path_in(dir, "m.safetensors")};
    fsdp_train_config c;
    fsdp_train_result ref, r;
    train_config(&c, BYTE_SPEC, 4, 2);
    run_ok(&c, &ref);
    for (int f = 0; f < 2; f++) {
        write_init_model(files[f], BYTE_SPEC, c.eng.seed);
        fsdp_train_config cf;
        train_config(&cf, files[f], 4, 2);
        run_ok(&cf, &r);
        for (int s = 0; s < 2; s++)
            REQUIRE(!memcmp(&r.losses[s], &ref.losses[s], 4), "%s step %d: %.9g vs %.9g",
                    files[f], s, (double)r.losses[s], (double)ref.losses[s]);
        fsdp_train_result_free(&r);
    }
    fsdp_train_result_free(&ref);
}
END_TEST

START_TEST(test_sample_deterministic)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    /* a briefly trained byte-level model, so greedy decoding is not flat */
    fsdp_train_config c;
    fsdp_train_result r;
    train_config(&c, BYTE_SPEC, 2, 4);
    c.ckpt_dir = path_in(dir, "ck");
    c.lr = 1e-2f;
    run_ok(&c, &r);
    fsdp_train_result_free(&r);
    const char *text = "123+456=";
    int prompt[32], n_prompt = (int)strlen(text);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (unsigned char)text[i];
    enum { NT = 24 };
    int out[4][NT];
    fsdp_infer_config ic;
    fsdp_infer_config_default(&ic);
    ic.backend = FSDP_BACKEND_CPU;
    ic.model_path = path_in(dir, "ck");
    fsdp_sample_config sc = {.prompt = prompt, .n_prompt = n_prompt, .n_tokens = NT};
    /* greedy on 1 device, twice, and on 3 devices */
    int ranks[4] = {1, 1, 3, 2};
    for (int k = 0; k < 3; k++) {
        ic.n_ranks = ranks[k];
        memset(out[k], 0xff, sizeof out[k]);
        REQUIRE(fsdp_infer_sample(&ic, &sc, out[k], NULL) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        for (int i = 0; i < NT; i++)
            REQUIRE(out[k][i] >= 0 && out[k][i] < 256, "token %d is %d", i, out[k][i]);
        REQUIRE(!memcmp(out[k], out[0], sizeof out[0]), "greedy run %d (%d devices) differs", k,
                ranks[k]);
    }
    /* the context window slides: a prompt longer than --seq still works */
    ic.seq = 8;
    ic.n_ranks = 1;
    REQUIRE(fsdp_infer_sample(&ic, &sc, out[3], NULL) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ic.seq = 0;
    /* temperature: the same seed gives the same tokens on any device count */
    sc.temperature = 1.0f;
    sc.seed = 11;
    ic.n_ranks = 1;
    REQUIRE(fsdp_infer_sample(&ic, &sc, out[1], NULL) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ic.n_ranks = 2;
    REQUIRE(fsdp_infer_sample(&ic, &sc, out[2], NULL) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    REQUIRE(!memcmp(out[1], out[2], sizeof out[1]), "temperature sampling differs by devices");
    /* out-of-vocabulary prompts are refused */
    prompt[0] = 300;
    expect_error(fsdp_infer_sample(&ic, &sc, out[1], NULL), FSDP_STATUS_INVALID_ARG, "bad prompt",
                 "vocabulary", NULL);
}
END_TEST

/* ---- the commands ------------------------------------------------------------------------ */

START_TEST(test_commands)
{
    if (access(FSDP_BIN, X_OK) != 0) {
        printf("SKIP: %s not built\n", FSDP_BIN);
        return;
    }
    char dir[128], out[8192];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    int rc = fsdp_test_cli(out, sizeof out, "convert %s %s", FIXTURE_ST, path_in(dir, "a.bin"));
    REQUIRE(rc == 0 && strstr(out, "converted"), "convert: rc %d: %s", rc, out);
    size_t na, nb;
    unsigned char *a = read_file(path_in(dir, "a.bin"), &na), *b = read_file(FIXTURE_BIN, &nb);
    REQUIRE(na == nb && !memcmp(a, b, na), "fsdp convert .safetensors -> .bin differs from the "
            "reference .bin");
    free(a);
    free(b);
    rc = fsdp_test_cli(out, sizeof out, "convert %s %s --dtype bf16 --to ckpt", FIXTURE_BIN,
                       path_in(dir, "ck"));
    REQUIRE(rc == 2 && strstr(out, "fp32"), "bf16 checkpoint: rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "convert tests/fixtures/no_such.bin %s", path_in(dir, "x.bin"));
    REQUIRE(rc == 1 && strstr(out, "no_such.bin"), "missing input: rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "convert %s", FIXTURE_BIN);
    REQUIRE(rc == 2, "one positional: rc %d", rc);

    write_init_model(path_in(dir, "m.bin"), BYTE_SPEC, 1);
    rc = fsdp_test_cli(out, sizeof out,
                       "eval --model %s --data synthetic --batch 2 --seq 16 --steps 3 "
                       "--devices 2 --backend cpu", path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && !strncmp(out, "mean loss ", 10), "eval: rc %d: %s", rc, out);
    float loss = strtof(out + 10, NULL);
    REQUIRE(loss > 4.0f && loss < 7.0f, "an untrained byte model should be near ln 256: %s",
            out);
    rc = fsdp_test_cli(out, sizeof out, "eval --model %s --backend cpu", path_in(dir, "m.bin"));
    REQUIRE(rc == 2 && strstr(out, "--data"), "eval without data: rc %d: %s", rc, out);
    char s1[8192], s2[8192];
    rc = fsdp_test_cli(s1, sizeof s1, "sample --model %s --prompt 'ab' --tokens 8 --backend cpu",
                       path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && !strncmp(s1, "ab", 2), "sample: rc %d: %s", rc, s1);
    rc = fsdp_test_cli(s2, sizeof s2, "sample --model %s --prompt 'ab' --tokens 8 --devices 3 "
                       "--backend cpu", path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && !strcmp(s1, s2), "sample on 3 devices differs: '%s' vs '%s'", s1, s2);
    rc = fsdp_test_cli(out, sizeof out,
                       "sample --model %s --prompt 'hello' --backend cpu", FIXTURE_BIN);
    REQUIRE(rc == 2 && strstr(out, "token ids"), "text prompt, vocab 200: rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out,
                       "sample --model %s --prompt '5,17' --tokens 4 --backend cpu",
                       FIXTURE_BIN);
    int ids[6], k = sscanf(out, "%d %d %d %d %d %d", &ids[0], &ids[1], &ids[2], &ids[3], &ids[4],
                           &ids[5]);
    REQUIRE(rc == 0 && k == 6 && ids[0] == 5 && ids[1] == 17, "token ids: rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "train --model %s --steps 1 --devices 2 --batch 2 --seq 16 "
                       "--eval 0 --backend cpu --quiet", path_in(dir, "m.bin"));
    REQUIRE(rc == 0 && strstr(out, "final loss"), "train --model FILE: rc %d: %s", rc, out);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"files", 120, .tmpdir = true,
         FSDP_TESTS(test_roundtrip_ckpt_bin_ckpt, test_roundtrip_ckpt_safetensors_ckpt,
                    test_converted_ckpt_resumes, test_hostile_model_files, test_tokenizer)},
        {"infer", 120, .tmpdir = true,
         FSDP_TESTS(test_eval_equals_train_loss, test_infer_allocates_no_training_state,
                    test_train_from_file_equals_same_init, test_sample_deterministic,
                    test_commands)},
    };
    return fsdp_test_main("convert", tcases, FSDP_TEST_LEN(tcases));
}
