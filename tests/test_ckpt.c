/*
 * test_ckpt.c - sharded checkpoints: exact resume (fp32, bf16, optimizer
 * offload), resharding to other world sizes and sharding strategies, crash
 * safety (the trainer is SIGKILLed while a checkpoint is being written),
 * retention, and rejection of hostile files (manifest and shard files)
 * with clear errors, never a crash or a silently partial load.
 *
 * Training runs use a very small GPT-2 on the synthetic task through
 * fsdp_train_run, under --deterministic, so "exact" means bit for bit.
 * Every test works in the suite's scratch directory (testutil.h), removed
 * even when a test fails.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "core/error.h"
#include "core/rng.h"
#include "file_util.h"
#include "engine/shardmap.h"
#include "testutil.h"
#include "train/train.h"
#include "train_util.h"

/* 3 units: root (wte 256x16 ...) and two blocks of 3312 elements. */
#define SPEC "custom:layers=2,heads=2,channels=16,vocab=256,context=16"

/* ---- helpers ---------------------------------------------------------------- */

/* 20 deterministic steps of SPEC, warm-up 4, the parameters kept (runs
 * through train_util.h's run_ok and run_fail). */
static void cfg_init(fsdp_train_config *c, int devices, int batch)
{
    train_config_cpu(c, SPEC, devices);
    c->eng.batch = batch;
    c->eng.deterministic = true;
    c->steps = 20;
    c->warmup = 4;
    c->n_samples = 0;
    c->keep_params = true;
}

static void same_losses(const fsdp_train_result *x, const fsdp_train_result *y, int from, int to)
{
    REQUIRE(x->steps >= to && y->steps >= to, "runs ended early (%d, %d < %d)", x->steps,
            y->steps, to);
    for (int s = from; s < to; s++)
        REQUIRE(!memcmp(&x->losses[s], &y->losses[s], sizeof(float)),
                "step %d: loss %.9g vs %.9g", s + 1, x->losses[s], y->losses[s]);
}

static void same_params(const fsdp_train_result *x, const fsdp_train_result *y,
                        const char *spec)
{
    fsdp_model m;
    ck_assert_int_eq(fsdp_model_from_spec(spec, &m), FSDP_STATUS_OK);
    ck_assert_int_eq(x->n_units, m.n_units);
    ck_assert_int_eq(y->n_units, m.n_units);
    for (int u = 0; u < m.n_units; u++) {
        REQUIRE(x->params[u] && y->params[u], "unit %d: parameters not kept", u);
        for (size_t i = 0; i < m.units[u].numel; i++)
            REQUIRE(!memcmp(&x->params[u][i], &y->params[u][i], sizeof(float)),
                    "unit %d element %zu: %.9g vs %.9g", u, i, x->params[u][i], y->params[u][i]);
    }
    fsdp_model_free(&m);
}

/* A checkpoint fixture: 4 devices, batch 2, 10 of 20 steps, saved at 5, 10. */
static void make_fixture(const char *ck, uint64_t seed)
{
    fsdp_train_config c;
    cfg_init(&c, 4, 2);
    c.eng.seed = seed;
    c.keep_params = false;
    c.ckpt_dir = ck;
    c.ckpt_every = 5;
    c.stop_after = 10;
    fsdp_train_result r;
    run_ok(&c, &r);
    fsdp_train_result_free(&r);
}

/* ---- manifest --------------------------------------------------------------- */

/* A manifest as a 4-rank FULL_SHARD run of SPEC would write it. */
static void manifest_for(fsdp_ckpt_manifest *m, fsdp_model *model, int world)
{
    ck_assert_int_eq(fsdp_model_from_spec(SPEC, model), FSDP_STATUS_OK);
    fsdp_shardmap sm;
    ck_assert_int_eq(fsdp_shardmap_init(&sm, model, world, FSDP_SHARD_FULL), FSDP_STATUS_OK);
    size_t padded[8], shard[8];
    for (int u = 0; u < sm.n_units; u++) {
        padded[u] = sm.units[u].padded_numel;
        shard[u] = sm.units[u].shard_numel;
    }
    memset(m, 0, sizeof *m);
    m->version = FSDP_CKPT_VERSION;
    m->run_id = 0x0123456789abcdefull;
    m->step = 7;
    m->adam_t = 7;
    m->batch = 2;
    m->seq = 16;
    m->grad_accum = 3;
    m->world_size = world;
    m->data_sequences = 7ull * 2 * 3 * (uint64_t)world;
    m->seed = 99;
    snprintf(m->shard, sizeof m->shard, "full");
    m->steps_total = 50;
    snprintf(m->compute_dtype, sizeof m->compute_dtype, "bf16");
    fsdp_ckpt_manifest_set_model(m, model);
    snprintf(m->data, sizeof m->data, "data/with spaces_*.bin");
    ck_assert_int_eq(fsdp_ckpt_manifest_set_units(m, model, padded, shard), FSDP_STATUS_OK);
    for (int u = 0; u < sm.n_units; u++) /* each parameter's rows, as the engine records them */
        for (int i = 0; i < sm.units[u].seg_first[FSDP_SEG_TRAIN + 1]; i++) {
            m->units[u].params[i].shard_rows = sm.units[u].params[i].shard_rows;
            m->units[u].params[i].shard_at = sm.units[u].params[i].shard_off;
        }
    fsdp_shardmap_free(&sm);
}


START_TEST(test_manifest_roundtrip)
{
    char path[128];
    fsdp_test_path(path, sizeof path, "manifest");
    fsdp_ckpt_manifest m, r;
    fsdp_model model;
    manifest_for(&m, &model, 4);
    ck_assert_int_eq(fsdp_ckpt_manifest_write(path, &m), FSDP_STATUS_OK);
    fsdp_status st = fsdp_ckpt_manifest_read(path, &r);
    REQUIRE(st == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_uint_eq(r.run_id, m.run_id);
    ck_assert_uint_eq(r.step, 7);
    ck_assert_uint_eq(r.adam_t, 7);
    ck_assert_uint_eq(r.data_sequences, m.data_sequences);
    ck_assert_uint_eq(r.seed, 99);
    ck_assert_int_eq(r.world_size, 4);
    ck_assert(!r.replicated);
    ck_assert_int_eq(r.grad_accum, 3);
    ck_assert_int_eq(r.steps_total, 50);
    ck_assert_str_eq(r.compute_dtype, "bf16");
    ck_assert_str_eq(r.model_family, "gpt2");
    ck_assert_str_eq(r.model_config, model.config);
    ck_assert_str_eq(r.data, m.data);
    expect_same_units(&r, &m);
    for (int u = 0; u < r.n_units; u++) /* every parameter was read from its line */
        for (int i = 0; i < r.units[u].n_params; i++)
            ck_assert_int_gt(r.units[u].params[i].line, 0);
    ck_assert_int_eq(fsdp_ckpt_manifest_check_model(&r, path, &model), FSDP_STATUS_OK);
    /* no optimizer given: AdamW's lines are written */
    ck_assert_str_eq(r.optimizer, "adamw");
    ck_assert_int_eq(r.n_optim_state, 2);
    ck_assert_str_eq(r.optim_state[1], "adam_v");
    ck_assert_str_eq(r.chat_format, ""); /* optional: written by runs on chat rows only */
    {
        char *text0 = slurp(path);
        ck_assert(!strstr(text0, "chat_format"));
        free(text0);
    }
    fsdp_ckpt_manifest_free(&r);
    /* the chat format a run rendered {"messages"} rows with round-trips; a bad name is
     * FORMAT naming the key */
    snprintf(m.chat_format, sizeof m.chat_format, "llama3");
    ck_assert_int_eq(fsdp_ckpt_manifest_write(path, &m), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &r), FSDP_STATUS_OK);
    ck_assert_str_eq(r.chat_format, "llama3");
    fsdp_ckpt_manifest_free(&r);
    {
        char *good = slurp(path), *bad = mutate(good, "chat_format llama3\n",
                                                 "chat_format llama 3!\n");
        spit(path, bad, strlen(bad));
        st = fsdp_ckpt_manifest_read(path, &r);
        REQUIRE(st == FSDP_STATUS_FORMAT && strstr(fsdp_error_msg(), "chat_format"), "%s",
                fsdp_error_msg());
        free(good);
        free(bad);
    }
    m.chat_format[0] = '\0';
    /* another optimizer's lines round-trip; a version-2 manifest without
     * them is refused (version 1, which predates them, reads as AdamW:
     * test_compat) */
    snprintf(m.optimizer, sizeof m.optimizer, "sgd");
    m.n_optim_state = 1;
    snprintf(m.optim_state[0], sizeof m.optim_state[0], "momentum");
    ck_assert_int_eq(fsdp_ckpt_manifest_write(path, &m), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &r), FSDP_STATUS_OK);
    ck_assert_str_eq(r.optimizer, "sgd");
    ck_assert_int_eq(r.n_optim_state, 1);
    ck_assert_str_eq(r.optim_state[0], "momentum");
    fsdp_ckpt_manifest_free(&r);
    char *text = slurp(path), *t1 = mutate(text, "optimizer sgd\n", "");
    char *t2 = mutate(t1, "optim_state momentum\n", "");
    spit(path, t2, strlen(t2));
    st = fsdp_ckpt_manifest_read(path, &r);
    ck_assert_int_eq(st, FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "key 'optimizer' is missing"), "%s", fsdp_error_msg());
    free(text);
    free(t1);
    free(t2);

    /* a model with other shapes: FORMAT naming the file and the line */
    fsdp_model other;
    ck_assert_int_eq(fsdp_model_from_spec("custom:layers=2,heads=2,channels=32,vocab=256,"
                                          "context=16", &other), FSDP_STATUS_OK);
    st = fsdp_ckpt_manifest_check_model(&r, path, &other);
    ck_assert_int_eq(st, FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), path) && strstr(fsdp_error_msg(), "line") &&
                strstr(fsdp_error_msg(), "--model"), "%s", fsdp_error_msg());
    fsdp_model_free(&other);
    /* fewer units */
    ck_assert_int_eq(fsdp_model_from_spec("custom:layers=1,heads=2,channels=16,vocab=256,"
                                          "context=16", &other), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_manifest_check_model(&r, path, &other), FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), "units"), "%s", fsdp_error_msg());
    fsdp_model_free(&other);

    fsdp_ckpt_manifest_free(&r);
    fsdp_ckpt_manifest_free(&m);
    fsdp_model_free(&model);
}
END_TEST

START_TEST(test_manifest_hostile)
{
    char good[128], bad[128];
    fsdp_test_path(good, sizeof good, "manifest");
    fsdp_test_path(bad, sizeof bad, "bad_manifest");
    fsdp_ckpt_manifest m;
    fsdp_model model;
    manifest_for(&m, &model, 4);
    ck_assert_int_eq(fsdp_ckpt_manifest_write(good, &m), FSDP_STATUS_OK);
    char *text = slurp(good);
    char longline[3000];
    memset(longline, 'x', sizeof longline - 1);
    longline[sizeof longline - 1] = '\0';
    memcpy(longline, "data ", 5);
    static const struct {
        const char *old, *new, *expect;
    } cases[] = {
        {"version 4\n", "version 5\n", "version 5 is not supported"},
        /* version 4's rows per shard file */
        {"numel 4096 rows 64 at 0\n", "numel 4096 rows 0 at 0\n", "rows 1 to its 256 rows"},
        {"numel 4096 rows 64 at 0\n", "numel 4096 rows 257 at 0\n", "rows 1 to its 256 rows"},
        {"numel 4096 rows 64 at 0\n", "numel 4096 rows 63 at 0\n", "do not hold"},
        {"numel 4096 rows 64 at 0\n", "numel 4096\n", "rows <n> at <n>"},
        {"numel 4096 rows 64 at 0\n", "numel 4096 rows 64 at 1\n", "overlap"},
        {"numel 4096 rows 64 at 0\n", "numel 4096 rows 64 at x\n", "rows and at"},
        {"format fsdp-checkpoint\n", "format something-else\n", "format"},
        {"world_size 4\n", "world_size 0\n", "world_size"},
        {"world_size 4\n", "world_size 99999999999999999999999\n", "world_size"},
        {"step 7\n", "step -7\n", "step"},
        {"step 7\n", "step 7\nstep 7\n", "appears twice"},
        {"seed 99\n", "", "'seed' is missing"},
        {"seed 99\n", "seed 99\nlearning_rate 3\n", "unknown key"},
        {"data_sequences ", "data_sequences 1", "data_sequences"},
        {"run_id 0123456789abcdef", "run_id 0123456789abcdeg", "run_id"},
        {"shard full", "shard half", "shard"},
        {"model_config layers=2", "model_config layers=0", "does not build"},
        {"block_numel 65536", "block_numel 4096", "block_numel"},
        {"master_dtype fp32", "master_dtype bf16", "master_dtype"},
        {"units 3\n", "units 1000000\n", "lines left"},
        {"units 3\n", "units 0\n", "units"},
        {"shard 1312 params", "shard 1311 params", "does not split"},
        {"numel 4384 padded", "numel 99999999999999 padded", "numel"},
        {"params 4\n", "params 3\n", "parameters hold"},
        {"shape 256,16", "shape 256,17", "product"},
        {"shape 256,16", "shape 256,,16", "shape"},
        {"shape 256,16", "shape 1,1,1,1,256,16", "shape"},
        {"shape 256,16", "shape 18446744073709551615,16", "shape"},
        {"offset 4096 numel", "offset 4097 numel", "offset"},
        {"param wte.weight", "param wte/weight", "parameter name"},
        {"unit 1 h.0", "unit 2 h.0", "unit index"},
        {"\nend\n", "\n", "ends before 'end'"},
        {"\nend\n", "\nend\nunit 9\n", "after 'end'"},
        {"model_name ", "model_name \x01", "control character"},
        {"steps_total 50\n", "steps_total 50\nmodel_name x\n", "appears twice"},
        {"optim_state adam_m,adam_v\n", "", "key 'optim_state' is missing"},
        {"optimizer adamw\n", "", "key 'optimizer' is missing"},
        {"optim_state adam_m,adam_v", "optim_state adam_m,adam_m", "twice"},
        {"optim_state adam_m,adam_v", "optim_state master", "master"},
        {"optim_state adam_m,adam_v", "optim_state adam_m,,adam_v", "optim_state name"},
        {"optim_state adam_m,adam_v", "optim_state a,b,c,d,e,f,g,h", "more than"},
        {"optimizer adamw", "optimizer Adam!", "optimizer"},
    };
    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n_cases + 4; i++) {
        char *t;
        if (i < n_cases) {
            t = mutate(text, cases[i].old, cases[i].new);
        } else if (i == n_cases) {
            t = strdup(""); /* empty */
        } else if (i == n_cases + 1) {
            t = strdup(text);
            t[strlen(t) / 2] = '\0'; /* truncated */
        } else if (i == n_cases + 2) {
            t = mutate(text, "data data/with spaces_*.bin", longline);
        } else {
            t = malloc(4096); /* binary garbage */
            for (int k = 0; k < 4096; k++)
                t[k] = (char)(fsdp_rng_u64(1, 2, (uint64_t)k) | 1);
            t[4095] = '\0';
        }
        spit(bad, t, strlen(t));
        fsdp_ckpt_manifest r;
        fsdp_status st = fsdp_ckpt_manifest_read(bad, &r);
        const char *msg = fsdp_error_msg();
        REQUIRE(st == FSDP_STATUS_FORMAT, "case %d: expected FORMAT, got %s (%s)", i,
                fsdp_status_name(st), msg);
        REQUIRE(strstr(msg, bad) && strstr(msg, " line "), "case %d: message lacks the file and "
                "line: %s", i, msg);
        REQUIRE(i >= n_cases || strstr(msg, cases[i].expect), "case %d: message lacks '%s': %s",
                i, cases[i].expect, msg);
        REQUIRE(r.units == NULL && r.n_units == 0, "case %d: manifest left allocated", i);
        free(t);
    }
    /* missing file: a clear error, not a crash */
    fsdp_test_path(bad, sizeof bad, "nope");
    fsdp_ckpt_manifest r;
    ck_assert_int_ne(fsdp_ckpt_manifest_read(bad, &r), FSDP_STATUS_OK);
    REQUIRE(strstr(fsdp_error_msg(), bad), "%s", fsdp_error_msg());
    free(text);
    fsdp_ckpt_manifest_free(&m);
    fsdp_model_free(&model);
}
END_TEST

/* Issue 29, 7: a manifest whose model config disagreed with its shards
 * (heads 2 for 4: the same shapes) was exported by `fsdp convert` without a
 * word. Version 3 ends with the XXH64 of its text, and every reader refuses
 * a manifest that does not match it; a version-2 manifest (no checksum)
 * still reads, and may not carry one. */
START_TEST(test_manifest_checksum)
{
    char path[128];
    fsdp_test_path(path, sizeof path, "manifest");
    fsdp_ckpt_manifest m, r;
    fsdp_model model;
    manifest_for(&m, &model, 4);
    snprintf(m.tokenizer, sizeof m.tokenizer, "tok/tokenizer.json");
    ck_assert_int_eq(fsdp_ckpt_manifest_write(path, &m), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &r), FSDP_STATUS_OK);
    ck_assert_int_eq(r.version, FSDP_CKPT_VERSION);
    ck_assert(r.tokenizer_recorded);
    ck_assert_str_eq(r.tokenizer, "tok/tokenizer.json");
    fsdp_ckpt_manifest_free(&r);
    char *text = slurp(path);
    const char *sum = strstr(text, "\nend\nchecksum ");
    REQUIRE(sum && strlen(sum) == strlen("\nend\nchecksum ") + 17, "%s", text);
    static const struct {
        const char *old, *new, *expect;
    } cases[] = {
        /* the same shapes: only the checksum can tell */
        {"model_config layers=2,heads=2,", "model_config layers=2,heads=4,", "does not match"},
        {"data data/with", "data data/With", "edited or is corrupt"},
        {"\nend\nchecksum ", "\nend\nchecksum 0", "16 lower-case hex"},
        {"\nend\nchecksum ", "\nend\n# ", "ends without its 'checksum' line"},
        /* version 2: no tokenizer line, no checksum; one is refused */
        {"version 4\n", "version 2\n", "'tokenizer' is not part of a version-2 manifest"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = mutate(text, cases[i].old, cases[i].new);
        spit(path, t, strlen(t));
        fsdp_status st = fsdp_ckpt_manifest_read(path, &r);
        REQUIRE(st == FSDP_STATUS_FORMAT && strstr(fsdp_error_msg(), path) &&
                    strstr(fsdp_error_msg(), " line ") && strstr(fsdp_error_msg(), cases[i].expect),
                "case %zu: %s: %s", i, fsdp_status_name(st), fsdp_error_msg());
        ck_assert_ptr_null(r.units);
        free(t);
    }
    char *v2 = mutate(text, "version 4\n", "version 2\n");
    for (char *rows; (rows = strstr(v2, " rows "));) /* version 2's parameter lines */
        memmove(rows, strchr(rows, '\n'), strlen(strchr(rows, '\n')) + 1);
    char *v2b = mutate(v2, "tokenizer tok/tokenizer.json\n", "");
    spit(path, v2b, strlen(v2b));
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &r), FSDP_STATUS_FORMAT);
    REQUIRE(strstr(fsdp_error_msg(), "'checksum' is not part of a version-2 manifest"), "%s",
            fsdp_error_msg());
    *strstr(v2b, "\nend\nchecksum ") = '\0';
    strcat(v2b, "\nend\n");
    spit(path, v2b, strlen(v2b));
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &r), FSDP_STATUS_OK);
    ck_assert_int_eq(r.version, 2);
    ck_assert(!r.tokenizer_recorded);
    fsdp_ckpt_manifest_free(&r);
    free(v2);
    free(v2b);
    free(text);
    fsdp_ckpt_manifest_free(&m);
    fsdp_model_free(&model);
}
END_TEST

/* The same through the commands: a checkpoint whose manifest was edited to
 * other heads (same shapes) is refused by convert, eval, sample and resume. */
START_TEST(test_edited_manifest_refused_everywhere)
{
    char dir[128], man[192], out[8192];
    fsdp_test_mkdir(dir, sizeof dir, "edited");
    const char *run = "--model tiny --devices 1 --batch 2 --seq 8 --eval 0 --quiet";
    int rc = fsdp_test_cli(out, sizeof out, "train %s --steps 1 --ckpt-dir %s/ck", run, dir);
    ck_assert_msg(rc == 0, "%s", out);
    pathf(man, sizeof man, "%s/ck/step_00000001/manifest", dir);
    char *text = slurp(man), *t = mutate(text, ",heads=4,", ",heads=2,");
    spit(man, t, strlen(t));
    free(t);
    free(text);
    char cmds[4][512];
    pathf(cmds[0], sizeof cmds[0], "convert %s/ck %s/x.safetensors", dir, dir);
    pathf(cmds[1], sizeof cmds[1], "eval --model %s/ck --data synthetic --seq 8 --steps 1", dir);
    pathf(cmds[2], sizeof cmds[2], "sample --model %s/ck --ids --prompt 1 --tokens 1", dir);
    pathf(cmds[3], sizeof cmds[3], "train %s --steps 2 --ckpt-dir %s/ck --resume", run, dir);
    for (int i = 0; i < 4; i++) {
        rc = fsdp_test_cli(out, sizeof out, "%s", cmds[i]);
        REQUIRE(rc == 1 && strstr(out, man) && strstr(out, "checksum"), "'%s': exit %d: %s",
                cmds[i], rc, out);
    }
    pathf(man, sizeof man, "%s/x.safetensors", dir);
    ck_assert_int_ne(access(man, F_OK), 0);
}
END_TEST

/* Issue 29, 9: --resume silently accepted other --data or --tokenizer than
 * the checkpoint was trained on (a note hidden by --quiet), continuing at
 * a data position that belongs to other data. Now it is refused unless
 * --allow-data-change; the same file spelled another way is the same. */
START_TEST(test_resume_other_data)
{
    char dir[128], a[160], b[160], tok2[160], out[8192];
    fsdp_test_mkdir(dir, sizeof dir, "data");
    pathf(a, sizeof a, "%s/a.jsonl", dir);
    pathf(b, sizeof b, "%s/b.jsonl", dir);
    pathf(tok2, sizeof tok2, "%s/tok.json", dir);
    FILE *fa = fopen(a, "w"), *fb = fopen(b, "w");
    for (int i = 0; i < 20; i++) {
        fprintf(fa, "{\"text\": \"row %d of the first corpus\"}\n", i);
        fprintf(fb, "{\"text\": \"row %d of another corpus\"}\n", i);
    }
    fclose(fa);
    fclose(fb);
    char cp[512];
    pathf(cp, sizeof cp, "cp tests/fixtures/tok_gpt2.json %s", tok2);
    ck_assert_int_eq(system(cp), 0);
    const char *run = "--model custom:layers=1,heads=2,channels=32,vocab=704,context=16 "
                      "--devices 1 --batch 2 --seq 16 --quiet";
    int rc = fsdp_test_cli(out, sizeof out, "train %s --data %s --tokenizer "
                           "tests/fixtures/tok_gpt2.json --steps 1 --ckpt-dir %s/ck", run, a, dir);
    ck_assert_msg(rc == 0, "%s", out);
    rc = fsdp_test_cli(out, sizeof out, "train %s --data %s --tokenizer "
                       "tests/fixtures/tok_gpt2.json --steps 2 --ckpt-dir %s/ck --resume", run, b,
                       dir);
    ck_assert_msg(rc == 2 && strstr(out, "was trained on --data") && strstr(out, a) &&
                      strstr(out, b) && strstr(out, "--allow-data-change"), "%d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "train %s --data %s --tokenizer %s --steps 2 "
                       "--ckpt-dir %s/ck --resume", run, a, tok2, dir);
    ck_assert_msg(rc == 2 && strstr(out, tok2) && strstr(out, "--allow-data-change"), "%d: %s",
                  rc, out);
    rc = fsdp_test_cli(out, sizeof out, "train %s --data %s/./a.jsonl --tokenizer "
                       "tests/fixtures/../fixtures/tok_gpt2.json --steps 2 --ckpt-dir %s/ck "
                       "--resume", run, dir, dir);
    ck_assert_msg(rc == 0, "the same files spelled otherwise: %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "train %s --data %s --tokenizer "
                       "tests/fixtures/tok_gpt2.json --steps 3 --ckpt-dir %s/ck --resume "
                       "--allow-data-change", run, b, dir);
    ck_assert_msg(rc == 0, "%d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "train %s --data %s --allow-data-change", run, b);
    ck_assert_msg(rc == 2 && strstr(out, "only applies with --resume"), "%d: %s", rc, out);
}
END_TEST

/* ---- exact resume ----------------------------------------------------------------- */

START_TEST(test_resume_exact)
{
    static const struct {
        const char *name;
        bool offload;
        fsdp_dtype dt;
        fsdp_shard_strategy shard;
        int accum;
        float clip;
    } variants[] = {
        {"fp32", false, FSDP_DTYPE_F32, FSDP_SHARD_FULL, 1, 1.0f},
        {"offload optimizer", true, FSDP_DTYPE_F32, FSDP_SHARD_FULL, 1, 1.0f},
        {"offload, no clip", true, FSDP_DTYPE_F32, FSDP_SHARD_FULL, 1, 0.0f},
        {"bf16", false, FSDP_DTYPE_BF16, FSDP_SHARD_FULL, 1, 1.0f},
        {"bf16 + offload", true, FSDP_DTYPE_BF16, FSDP_SHARD_FULL, 1, 1.0f},
        {"grad-op, accum 2", false, FSDP_DTYPE_F32, FSDP_SHARD_GRAD_OP, 2, 1.0f},
    };
    for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
        char ck[96];
        fsdp_test_path(ck, sizeof ck, "ck");
        fsdp_train_config c;
        cfg_init(&c, 4, 2 / variants[k].accum);
        c.eng.offload = variants[k].offload;
        c.eng.compute_dtype = variants[k].dt;
        c.eng.shard = variants[k].shard;
        c.eng.grad_accum = variants[k].accum;
        c.eng.clip = variants[k].clip;
        fsdp_train_result straight, first, second;
        run_ok(&c, &straight);

        c.ckpt_dir = ck;
        c.ckpt_every = 10;
        c.stop_after = 10;
        run_ok(&c, &first);
        ck_assert_int_eq(first.steps, 10);
        same_losses(&straight, &first, 0, 10);

        c.stop_after = 0;
        c.resume = true;
        run_ok(&c, &second);
        REQUIRE(second.first_step == 10 && second.steps == 20, "%s: resumed at %d, ran to %d",
                variants[k].name, second.first_step, second.steps);
        same_losses(&straight, &second, 10, 20);
        same_params(&straight, &second, SPEC);
        /* the final checkpoint was written too */
        char p[128];
        pathf(p, sizeof p, "%s/step_00000020", ck);
        REQUIRE(fsdp_ckpt_is_complete(p), "%s: no final checkpoint", variants[k].name);
        fsdp_train_result_free(&straight);
        fsdp_train_result_free(&first);
        fsdp_train_result_free(&second);
    }
}
END_TEST

/* ---- resharding ------------------------------------------------------------------- */

/* The global batch stays 16 sequences in micro-batches of 2 (the engine's
 * bit-identity across world sizes holds for a fixed micro-batch size:
 * a micro-batch's gradient is summed over its rows inside the matmuls),
 * so 4 devices x accum 2 continue as 1 x 8, 2 x 4 or 8 x 1. */
START_TEST(test_reshard_continue)
{
    char dir[128], ck[96], ck_none[96];
    fsdp_test_mkdir(dir, sizeof dir, "ckpt");
    pathf(ck, sizeof ck, "%s/ck4", dir);
    pathf(ck_none, sizeof ck_none, "%s/ck_none", dir);
    fsdp_train_config c;
    fsdp_train_result straight, r;
    cfg_init(&c, 4, 2);
    c.eng.grad_accum = 2;
    run_ok(&c, &straight);
    c.ckpt_dir = ck;
    c.stop_after = 10;
    c.ckpt_every = 10;
    c.keep_params = false;
    run_ok(&c, &r);
    fsdp_train_result_free(&r);
    /* a NO_SHARD checkpoint (every file holds whole units) from 2 devices */
    cfg_init(&c, 2, 2);
    c.eng.grad_accum = 4;
    c.eng.shard = FSDP_SHARD_NONE;
    c.ckpt_dir = ck_none;
    c.stop_after = 10;
    c.ckpt_every = 10;
    c.keep_params = false;
    run_ok(&c, &r);
    same_losses(&straight, &r, 0, 10);
    fsdp_train_result_free(&r);

    static const struct {
        int devices, batch, accum;
        fsdp_shard_strategy shard;
        bool offload, from_none;
    } to[] = {
        {1, 2, 8, FSDP_SHARD_FULL, false, false},
        {2, 2, 4, FSDP_SHARD_FULL, false, false},
        {8, 2, 1, FSDP_SHARD_FULL, false, false},
        {2, 2, 4, FSDP_SHARD_NONE, false, false},
        {8, 2, 1, FSDP_SHARD_GRAD_OP, true, false},
        {4, 2, 2, FSDP_SHARD_FULL, false, true},
        {1, 2, 8, FSDP_SHARD_FULL, true, true},
    };
    for (size_t k = 0; k < sizeof to / sizeof to[0]; k++) {
        /* each resume writes step 20 into the directory: start from a copy */
        char work[128], src[160], dst[160];
        pathf(work, sizeof work, "%s/work%zu", dir, k);
        ck_assert_int_eq(mkdir(work, 0755), 0);
        pathf(dst, sizeof dst, "%s/step_00000010", work);
        ck_assert_int_eq(mkdir(dst, 0755), 0);
        const char *from = to[k].from_none ? ck_none : ck;
        int n_files = to[k].from_none ? 2 : 4;
        const char *names[] = {"manifest", "DONE", "rank_00000.bin", "rank_00001.bin",
                               "rank_00002.bin", "rank_00003.bin"};
        for (int f = 0; f < 2 + n_files; f++) {
            pathf(src, sizeof src, "%s/step_00000010/%s", from, names[f]);
            pathf(dst, sizeof dst, "%s/step_00000010/%s", work, names[f]);
            copy_file(src, dst);
        }
        cfg_init(&c, to[k].devices, to[k].batch);
        c.eng.grad_accum = to[k].accum;
        c.eng.shard = to[k].shard;
        c.eng.offload = to[k].offload;
        c.ckpt_dir = work;
        c.resume = true;
        run_ok(&c, &r);
        REQUIRE(r.first_step == 10, "case %zu: resumed at %d", k, r.first_step);
        same_losses(&straight, &r, 10, 20);
        same_params(&straight, &r, SPEC);
        fsdp_train_result_free(&r);
    }
    fsdp_train_result_free(&straight);
}
END_TEST

/* Loading alone (no steps left to run) gives back exactly the saved
 * parameters in any world size, including ones that split units unevenly
 * and a model whose shards span several checksum blocks. */
START_TEST(test_reshard_load_exact)
{
    /* the second model's block unit (77840 elements) spans two checksum
     * blocks when saved by one device */
    static const char *const specs[] = {
        SPEC, "custom:layers=1,heads=2,channels=80,vocab=256,context=16"};
    static const int worlds[][2] = {{4, 6}, {1, 24}, {3, 8}, {6, 4}, {8, 3}, {12, 2}};
    for (int sp = 0; sp < 2; sp++) {
        char ck[96];
        fsdp_test_path(ck, sizeof ck, "ck");
        fsdp_train_config c;
        fsdp_train_result saved, r;
        cfg_init(&c, worlds[sp][0], worlds[sp][1]);
        c.model = specs[sp];
        c.steps = 2;
        c.ckpt_dir = ck;
        run_ok(&c, &saved);
        for (int k = 0; k < 6; k++) {
            if (k == sp)
                continue;
            cfg_init(&c, worlds[k][0], worlds[k][1]);
            c.model = specs[sp];
            c.steps = 2;
            c.ckpt_dir = ck;
            c.resume = true;
            c.eng.shard = k == 2 ? FSDP_SHARD_NONE : FSDP_SHARD_FULL;
            run_ok(&c, &r);
            ck_assert_int_eq(r.first_step, 2);
            same_params(&saved, &r, specs[sp]);
            fsdp_train_result_free(&r);
        }
        fsdp_train_result_free(&saved);
    }
}
END_TEST

/* ---- crash safety ------------------------------------------------------------------ */

START_TEST(test_crash_during_save)
{
    char ck[96], part[160], p[160];
    fsdp_test_path(ck, sizeof ck, "ck");
    pathf(part, sizeof part, "%s/step_00000010.tmp/rank_00000.bin", ck);
    fsdp_train_config c;
    cfg_init(&c, 4, 2);
    c.ckpt_dir = ck;
    c.ckpt_every = 5;
    c.keep_params = false;
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* the child trains and stalls inside the step-10 save until killed */
        fsdp_ckpt_test_set_stall(10, 120000);
        fsdp_train_result r;
        fsdp_status st = fsdp_train_run(&c, &r);
        _exit(st == FSDP_STATUS_OK ? 0 : 3);
    }
    int ws = 0;
    bool mid_write = false;
    for (int i = 0; i < 6000 && !mid_write; i++) {
        if (exists(part)) {
            mid_write = true;
            break;
        }
        pid_t w = waitpid(pid, &ws, WNOHANG);
        REQUIRE(w == 0, "the trainer exited early (status %d)", ws);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (!mid_write)
        kill(pid, SIGKILL);
    REQUIRE(mid_write, "the step-10 checkpoint never started");
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    REQUIRE(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL, "the trainer was not killed (%d)", ws);

    /* on disk: step 5 complete, step 10 only as a partial .tmp */
    pathf(p, sizeof p, "%s/step_00000005", ck);
    ck_assert(fsdp_ckpt_is_complete(p));
    pathf(p, sizeof p, "%s/step_00000010", ck);
    ck_assert(!exists(p));
    pathf(p, sizeof p, "%s/step_00000010.tmp/DONE", ck);
    ck_assert(!exists(p));
    uint64_t step = 0;
    bool found = false;
    ck_assert_int_eq(fsdp_ckpt_latest(ck, &step, &found), FSDP_STATUS_OK);
    ck_assert(found);
    ck_assert_uint_eq(step, 5);

    /* resuming picks step 5 and ends exactly where an uninterrupted run does */
    fsdp_train_result resumed, straight;
    c.resume = true;
    c.keep_params = true;
    run_ok(&c, &resumed);
    ck_assert_int_eq(resumed.first_step, 5);
    cfg_init(&c, 4, 2);
    run_ok(&c, &straight);
    same_losses(&straight, &resumed, 5, 20);
    same_params(&straight, &resumed, SPEC);
    /* the partial directory was cleaned up by the next save */
    pathf(p, sizeof p, "%s/step_00000010.tmp", ck);
    ck_assert(!exists(p));
    pathf(p, sizeof p, "%s/step_00000010", ck);
    ck_assert(fsdp_ckpt_is_complete(p));
    fsdp_train_result_free(&resumed);
    fsdp_train_result_free(&straight);
}
END_TEST

/* ---- hostile checkpoints ------------------------------------------------------------- */

enum corruption {
    C_TRUNCATE, C_PAYLOAD, C_MAGIC, C_VERSION, C_HEADER, C_OTHER_RUN, C_OTHER_STEP,
    C_MISSING_SHARD, C_MISSING_MANIFEST, C_MANIFEST_GARBAGE, C_MANIFEST_STEP, C_COUNT
};

START_TEST(test_hostile_checkpoints)
{
    char dir[128], other[96];
    fsdp_test_mkdir(dir, sizeof dir, "ckpt");
    pathf(other, sizeof other, "%s/other", dir);
    make_fixture(other, 1337); /* another run, same settings */
    static const struct {
        const char *file;      /* in step_00000010 */
        const char *expect;    /* message fragment */
        fsdp_status st;
        int devices, batch;    /* the resuming world */
    } cases[C_COUNT] = {
        [C_TRUNCATE] = {"rank_00002.bin", "truncated", FSDP_STATUS_FORMAT, 4, 2},
        [C_PAYLOAD] = {"rank_00001.bin", "checksum", FSDP_STATUS_FORMAT, 1, 8},
        [C_MAGIC] = {"rank_00000.bin", "bad magic", FSDP_STATUS_FORMAT, 2, 4},
        [C_VERSION] = {"rank_00003.bin", "version", FSDP_STATUS_FORMAT, 4, 2},
        [C_HEADER] = {"rank_00003.bin", "header checksum", FSDP_STATUS_FORMAT, 8, 1},
        [C_OTHER_RUN] = {"rank_00002.bin", "another checkpoint", FSDP_STATUS_FORMAT, 4, 2},
        [C_OTHER_STEP] = {"rank_00001.bin", "another checkpoint", FSDP_STATUS_FORMAT, 4, 2},
        [C_MISSING_SHARD] = {"rank_00003.bin", "missing", FSDP_STATUS_FORMAT, 2, 4},
        [C_MISSING_MANIFEST] = {"manifest", "manifest", FSDP_STATUS_FORMAT, 4, 2},
        [C_MANIFEST_GARBAGE] = {"manifest", "line", FSDP_STATUS_FORMAT, 4, 2},
        [C_MANIFEST_STEP] = {"manifest", "step", FSDP_STATUS_FORMAT, 4, 2},
    };
    for (int k = 0; k < C_COUNT; k++) {
        char ck[96], f[160], src[160];
        pathf(ck, sizeof ck, "%s/ck%d", dir, k);
        make_fixture(ck, 1337);
        pathf(f, sizeof f, "%s/step_00000010/%s", ck, cases[k].file);
        switch ((enum corruption)k) {
        case C_TRUNCATE: ck_assert_int_eq(truncate(f, 5000), 0); break;
        case C_PAYLOAD: { /* byte 9 of the first unit's master: real rows of wte.weight */
            fsdp_ckpt_manifest man;
            char mp[192];
            pathf(mp, sizeof mp, "%s/step_00000010/manifest", ck);
            ck_assert_int_eq(fsdp_ckpt_manifest_read(mp, &man), FSDP_STATUS_OK);
            long from_end = -9;
            for (int u = 0; u < man.n_units; u++)
                from_end += 3 * (long)man.units[u].shard_numel * 4; /* master, adam_m, adam_v */
            fsdp_ckpt_manifest_free(&man);
            flip_byte(f, from_end, true);
            break;
        }
        case C_MAGIC: flip_byte(f, 3, false); break;
        case C_VERSION: set_u32(f, 8, 7); break;
        case C_HEADER: flip_byte(f, 44, false); break; /* step field */
        case C_OTHER_RUN:
            pathf(src, sizeof src, "%s/step_00000010/%s", other, cases[k].file);
            copy_file(src, f);
            break;
        case C_OTHER_STEP:
            pathf(src, sizeof src, "%s/step_00000005/%s", ck, cases[k].file);
            copy_file(src, f);
            break;
        case C_MISSING_SHARD:
        case C_MISSING_MANIFEST: ck_assert_int_eq(unlink(f), 0); break;
        case C_MANIFEST_GARBAGE: {
            char *t = slurp(f), *u = mutate(t, "\nunits 3\n", "\nunits three\n");
            spit(f, u, strlen(u));
            free(t);
            free(u);
            break;
        }
        case C_MANIFEST_STEP: {
            char *t = slurp(f), *u = mutate(t, "\nstep 10\n", "\nstep 5\n");
            char *v = mutate(u, "data_sequences 80", "data_sequences 40");
            spit(f, v, strlen(v));
            free(t);
            free(u);
            free(v);
            break;
        }
        default: break;
        }
        fsdp_train_config c;
        cfg_init(&c, cases[k].devices, cases[k].batch);
        c.ckpt_dir = ck;
        c.resume = true;
        c.keep_params = false;
        /* the error names the damaged file (or, for a missing manifest,
         * its path) and what is wrong */
        run_fail(&c, cases[k].st, cases[k].expect, cases[k].file);
        /* nothing was committed on top of the damaged checkpoint */
        pathf(f, sizeof f, "%s/step_00000020", ck);
        REQUIRE(!exists(f), "case %d: training went on after a failed load", k);
        fsdp_test_rm_rf(ck);
    }

    /* a manifest that does not match the model: FORMAT naming the line */
    char ck[96], p[160];
    pathf(ck, sizeof ck, "%s/ck_model", dir);
    make_fixture(ck, 1337);
    fsdp_train_config c;
    cfg_init(&c, 4, 2);
    c.model = "custom:layers=2,heads=2,channels=32,vocab=256,context=16";
    c.ckpt_dir = ck;
    c.resume = true;
    run_fail(&c, FSDP_STATUS_FORMAT, "line", "--model");
    /* settings the data position depends on */
    cfg_init(&c, 4, 1);
    c.ckpt_dir = ck;
    c.resume = true;
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "global batch", "--grad-accum");
    cfg_init(&c, 4, 2);
    c.eng.seq = 8;
    c.ckpt_dir = ck;
    c.resume = true;
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "--seq 16", NULL);
    cfg_init(&c, 4, 2);
    c.eng.seed = 5;
    c.ckpt_dir = ck;
    c.resume = true;
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "--seed 1337", NULL);
    /* a fresh run refuses a directory that holds checkpoints */
    cfg_init(&c, 4, 2);
    c.ckpt_dir = ck;
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "--resume", NULL);

    /* incomplete checkpoints are ignored: a newer step without DONE, and a
     * leftover .tmp; resuming uses step 10 and cleans the .tmp up */
    pathf(p, sizeof p, "%s/step_00000015", ck);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    pathf(p, sizeof p, "%s/step_00000015/manifest", ck);
    spit(p, "garbage\n", 8);
    pathf(p, sizeof p, "%s/step_00000017.tmp", ck);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    pathf(p, sizeof p, "%s/step_00000017.tmp/rank_00000.bin", ck);
    spit(p, "partial", 7);
    pathf(p, sizeof p, "%s/step_00000010/DONE", ck);
    ck_assert_int_eq(unlink(p), 0); /* step 10 incomplete too: falls back to 5 */
    cfg_init(&c, 4, 2);
    c.ckpt_dir = ck;
    c.resume = true;
    c.stop_after = 12;
    c.ckpt_every = 6;
    fsdp_train_result r;
    run_ok(&c, &r);
    ck_assert_int_eq(r.first_step, 5);
    fsdp_train_result_free(&r);
    pathf(p, sizeof p, "%s/step_00000017.tmp", ck);
    ck_assert(!exists(p));
    pathf(p, sizeof p, "%s/step_00000012", ck);
    ck_assert(fsdp_ckpt_is_complete(p));
}
END_TEST

/* ---- retention, memory, fresh starts -------------------------------------------------- */

START_TEST(test_retention_and_memory)
{
    char ck[96], p[160];
    fsdp_test_path(ck, sizeof ck, "a/b/ck"); /* parents are created */
    fsdp_train_config c;
    fsdp_train_result plain, saved;
    cfg_init(&c, 4, 2);
    c.steps = 10;
    c.keep_params = false;
    run_ok(&c, &plain);
    c.ckpt_dir = ck;
    c.ckpt_every = 2;
    c.ckpt_keep = 2;
    run_ok(&c, &saved);
    /* only the two newest remain, and nothing temporary */
    ck_assert_int_eq(count_entries(ck), 2);
    pathf(p, sizeof p, "%s/step_00000008", ck);
    ck_assert(fsdp_ckpt_is_complete(p));
    pathf(p, sizeof p, "%s/step_00000010", ck);
    ck_assert(fsdp_ckpt_is_complete(p));
    /* files: manifest, DONE, one per rank */
    ck_assert_int_eq(count_entries(p), 6);
    /* saving allocates no device memory: the peak is the training peak */
    for (int k = 0; k < 4; k++)
        REQUIRE(saved.stats[k].peak_bytes == plain.stats[k].peak_bytes,
                "rank %d: peak %zu with checkpoints, %zu without", k, saved.stats[k].peak_bytes,
                plain.stats[k].peak_bytes);
    same_losses(&plain, &saved, 0, 10);
    fsdp_train_result_free(&plain);
    fsdp_train_result_free(&saved);

    /* --resume with no checkpoint starts from step 0 */
    fsdp_test_path(ck, sizeof ck, "empty");
    cfg_init(&c, 2, 4);
    c.steps = 3;
    c.ckpt_dir = ck;
    c.resume = true;
    run_ok(&c, &saved);
    ck_assert_int_eq(saved.first_step, 0);
    ck_assert_int_eq(saved.steps, 3);
    fsdp_train_result_free(&saved);
    /* the meta backend has nothing to save */
    cfg_init(&c, 2, 4);
    c.eng.backend = FSDP_BACKEND_META;
    c.ckpt_dir = ck;
    run_fail(&c, FSDP_STATUS_UNSUPPORTED, "meta", NULL);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"format", 120, .tmpdir = true,
         FSDP_TESTS(test_manifest_roundtrip, test_manifest_hostile, test_manifest_checksum,
                    test_edited_manifest_refused_everywhere)},
        {"resume_data", 120, .tmpdir = true, FSDP_TESTS(test_resume_other_data)},
        {"train", 600, .tmpdir = true,
         FSDP_TESTS(test_resume_exact, test_reshard_continue, test_reshard_load_exact,
                    test_crash_during_save, test_hostile_checkpoints, test_retention_and_memory)},
    };
    return fsdp_test_main("ckpt", tcases, FSDP_TEST_LEN(tcases));
}
