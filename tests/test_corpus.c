/*
 * test_corpus.c - the text people bring as training data (data.h with a
 * tokenizer.json): a .txt file and {"text"} rows as a token stream,
 * prompt/completion and chat rows as padded example rows with -1 targets,
 * their order by seed, truncation counts, and bad rows reported by file
 * and line; `fsdp train` and `fsdp eval` reading them.
 *
 * Expected tokens are built from the tokenizer directly (data/hftok.h,
 * itself checked against the reference in test_tokenizer.c) and from the
 * contracts in data.h. Uses the fixtures tests/fixtures/tok_*.json; data
 * files go to /tmp and are removed by each test. Runs from the repository
 * root.
 */
#include <check.h>
#include <pthread.h>
#include <stdarg.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "data/chat.h"
#include "data/data.h"
#include "data/hftok.h"
#include "data_util.h"
#include "testutil.h"

#define TOK_GPT2 "tests/fixtures/tok_gpt2.json"
#define TOK_LLAMA3 "tests/fixtures/tok_llama3.json"
#define TOK_QWEN2 "tests/fixtures/tok_qwen2.json"

static void write_file(char *path, size_t n, const char *suffix, const char *text)
{
    snprintf(path, n, "/tmp/fsdp_test_corpus_XXXXXX%s", suffix);
    int fd = mkstemps(path, (int)strlen(suffix));
    ck_assert_int_ge(fd, 0);
    size_t len = strlen(text);
    ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
}

static fsdp_data *open_data(const char *spec, const char *tok, const char *chat, uint64_t seed)
{
    fsdp_data_opts o = {.spec = spec, .seed = seed, .tokenizer = tok, .chat_format = chat};
    fsdp_data *d = NULL;
    fsdp_status st = fsdp_data_open_opts(&d, &o);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s: %s", spec, fsdp_error_msg());
    return d;
}

/* Stream rows: row r of batch m is tokens [(m*B + r)*T, +T+1) mod n. */
static void check_stream(const fsdp_data *d, const int *all, size_t n, int B, int T, int batches)
{
    ck_assert(!fsdp_data_masked(d));
    ck_assert_uint_eq(fsdp_data_n_tokens(d), n);
    int *in = malloc(sizeof(int) * B * T), *tg = malloc(sizeof(int) * B * T);
    for (int m = 0; m < batches; m++) {
        ck_assert_int_eq(fsdp_data_batch(d, (uint64_t)m, B, T, in, tg), FSDP_STATUS_OK);
        for (int r = 0; r < B; r++)
            for (int j = 0; j < T; j++) {
                size_t p = ((size_t)(m * B + r) * T + j) % n;
                ck_assert_int_eq(in[r * T + j], all[p]);
                ck_assert_int_eq(tg[r * T + j], all[(p + 1) % n]);
            }
    }
    free(in);
    free(tg);
}

/* A .txt file is one document: the document token, then its text with
 * special tokens left as text; {"text"} rows are documents one after the
 * other. GPT-2 and Qwen2 mark documents with <|endoftext|>, Llama 3 with
 * <|begin_of_text|>. */
START_TEST(test_text_streams)
{
    static const char *const toks[] = {TOK_GPT2, TOK_LLAMA3, TOK_QWEN2};
    fsdp_hftok *t = tok_open(toks[_i]);
    int doc = _i == 1 ? fsdp_hftok_added_id(t, "<|begin_of_text|>")
                      : fsdp_hftok_added_id(t, "<|endoftext|>");
    ck_assert_int_ge(doc, 0);
    const char *text = "It's 2024.\n\nThe quick brown fox <|endoftext|> 我爱 caf\xc3\xa9!\n";
    char path[64];
    write_file(path, sizeof path, ".txt", text);
    int want[256];
    size_t n = 0;
    want[n++] = doc;
    enc(t, text, want, &n);
    fsdp_data *d = open_data(path, toks[_i], NULL, 1);
    check_stream(d, want, n, 2, 5, 7);
    ck_assert_int_eq(fsdp_data_vocab(d), 1 + doc); /* the document token is the largest id */
    fsdp_data_close(d);
    unlink(path);

    const char *rows = "{\"text\": \"first document\", \"id\": 1}\n"
                       "\n"
                       "  \r\n"
                       "{\"text\": \"second \\u00e9 <|im_start|>\"}\r\n"
                       "{\"meta\": [1, 2], \"text\": \"third\"}";
    write_file(path, sizeof path, ".jsonl", rows);
    n = 0;
    static const char *const docs[] = {"first document", "second \xc3\xa9 <|im_start|>", "third"};
    for (int i = 0; i < 3; i++) {
        want[n++] = doc;
        enc(t, docs[i], want, &n);
    }
    d = open_data(path, toks[_i], NULL, 1);
    check_stream(d, want, n, 3, 4, 5);
    ck_assert_uint_eq(fsdp_data_n_examples(d), 0);
    fsdp_data_close(d);
    unlink(path);
    fsdp_hftok_free(t);
}
END_TEST

/* The example rows a file gives, in file order, rebuilt from the contract:
 * [BOS] prompt completion EOT, trained = completion and EOT. */
typedef struct example {
    int tok[128];
    int trained[128];
    size_t n;
} example;

static void prompt_example(fsdp_hftok *t, const char *prompt, const char *completion, example *e)
{
    e->n = 0;
    if (fsdp_hftok_bos(t) >= 0)
        e->tok[e->n++] = fsdp_hftok_bos(t);
    enc(t, prompt, e->tok, &e->n);
    size_t k = e->n;
    enc(t, completion, e->tok, &e->n);
    e->tok[e->n++] = fsdp_hftok_eot(t);
    for (size_t i = 0; i < e->n; i++)
        e->trained[i] = i >= k;
}

/* Row r of a batch against example e: inputs are its tokens then padding,
 * targets are the next token where trained, else -1. */
static bool row_is(const int *in, const int *tg, int T, const example *e, int pad)
{
    size_t len = e->n < (size_t)T + 1 ? e->n : (size_t)T + 1;
    for (size_t j = 0; j < (size_t)T; j++) {
        int wi = j < len ? e->tok[j] : pad;
        int wt = j + 1 < len && e->trained[j + 1] ? e->tok[j + 1] : -1;
        if (in[j] != wi || tg[j] != wt)
            return false;
    }
    return true;
}

/* Which of ex[0..n) row r is (-1 if none). */
static int which_row(const int *in, const int *tg, int T, const example *ex, int n, int pad)
{
    for (int i = 0; i < n; i++)
        if (row_is(in, tg, T, &ex[i], pad))
            return i;
    return -1;
}

/* Prompt/completion rows: every epoch is a permutation of the examples,
 * fixed by the seed; masked targets; padding; truncation counts. */
START_TEST(test_prompt_completion_rows)
{
    const char *tokpath = _i ? TOK_LLAMA3 : TOK_GPT2;
    fsdp_hftok *t = tok_open(tokpath);
    enum { N = 5 };
    static const char *const pc[N][2] = {
        {"Q: 2+2?\nA:", " 4"},
        {"Translate: chat ->", " cat"},
        {"", "a completion without a prompt"},
        {"<|endoftext|> is text here", " ok"},
        {"A long prompt that goes on and on and on, well past the row length.", " end"},
    };
    char rows[2048] = "";
    example ex[N];
    for (int i = 0; i < N; i++) {
        snprintf(rows + strlen(rows), sizeof rows - strlen(rows),
                 "{\"prompt\": \"%s\", \"completion\": \"%s\"}\n",
                 i == 0 ? "Q: 2+2?\\nA:" : pc[i][0], pc[i][1]);
        prompt_example(t, pc[i][0], pc[i][1], &ex[i]);
    }
    char path[64];
    write_file(path, sizeof path, ".jsonl", rows);
    fsdp_data *d = open_data(path, tokpath, NULL, 7);
    ck_assert(fsdp_data_masked(d));
    ck_assert_uint_eq(fsdp_data_n_examples(d), N);
    int T = 12, B = 3, pad = fsdp_hftok_eot(t);
    /* truncation: examples longer than T+1 tokens; the last one keeps no target */
    uint64_t cut, none, want_cut = 0, want_none = 0;
    for (int i = 0; i < N; i++) {
        size_t len = ex[i].n > (size_t)T + 1 ? (size_t)T + 1 : ex[i].n;
        want_cut += ex[i].n > (size_t)T + 1;
        bool any = false;
        for (size_t j = 1; j < len; j++)
            any |= ex[i].trained[j];
        want_none += !any;
    }
    fsdp_data_truncated(d, T, &cut, &none);
    ck_assert_uint_eq(cut, want_cut);
    ck_assert_uint_eq(none, want_none);
    ck_assert_uint_ge(none, 1); /* the long prompt leaves nothing to train on */
    ck_assert_uint_lt(none, N);
    fsdp_data_truncated(d, 200, &cut, &none);
    ck_assert(cut == 0 && none == 0);
    /* 4 epochs of 5 rows in batches of 3: each epoch has every example once */
    int in[3 * 12], tg[3 * 12], order[20], masked = 0;
    for (int m = 0; m < 20 / B + 1; m++) {
        ck_assert_int_eq(fsdp_data_batch(d, (uint64_t)m, B, T, in, tg), FSDP_STATUS_OK);
        for (int r = 0; r < B && m * B + r < 20; r++) {
            int w = which_row(in + r * T, tg + r * T, T, ex, N, pad);
            ck_assert_msg(w >= 0, "batch %d row %d matches no example", m, r);
            order[m * B + r] = w;
            for (int j = 0; j < T; j++)
                masked += tg[r * T + j] == -1;
        }
    }
    ck_assert_int_gt(masked, 0);
    bool same_as_file_order = true, same_epochs = true;
    for (int e = 0; e < 4; e++) {
        int seen[N] = {0};
        for (int i = 0; i < N; i++) {
            seen[order[e * N + i]]++;
            same_as_file_order &= order[e * N + i] == i;
            same_epochs &= order[e * N + i] == order[i];
        }
        for (int i = 0; i < N; i++)
            ck_assert_int_eq(seen[i], 1);
    }
    ck_assert(!(same_as_file_order && same_epochs)); /* shuffled, and differently per epoch */
    /* the same seed gives the same batches; another seed another order */
    fsdp_data *d2 = open_data(path, tokpath, NULL, 7), *d3 = open_data(path, tokpath, NULL, 8);
    int in2[3 * 12], tg2[3 * 12];
    bool differs = false;
    for (int m = 0; m < 8; m++) {
        fsdp_data_batch(d, (uint64_t)m, B, T, in, tg);
        fsdp_data_batch(d2, (uint64_t)m, B, T, in2, tg2);
        ck_assert(!memcmp(in, in2, sizeof in) && !memcmp(tg, tg2, sizeof tg));
        fsdp_data_batch(d3, (uint64_t)m, B, T, in2, tg2);
        differs |= memcmp(in, in2, sizeof in) != 0;
    }
    ck_assert(differs);
    fsdp_data_close(d3);
    fsdp_data_close(d2);
    fsdp_data_close(d);
    unlink(path);
    fsdp_hftok_free(t);
}
END_TEST

/* Messages rows render as chat.h says (llama3 for the Llama 3 tokenizer,
 * chatml for Qwen2, chosen from the tokenizer's tokens or by name). */
START_TEST(test_chat_rows)
{
    const char *tokpath = _i ? TOK_QWEN2 : TOK_LLAMA3;
    fsdp_hftok *t = tok_open(tokpath);
    const fsdp_chat_format *f = fsdp_chat_format_find(_i ? "chatml" : "llama3");
    const char *rows =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
        "{\"role\": \"user\", \"content\": \"Hi \\ud83e\\udd99\"}, "
        "{\"role\": \"assistant\", \"content\": \"Hello!\"}]}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"1+1?\"}, "
        "{\"role\": \"assistant\", \"content\": \"2\"}, {\"role\": \"user\", \"content\": \"x\"}, "
        "{\"role\": \"assistant\", \"content\": \"y\"}]}\n"
        "{\"prompt\": \"p\", \"completion\": \"q\"}\n";
    char path[64];
    write_file(path, sizeof path, ".jsonl", rows);
    fsdp_chat_msg m1[3] = {{"system", "Be brief.", 9}, {"user", "Hi \xf0\x9f\xa6\x99", 7},
                           {"assistant", "Hello!", 6}};
    fsdp_chat_msg m2[4] = {{"user", "1+1?", 4}, {"assistant", "2", 1}, {"user", "x", 1},
                           {"assistant", "y", 1}};
    example ex[3];
    const fsdp_chat_msg *ms[2] = {m1, m2};
    int nm[2] = {3, 4};
    for (int i = 0; i < 2; i++) {
        fsdp_ids ids = {0};
        fsdp_flags tr = {0};
        ck_assert_int_eq(fsdp_chat_render(t, f, ms[i], nm[i], &ids, &tr), FSDP_STATUS_OK);
        ck_assert_uint_le(ids.n, 128);
        for (size_t k = 0; k < ids.n; k++) {
            ex[i].tok[k] = ids.p[k];
            ex[i].trained[k] = tr.p[k];
        }
        ex[i].n = ids.n;
        fsdp_ids_free(&ids);
        fsdp_flags_free(&tr);
    }
    prompt_example(t, "p", "q", &ex[2]);
    for (int by_name = 0; by_name < 2; by_name++) {
        fsdp_data *d = open_data(path, tokpath, by_name ? f->name : NULL, 3);
        ck_assert_uint_eq(fsdp_data_n_examples(d), 3);
        int T = 64, in[64], tg[64], seen[3] = {0};
        for (uint64_t k = 0; k < 3; k++) {
            ck_assert_int_eq(fsdp_data_batch(d, k, 1, T, in, tg), FSDP_STATUS_OK);
            int w = which_row(in, tg, T, ex, 3, fsdp_hftok_eot(t));
            ck_assert_int_ge(w, 0);
            seen[w]++;
        }
        ck_assert(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
        fsdp_data_close(d);
    }
    /* the other family's format is refused up front */
    fsdp_data_opts o = {.spec = path, .tokenizer = tokpath, .chat_format = _i ? "llama3" : "chatml"};
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), f->name));
    o.chat_format = "alpaca";
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "llama3, chatml"));
    unlink(path);
    fsdp_hftok_free(t);
}
END_TEST

/* Bad rows are FORMAT errors naming the file and the line. */
static const struct bad_row {
    const char *text;      /* the file */
    const char *want;      /* in the message after "line N: " */
    int line;
} BAD_ROWS[] = {
    {"{\"text\": \"a\"}\nnot json\n", "not valid JSON", 2},
    {"{\"text\": \"a\"}\n{\"text\": \"b\"} x\n", "not valid JSON", 2},
    {"[1, 2]\n", "expected a JSON object, found array", 1},
    {"{\"txt\": \"a\"}\n", "expected {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\"}", 1},
    {"{\"text\": 3}\n", "\"text\" must be a string, found number", 1},
    {"{\"text\": \"\"}\n", "\"text\" is empty", 1},
    {"{\"text\": \"a\", \"messages\": []}\n", "two kinds of row", 1},
    {"{\"prompt\": \"a\"}\n", "needs both \"prompt\" and \"completion\"", 1},
    {"{\"prompt\": \"a\", \"completion\": \"\"}\n", "\"completion\" is empty", 1},
    {"{\"prompt\": [], \"completion\": \"b\"}\n", "\"prompt\" must be a string, found array", 1},
    {"{\"prompt\": \"a\", \"completion\": \"b\"}\n\n{\"text\": \"c\"}\n", "but line 1 was an example row", 3},
    {"{\"text\": \"c\"}\n{\"prompt\": \"a\", \"completion\": \"b\"}\n", "an example row, but line 1", 2},
    {"{\"messages\": {}}\n", "\"messages\" must be an array", 1},
    {"{\"messages\": []}\n", "\"messages\" is empty", 1},
    {"{\"messages\": [1]}\n", "messages[0]: expected an object", 1},
    {"{\"messages\": [{\"role\": \"user\"}]}\n", "messages[0]: missing \"content\"", 1},
    {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n",
     "messages[0]: \"content\" must be a string", 1},
    {"{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n",
     "messages[0]: role 'bot' is not one of system, user, assistant", 1},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", "no \"assistant\" message", 1},
    {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
     "\"content\": \"\"}]}\n", "messages[1]: the assistant's content is empty", 1},
};

START_TEST(test_bad_rows)
{
    const struct bad_row *b = &BAD_ROWS[_i];
    char path[64], want[128];
    write_file(path, sizeof path, ".jsonl", b->text);
    fsdp_data_opts o = {.spec = path, .tokenizer = TOK_LLAMA3};
    fsdp_data *d = (fsdp_data *)1;
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_FORMAT);
    ck_assert_ptr_null(d);
    snprintf(want, sizeof want, "'%s' line %d: ", path, b->line);
    ck_assert_msg(strstr(fsdp_error_msg(), want) && strstr(fsdp_error_msg(), b->want),
                  "case %d: '%s' should hold '%s' and '%s'", _i, fsdp_error_msg(), want, b->want);
    unlink(path);
}
END_TEST

/* What needs a tokenizer says so; a tokenizer that does not fit is refused. */
START_TEST(test_open_errors)
{
    char path[64];
    write_file(path, sizeof path, ".jsonl", "{\"text\": \"a\"}\n");
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 1), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "--tokenizer"));
    fsdp_data_opts o = {.spec = path, .tokenizer = "tests/fixtures/no_such.json"};
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_IO);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "no_such.json"));
    o.tokenizer = TOK_GPT2;
    o.vocab_size = 100; /* the model's vocabulary is smaller than the tokens */
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "vocabulary size 100"));
    unlink(path);
    write_file(path, sizeof path, ".jsonl", "\n\n");
    o.vocab_size = 0;
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "has no rows"));
    unlink(path);
    write_file(path, sizeof path, ".txt", "");
    o.spec = path;
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_FORMAT);
    unlink(path);
    o.spec = "synthetic";
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_INVALID_ARG);
    /* chat rows with a tokenizer that has no chat format's tokens */
    write_file(path, sizeof path, ".jsonl",
               "{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}\n");
    o.spec = path;
    ck_assert_int_eq(fsdp_data_open_opts(&d, &o), FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "--chat-format"));
    unlink(path);
}
END_TEST

typedef struct thread_arg {
    const fsdp_data *d;
    int first;
    unsigned sums[64];
} thread_arg;

static void *batch_thread(void *p)
{
    thread_arg *a = p;
    int in[4 * 16], tg[4 * 16];
    for (int m = a->first; m < 64; m += 2) {
        fsdp_data_batch(a->d, (uint64_t)m, 4, 16, in, tg);
        unsigned s = 0;
        for (int i = 0; i < 64; i++)
            s = s * 31u + (unsigned)in[i] * 7u + (unsigned)tg[i];
        a->sums[m] = s;
    }
    return NULL;
}

/* Two threads reading example batches get what one thread gets. */
START_TEST(test_example_threads)
{
    char path[64];
    char rows[4096] = "";
    for (int i = 0; i < 40; i++)
        snprintf(rows + strlen(rows), sizeof rows - strlen(rows),
                 "{\"prompt\": \"question %d\", \"completion\": \" answer %d\"}\n", i, i * i);
    write_file(path, sizeof path, ".jsonl", rows);
    fsdp_data *d = open_data(path, TOK_QWEN2, NULL, 11);
    thread_arg a[2] = {{.d = d, .first = 0}, {.d = d, .first = 1}}, solo[2];
    pthread_t th[2];
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, batch_thread, &a[k]);
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        solo[k] = (thread_arg){.d = d, .first = k};
        batch_thread(&solo[k]);
        for (int m = k; m < 64; m += 2)
            ck_assert_uint_eq(a[k].sums[m], solo[k].sums[m]);
    }
    fsdp_data_close(d);
    unlink(path);
}
END_TEST

/* ---- fsdp tokenize ---------------------------------------------------------------- */

/* `fsdp train` and `fsdp eval` read .jsonl text rows through --tokenizer
 * (training lowers the loss), and example rows (the loss on completions
 * only: the masked mean itself is tested in test_engine.c). */
START_TEST(test_train_command)
{
    char dir[64] = "/tmp/fsdp_test_corpus_XXXXXX", in[128], msg[8192];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(in, sizeof in, "%s/t.jsonl", dir);
    FILE *f = fopen(in, "w");
    for (int i = 0; i < 200; i++)
        fprintf(f, "{\"text\": \"The quick brown fox jumps over the lazy dog %d times.\"}\n", i % 7);
    fclose(f);
    int rc = fsdp_test_cli(msg, sizeof msg,
                           "train --model custom:layers=1,heads=2,channels=32,vocab=704,"
                           "context=32 --data %s --tokenizer %s --steps 30 --lr 1e-2 --devices 2 "
                           "--batch 4 --seq 32 --log %s/m.jsonl --ckpt-dir %s/ck --quiet", in,
                           TOK_GPT2, dir, dir);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg, "eval --model %s/ck/step_00000030 --data %s --tokenizer %s "
                       "--batch 4 --seq 32 --steps 2", dir, in, TOK_GPT2);
    ck_assert_msg(rc == 0 && strstr(msg, "mean loss"), "eval: rc %d: %s", rc, msg);
    float first = 0, last = 0;
    char path[160], line[1024];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    int steps = 0;
    while (fgets(line, sizeof line, f)) {
        char *l = strstr(line, "\"loss\":");
        ck_assert_ptr_nonnull(l);
        last = strtof(l + 7, NULL);
        if (steps++ == 0)
            first = last;
    }
    fclose(f);
    ck_assert_int_eq(steps, 30);
    ck_assert_msg(last < first - 1.0f, "loss %.3f -> %.3f", first, last);
    /* a vocabulary the model cannot hold */
    rc = fsdp_test_cli(msg, sizeof msg, "train --model tiny --data %s --tokenizer %s --steps 1", in,
                       TOK_GPT2);
    ck_assert_msg(rc == 2 && strstr(msg, "vocabulary"), "rc %d: %s", rc, msg);
    /* example rows: the loss looks at the completions only */
    f = fopen(in, "w");
    fprintf(f, "{\"prompt\": \"a\", \"completion\": \"b\"}\n");
    fclose(f);
    rc = fsdp_test_cli(msg, sizeof msg,
                       "train --model custom:layers=1,heads=2,channels=32,vocab=704,"
                       "context=32 --data %s --tokenizer %s --steps 1", in, TOK_GPT2);
    ck_assert_msg(rc == 0 && strstr(msg, "1 examples") && strstr(msg, "completion/assistant"),
                  "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg, "train --model tiny --data %s --steps 1", in);
    ck_assert_msg(rc == 2 && strstr(msg, "--tokenizer"), "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg,
                       "eval --model %s/ck/step_00000030 --data %s --tokenizer %s", dir,
                       in, TOK_GPT2);
    ck_assert_msg(rc == 0 && strstr(msg, "mean loss"), "eval: rc %d: %s", rc, msg);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST

/* Issue 29, 5: when every example was cut at --seq before its completion,
 * training ran on "loss 0.000000 | norm 0.000" and exit 0 while weight
 * decay shrank the weights, --quiet hid the only warning, and eval
 * reported a mean loss of 0. Now train and eval refuse, saying what to
 * change, and a run where only some examples lose their targets warns on
 * stderr even with --quiet. */
START_TEST(test_no_target_left)
{
    char dir[64] = "/tmp/fsdp_test_corpus_XXXXXX", lng[128], mix[128], msg[8192];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(lng, sizeof lng, "%s/long.jsonl", dir);
    snprintf(mix, sizeof mix, "%s/mix.jsonl", dir);
    FILE *a = fopen(lng, "w"), *b = fopen(mix, "w");
    for (int i = 0; i < 8; i++) {
        const char *row = "{\"prompt\": \"the quick brown fox jumps over the lazy dog and the "
                          "quick brown fox jumps over the lazy dog again\", "
                          "\"completion\": \" yes\"}\n";
        fputs(row, a);
        fputs(i % 2 ? row : "{\"prompt\": \"a\", \"completion\": \" yes\"}\n", b);
    }
    fclose(a);
    fclose(b);
    const char *model = "custom:layers=1,heads=2,channels=32,vocab=704,context=32";
    int rc = fsdp_test_cli(msg, sizeof msg, "train --model %s --data %s --tokenizer %s --seq 8 "
                           "--steps 2 --devices 1 --batch 2 --quiet", model, lng, TOK_GPT2);
    ck_assert_msg(rc == 2 && strstr(msg, "none of the 8 examples") &&
                      strstr(msg, "nothing to train on") && strstr(msg, "raise --seq"),
                  "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg, "train --model %s --data %s --tokenizer %s --seq 8 "
                       "--steps 2 --devices 1 --batch 2 --quiet --ckpt-dir %s/ck", model, mix,
                       TOK_GPT2, dir);
    ck_assert_msg(rc == 0 && strstr(msg, "WARN") && strstr(msg, "4 of the 8 examples") &&
                      strstr(msg, "raise --seq"), "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg, "eval --model %s/ck --data %s --tokenizer %s --seq 8 "
                       "--batch 2 --steps 2", dir, lng, TOK_GPT2);
    ck_assert_msg(rc == 2 && strstr(msg, "nothing to evaluate") && strstr(msg, "raise --seq") &&
                      !strstr(msg, "mean loss"), "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg, "eval --model %s/ck --data %s --tokenizer %s --seq 8 "
                       "--batch 1 --steps 2 --per-batch", dir, mix, TOK_GPT2);
    ck_assert_msg(rc == 0 && strstr(msg, "mean loss") && !strstr(msg, "loss 0.000000"),
                  "rc %d: %s", rc, msg);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(rm), 0);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"sources", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_text_streams, 3),
                    FSDP_TEST_LOOP(test_prompt_completion_rows, 2),
                    FSDP_TEST_LOOP(test_chat_rows, 2), test_example_threads)},
        {"errors", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_bad_rows, (int)(sizeof BAD_ROWS / sizeof *BAD_ROWS)),
                    test_open_errors)},
        {"commands", 120, FSDP_TESTS(test_train_command, test_no_target_left)},
    };
    return fsdp_test_main("corpus", tcases, FSDP_TEST_LEN(tcases));
}
