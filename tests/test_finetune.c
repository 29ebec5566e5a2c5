/*
 * test_finetune.c - what a fine-tuning run adds to training: the learning-
 * rate schedules at steps whose rates are computed by hand, a resumed run
 * that keeps its schedule, the fine-tuning defaults and --global-batch of
 * `fsdp train`, and the held-out loss during training (--eval-data): equal
 * to `fsdp eval` of the checkpoint on the same file, identical on 1, 2 and
 * 4 devices, the best checkpoint kept past --ckpt-keep, early stopping,
 * and the refusals of bad settings. Tiny model, byte-level text, a few
 * steps each.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/manifest.h"
#include "file_util.h"
#include "testutil.h"
#include "train/infer.h"
#include "train/schedule.h"
#include "train_util.h"

/* ---- schedules ---------------------------------------------------------------- */

static float lr_of(fsdp_lr_schedule s, int warmup, int steps, float decay_frac, int step)
{
    fsdp_lr_plan p = {.schedule = s, .lr = 1.0f, .min_lr = 0.1, .warmup = warmup,
                      .steps = steps, .decay_frac = decay_frac};
    return fsdp_lr_at(&p, step);
}

#define EXPECT_LR(s, w, n, f, step, want) \
    ck_assert_float_eq_tol(lr_of(s, w, n, f, step), (want), 1e-6f)

/* lr 1, floor 0.1, warmup 2 of 12 steps: after warmup p = (step - 2) / 9. */
START_TEST(test_schedule_values)
{
    for (int s = 0; s < FSDP_LR_SCHEDULE_COUNT; s++) { /* the warmup is shared */
        EXPECT_LR(s, 2, 12, 0.25f, 0, 0.5f);
        EXPECT_LR(s, 2, 12, 0.25f, 1, 1.0f);
    }
    EXPECT_LR(FSDP_LR_COSINE, 2, 12, 0, 2, 1.0f);
    EXPECT_LR(FSDP_LR_COSINE, 2, 11, 0, 6, 0.55f);  /* p = 4/8: half way */
    EXPECT_LR(FSDP_LR_COSINE, 2, 12, 0, 11, 0.1f);
    EXPECT_LR(FSDP_LR_COSINE, 2, 12, 0, 40, 0.1f);  /* past the end: the floor */
    EXPECT_LR(FSDP_LR_LINEAR, 2, 12, 0, 2, 1.0f);
    EXPECT_LR(FSDP_LR_LINEAR, 2, 12, 0, 5, 0.7f);   /* p = 3/9 */
    EXPECT_LR(FSDP_LR_LINEAR, 2, 12, 0, 11, 0.1f);
    EXPECT_LR(FSDP_LR_CONSTANT, 2, 12, 0, 2, 1.0f);
    EXPECT_LR(FSDP_LR_CONSTANT, 2, 12, 0, 11, 1.0f);
    /* wsd, 20 steps, the last 0.25 x 20 = 5 decay: steps 15..19 */
    EXPECT_LR(FSDP_LR_WSD, 2, 20, 0.25f, 14, 1.0f);
    EXPECT_LR(FSDP_LR_WSD, 2, 20, 0.25f, 15, 0.82f); /* q = 1/5 */
    EXPECT_LR(FSDP_LR_WSD, 2, 20, 0.25f, 17, 0.46f); /* q = 3/5 */
    EXPECT_LR(FSDP_LR_WSD, 2, 20, 0.25f, 19, 0.1f);
    EXPECT_LR(FSDP_LR_WSD, 2, 20, 0.01f, 18, 1.0f);  /* 0.2 rounds to 0: at least 1 decays */
    EXPECT_LR(FSDP_LR_WSD, 2, 20, 0.01f, 19, 0.1f);
    /* the trainer's defaults are the demo's: warmup 20, cosine from 3e-3 to 3e-4 */
    fsdp_train_config c;
    fsdp_train_config_default(&c);
    ck_assert_float_eq(fsdp_train_lr(&c, 0), 3e-3f / 20.0f);
    ck_assert_float_eq_tol(fsdp_train_lr(&c, 20), 3e-3f, 1e-9f);
    ck_assert_float_eq_tol(fsdp_train_lr(&c, c.steps - 1), 3e-4f, 1e-9f);
    c.min_lr = 0.0f; /* --min-lr replaces the 10% */
    ck_assert_float_eq_tol(fsdp_train_lr(&c, c.steps - 1), 0.0f, 1e-9f);
}
END_TEST

START_TEST(test_schedule_names)
{
    const char *names[] = {"cosine", "linear", "constant", "wsd"};
    for (int i = 0; i < 4; i++) {
        int v = -1;
        ck_assert_int_eq(fsdp_names_parse(&fsdp_lr_schedule_names, 0, names[i], &v),
                         FSDP_STATUS_OK);
        ck_assert_int_eq(v, i);
    }
    int v;
    ck_assert_int_eq(fsdp_names_parse(&fsdp_lr_schedule_names, 0, "step", &v),
                     FSDP_STATUS_INVALID_ARG);
}
END_TEST

/* ---- data ----------------------------------------------------------------------- */

/* Words drawn from a fixed list into a text file (bytes, vocab 256). */
static void write_words(const char *path, int n, unsigned seed)
{
    static const char *const words[] = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran"};
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        fprintf(f, "%s ", words[(seed >> 16) % 8]);
    }
    ck_assert_int_eq(fclose(f), 0);
}

static char g_train[4096], g_eval[4096];

static void text_files(void)
{
    fsdp_test_path(g_train, sizeof g_train, "train.txt");
    fsdp_test_path(g_eval, sizeof g_eval, "eval.txt");
    write_words(g_train, 1500, 1);
    write_words(g_eval, 300, 2);
}

/* tiny on the text: a global batch of 8 rows of 16 bytes on `devices`. */
static void text_config(fsdp_train_config *c, int devices, int steps)
{
    train_config_tiny(c, devices, 0);
    c->data = g_train;
    c->steps = steps;
    c->keep_params = false;
}

/* ---- the schedule across a resume ------------------------------------------------ */

/* wsd over 6 steps straight, and 3 + a resume of 3: the same losses. */
START_TEST(test_schedule_resume)
{
    text_files();
    char dir[4096];
    fsdp_test_path(dir, sizeof dir, "ck");
    fsdp_train_config c;
    fsdp_train_result a, b;
    text_config(&c, 2, 6);
    c.schedule = FSDP_LR_WSD;
    c.decay_frac = 0.5f;
    c.min_lr = 1e-3f;
    run_ok(&c, &a);
    c.ckpt_dir = dir;
    c.ckpt_every = 3;
    c.stop_after = 3;
    run_ok(&c, &b);
    fsdp_train_result_free(&b);
    c.stop_after = 0;
    c.resume = true;
    run_ok(&c, &b);
    ck_assert_int_eq(b.first_step, 3);
    for (int s = 3; s < 6; s++)
        ck_assert_msg(a.losses[s] == b.losses[s], "step %d: %.9g vs %.9g", s + 1, a.losses[s],
                      b.losses[s]);
    ck_assert_float_ne(a.losses[5], a.losses[4]);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
}
END_TEST

/* The schedule's settings are in every checkpoint's manifest (issue 28: they were not, so
 * a resume with other flags changed the schedule without a word); a resume with the same
 * settings says nothing, one with others a note naming both. */
START_TEST(test_schedule_recorded)
{
    text_files();
    char dir[4096], path[4200];
    fsdp_test_path(dir, sizeof dir, "ck");
    fsdp_train_config c;
    fsdp_train_result r;
    text_config(&c, 1, 4);
    c.schedule = FSDP_LR_WSD;
    c.decay_frac = 0.5f;
    c.min_lr = 1e-3f;
    c.ckpt_dir = dir;
    c.ckpt_every = 1;
    c.stop_after = 2;
    run_ok(&c, &r);
    fsdp_train_result_free(&r);
    pathf(path, sizeof path, "%s/step_00000002/manifest", dir);
    fsdp_ckpt_manifest m;
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &m), FSDP_STATUS_OK);
    ck_assert_str_eq(m.schedule, "wsd");
    ck_assert((float)m.lr == c.lr && m.min_lr == (double)c.min_lr);
    ck_assert_int_eq(m.warmup, c.warmup);
    ck_assert((float)m.decay_frac == c.decay_frac);
    fsdp_ckpt_manifest_free(&m);
    char *text = NULL;
    size_t n = 0;
    c.resume = true;
    c.stop_after = 3;
    c.out = open_memstream(&text, &n);
    run_ok(&c, &r);
    fclose(c.out);
    fsdp_train_result_free(&r);
    ck_assert_msg(strstr(text, "resuming from") && !strstr(text, "learning-rate schedule"),
                  "%s", text);
    free(text);
    c.schedule = FSDP_LR_COSINE;
    c.stop_after = 0;
    c.out = open_memstream(&text, &n);
    run_ok(&c, &r);
    fclose(c.out);
    fsdp_train_result_free(&r);
    ck_assert_msg(strstr(text, "note: the checkpoint's run had the learning-rate schedule "
                               "--schedule wsd --lr 0.01 --min-lr 0.001 --warmup 1 "
                               "--decay-frac 0.5; this run's is --schedule cosine --lr 0.01 "
                               "--min-lr 0.001 --warmup 1: from step 4 on"), "%s", text);
    free(text);
    /* a bad line is refused by name (before the checksum) */
    text = slurp(path);
    char *line = strstr(text, "schedule wsd ");
    ck_assert_ptr_nonnull(line);
    memcpy(line, "schedule ws- ", 13);
    pathf(path, sizeof path, "%s/bad_manifest", dir);
    spit(path, text, strlen(text));
    free(text);
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &m), FSDP_STATUS_FORMAT);
    ck_assert_msg(strstr(fsdp_error_msg(), "schedule 'ws- "), "%s", fsdp_error_msg());
}
END_TEST

/* ---- the held-out loss -------------------------------------------------------------- */

/* The last evaluation of a run equals `fsdp eval` of its final checkpoint
 * on the same file, batch, sequence, seed and micro-batches. */
START_TEST(test_eval_matches_fsdp_eval)
{
    text_files();
    char dir[4096], step[4200];
    fsdp_test_path(dir, sizeof dir, "ck");
    fsdp_train_config c;
    fsdp_train_result r;
    text_config(&c, 2, 4);
    c.eval_data = g_eval;
    c.eval_steps = 3;
    c.eval_every = 2;
    c.ckpt_dir = dir;
    run_ok(&c, &r);
    ck_assert(isfinite(r.eval_loss));
    pathf(step, sizeof step, "%s/step_00000004", dir);
    fsdp_infer_config ic;
    fsdp_infer_config_default(&ic);
    ic.model_path = step;
    ic.backend = FSDP_BACKEND_CPU;
    ic.n_ranks = 1;
    ic.batch = c.eng.batch;
    ic.seq = c.eng.seq;
    fsdp_infer_eval_result res;
    ck_assert_int_eq(fsdp_infer_eval(&ic, g_eval, c.eng.seed, 3, &res), FSDP_STATUS_OK);
    free(res.losses);
    ck_assert_msg(res.mean == r.eval_loss, "fsdp eval %.9g, the run's eval loss %.9g", res.mean,
                  r.eval_loss);
    fsdp_train_result_free(&r);
}
END_TEST

/* The same run on 1, 2 and 4 devices (the same global batch): the same
 * held-out losses, bit for bit, in the metrics file. */
START_TEST(test_eval_device_counts)
{
    text_files();
    char *logs[3] = {NULL, NULL, NULL};
    const int devices[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        char log[4096], name[32];
        snprintf(name, sizeof name, "m%d.jsonl", devices[i]);
        fsdp_test_path(log, sizeof log, name);
        fsdp_train_config c;
        fsdp_train_result r;
        text_config(&c, devices[i], 3);
        c.eval_data = g_eval;
        c.eval_every = 1;
        c.log_path = log;
        run_ok(&c, &r);
        fsdp_train_result_free(&r);
        /* the eval figures of every line, in order */
        char *text = slurp(log), *at = text;
        size_t cap = strlen(text) + 1, n = 0;
        logs[i] = calloc(cap, 1);
        while ((at = strstr(at, "\"eval_loss\":"))) {
            size_t len = strcspn(at, "}");
            memcpy(logs[i] + n, at, len);
            n += len;
            at += len;
        }
        free(text);
        ck_assert_msg(n > 0 && strstr(logs[i], "eval_ppl"), "no eval figures in %s", log);
    }
    ck_assert_str_eq(logs[0], logs[1]);
    ck_assert_str_eq(logs[0], logs[2]);
    for (int i = 0; i < 3; i++)
        free(logs[i]);
}
END_TEST

/* Training text of one letter ('a') and held-out text of another ('b'), each 4096 bytes
 * of path; dir: a checkpoint directory's path. */
static void one_word_files(char *train, char *eval, char *dir)
{
    fsdp_test_path(train, 4096, "a.txt");
    fsdp_test_path(eval, 4096, "b.txt");
    fsdp_test_path(dir, 4096, "ck");
    char text[2048];
    memset(text, 'a', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    fsdp_test_write_file(train, text);
    memset(text, 'b', sizeof text - 1);
    fsdp_test_write_file(eval, text);
}

/* Trained on one word, evaluated on text without it: the held-out loss
 * rises after the first evaluation. --keep-best keeps step 1 past
 * --ckpt-keep 1; --early-stop 2 ends the run after step 3 with a
 * checkpoint. */
START_TEST(test_keep_best_early_stop)
{
    char train[4096], eval[4096], dir[4096], best[4200];
    one_word_files(train, eval, dir);
    fsdp_train_config c;
    fsdp_train_result r;
    text_config(&c, 2, 10);
    c.data = train;
    c.eval_data = eval;
    c.eval_every = 1;
    c.eval_steps = 1;
    c.keep_best = true;
    c.early_stop = 2;
    c.ckpt_dir = dir;
    c.ckpt_keep = 1;
    run_ok(&c, &r);
    ck_assert(r.early_stopped);
    ck_assert(!r.interrupted);
    ck_assert_int_eq(r.steps, 3);
    ck_assert_int_eq(r.best_eval_step, 1);
    ck_assert_int_eq(r.ckpt_step, 3);
    ck_assert(r.eval_loss > r.best_eval_loss);
    pathf(best, sizeof best, "%s/step_00000001", dir);
    ck_assert(fsdp_ckpt_is_complete(best));
    pathf(best, sizeof best, "%s/step_00000003", dir);
    ck_assert(fsdp_ckpt_is_complete(best));
    pathf(best, sizeof best, "%s/step_00000002", dir);
    ck_assert(!exists(best));
    uint64_t step;
    double loss;
    bool found;
    ck_assert_int_eq(fsdp_ckpt_best_read(dir, &step, &loss, &found), FSDP_STATUS_OK);
    ck_assert(found);
    ck_assert_int_eq(step, 1);
    ck_assert_float_eq((float)loss, r.best_eval_loss);
    fsdp_train_result_free(&r);
    /* the same held-out set as the training data keeps improving: no early stop */
    fsdp_test_rm_rf(dir);
    c.eval_data = train;
    c.steps = 4;
    run_ok(&c, &r);
    ck_assert(!r.early_stopped);
    ck_assert_int_eq(r.steps, 4);
    ck_assert_int_eq(r.best_eval_step, 4);
    fsdp_train_result_free(&r);
}
END_TEST

/* --early-stop across a resume (issue 28: the count restarted at 0 and the best loss was
 * forgotten): trained on one word, evaluated on another, the run stops after step 3
 * whether it runs straight or is interrupted after step 2 and resumed, and the resumed
 * run knows its best came after step 1. Without --keep-best: the checkpoint holds the
 * standing. */
START_TEST(test_early_stop_resume)
{
    char train[4096], eval[4096], dir[4096];
    one_word_files(train, eval, dir);
    fsdp_train_config c;
    fsdp_train_result a, b;
    text_config(&c, 2, 10);
    c.data = train;
    c.eval_data = eval;
    c.eval_every = 1;
    c.eval_steps = 1;
    c.early_stop = 2;
    run_ok(&c, &a);
    ck_assert(a.early_stopped);
    ck_assert_int_eq(a.steps, 3);
    c.ckpt_dir = dir;
    c.ckpt_every = 1;
    c.stop_after = 2;
    run_ok(&c, &b);
    ck_assert(!b.early_stopped);
    fsdp_train_result_free(&b);
    c.stop_after = 0;
    c.resume = true;
    run_ok(&c, &b);
    ck_assert_int_eq(b.first_step, 2);
    ck_assert_msg(b.early_stopped && b.steps == 3, "the resumed run stopped after step %d "
                  "(early stop: %d); the straight one after step 3", b.steps, b.early_stopped);
    ck_assert_int_eq(b.best_eval_step, 1);
    ck_assert(b.best_eval_loss == a.best_eval_loss && b.eval_loss == a.eval_loss);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
}
END_TEST

/* --resume without --tokenizer reads the data through the tokenizer the checkpoint
 * carries (issue 28: it was refused as other data), says so, and continues as the run
 * with --tokenizer does; a --tokenizer with other bytes is refused, naming both. A
 * 1-layer GPT-2 over the Llama 3 test tokenizer's 665 ids. */
START_TEST(test_resume_tokenizer)
{
    char dir[4096], tok[4200], other[4200], data[4200], ck[4200];
    fsdp_test_mkdir(dir, sizeof dir, "run");
    pathf(tok, sizeof tok, "%s/tokenizer.json", dir);
    pathf(other, sizeof other, "%s/other.json", dir);
    pathf(data, sizeof data, "%s/t.txt", dir);
    pathf(ck, sizeof ck, "%s/ck", dir);
    copy_file("tests/fixtures/tok_llama3.json", tok);
    char *json = slurp(tok);
    size_t len = strlen(json);
    json[len - 1] = json[len - 1] == '\n' ? ' ' : '\n'; /* the same tokens, other bytes */
    spit(other, json, len);
    free(json);
    FILE *f = fopen(data, "w");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 40; i++)
        fprintf(f, "Hello world, line %d of a small corpus.\n", i);
    ck_assert_int_eq(fclose(f), 0);
    fsdp_train_config c;
    fsdp_train_result a, b;
    train_config_tiny(&c, 2, 1);
    c.model = "gpt2:layers=1,heads=2,channels=32,vocab=665,context=64";
    c.data = data;
    c.tokenizer = tok;
    c.steps = 4;
    c.keep_params = false;
    run_ok(&c, &a);
    c.ckpt_dir = ck;
    c.ckpt_every = 2;
    c.stop_after = 2;
    run_ok(&c, &b);
    fsdp_train_result_free(&b);
    c.stop_after = 0;
    c.resume = true;
    c.tokenizer = other;
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "another tokenizer.json", "other.json");
    c.tokenizer = NULL;
    char *text = NULL;
    size_t n = 0;
    c.out = open_memstream(&text, &n);
    run_ok(&c, &b);
    fclose(c.out);
    ck_assert_msg(strstr(text, "tokenizer: ") && strstr(text, "/ck/step_00000002/tokenizer.json "
                  "(the copy the checkpoint to resume carries"), "%s", text);
    ck_assert_msg(!strstr(text, "allow-data-change"), "%s", text);
    free(text);
    ck_assert_int_eq(b.first_step, 2);
    for (int s = 2; s < 4; s++)
        ck_assert_msg(a.losses[s] == b.losses[s], "step %d: %.9g vs %.9g", s + 1, a.losses[s],
                      b.losses[s]);
    fsdp_train_result_free(&a);
    fsdp_train_result_free(&b);
    /* the checkpoint it wrote names the tokenizer the run started with */
    char manifest[4300];
    pathf(manifest, sizeof manifest, "%s/step_00000004/manifest", ck);
    fsdp_ckpt_manifest m;
    ck_assert_int_eq(fsdp_ckpt_manifest_read(manifest, &m), FSDP_STATUS_OK);
    ck_assert_str_eq(m.tokenizer, tok);
    fsdp_ckpt_manifest_free(&m);
}
END_TEST

/* Held-out data of another kind than --data, and of token ids the model
 * lacks, is refused before step 1. */
START_TEST(test_eval_refused)
{
    text_files();
    char shard[4096];
    fsdp_test_path(shard, sizeof shard, "eval.bin");
    uint16_t tok[64];
    for (int i = 0; i < 64; i++)
        tok[i] = (uint16_t)(i % 50);
    FILE *f = fopen(shard, "wb");
    ck_assert_ptr_nonnull(f);
    int32_t h[256] = {20240520, 1, 64};
    ck_assert_uint_eq(fwrite(h, sizeof h, 1, f), 1);
    ck_assert_uint_eq(fwrite(tok, sizeof tok, 1, f), 1);
    ck_assert_int_eq(fclose(f), 0);
    fsdp_train_config c;
    text_config(&c, 1, 2);
    c.eval_data = shard;
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "is token shards but --data", "same kind");
    c.eval_data = "synthetic";
    run_fail(&c, FSDP_STATUS_INVALID_ARG, "same kind", NULL);
}
END_TEST

/* ---- the command ------------------------------------------------------------------- */

START_TEST(test_cli_finetune)
{
    text_files();
    char dir[4096], out[16384];
    fsdp_test_path(dir, sizeof dir, "ck");
    /* a pre-trained model: a checkpoint of one step of tiny */
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "train --backend cpu --devices 1 --model "
                                   "tiny --data %s --seq 16 --batch 2 --steps 1 --ckpt-dir %s",
                                   g_train, dir), 0);
    int rc = fsdp_test_cli(out, sizeof out,
                           "train --backend cpu --devices 2 --model %s/step_00000001 --data %s "
                           "--seq 16 --batch 2 --global-batch 8 --steps 100 --schedule wsd "
                           "--eval-data %s --eval-steps 1 --eval-every 50", dir, g_train, g_eval);
    ck_assert_msg(rc == 0, "%s", out);
    ck_assert_msg(strstr(out, "accum 2 x 2 ranks"), "%s", out);
    ck_assert_msg(strstr(out, "lr 2e-05 (fine-tuning default), warmup 3 steps, then wsd: decay "
                              "over the last 10 steps to 2e-06"), "%s", out);
    ck_assert_msg(strstr(out, "eval     50/100 | eval loss "), "%s", out);
    ck_assert_msg(strstr(out, "eval    100/100 | eval loss "), "%s", out);
    /* a built-in model keeps the demo's */
    rc = fsdp_test_cli(out, sizeof out, "train --backend cpu --devices 1 --model tiny --data "
                       "%s --seq 16 --batch 2 --steps 1", g_train);
    ck_assert_msg(rc == 0 && strstr(out, "lr 0.003, warmup 20 steps, then cosine to 0.0003"),
                  "%s", out);
    /* LoRA adapters on a pre-trained model: 10x */
    rc = fsdp_test_cli(out, sizeof out, "train --backend cpu --devices 1 --model "
                       "tests/fixtures/llama_gqa --lora 4 --data tests/fixtures/lora_gqa/tokens.bin "
                       "--seq 16 --batch 1 --steps 2");
    ck_assert_msg(rc == 0 && strstr(out, "lr 0.0002 (fine-tuning default with LoRA), warmup 1 "
                                         "steps"), "%s", out);
    ck_assert_int_eq(fsdp_test_cli(out, sizeof out, "train --help"), 0);
    ck_assert(strstr(out, "default 3e-3 for built-in models, 2e-5 for a pre-trained --model, "
                          "2e-4 for LoRA adapters on one"));
    char bad[5][512];
    snprintf(bad[0], sizeof bad[0], "train --model tiny --data %s --devices 2 --batch 3 "
             "--global-batch 8", g_train);
    snprintf(bad[1], sizeof bad[1], "train --model tiny --data %s --grad-accum 2 "
             "--global-batch 8", g_train);
    snprintf(bad[2], sizeof bad[2], "train --model tiny --data %s --eval-data %s "
             "--eval-every 0", g_train, g_eval);
    snprintf(bad[3], sizeof bad[3], "train --model tiny --data %s --eval-data %s/none.txt",
             g_train, dir);
    snprintf(bad[4], sizeof bad[4], "train --model tiny --data %s --early-stop 2", g_train);
    const fsdp_test_cli_case cases[] = {
        {bad[0], 2, "--global-batch 8 is not a multiple of --batch 3 x 2 device(s) = 6"},
        {bad[1], 2, "--global-batch 8 and --grad-accum 2: give one of them"},
        {bad[2], 2, "--eval-every: 0 is out of range"},
        {bad[3], 1, "--eval-data: cannot open data file"}, /* as --data's */
        {bad[4], 2, "need --eval-data FILE"},
        {"train --model tiny --schedule step", 2, "cosine, linear, constant or wsd"},
        {"train --model tiny --min-lr 0.1", 2, "--min-lr 0.1 is above --lr 0.003"},
    };
    fsdp_test_cli_cases(cases, sizeof cases / sizeof cases[0]);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"schedule", 0, FSDP_TESTS(test_schedule_values, test_schedule_names)},
        {"train", 60, .tmpdir = true,
         FSDP_TESTS(test_schedule_resume, test_eval_matches_fsdp_eval, test_eval_device_counts,
                    test_keep_best_early_stop, test_eval_refused, test_cli_finetune,
                    test_schedule_recorded, test_early_stop_resume, test_resume_tokenizer)},
    };
    return fsdp_test_main("finetune", tcases, FSDP_TEST_LEN(tcases));
}
