/*
 * test_shard.c - llm.c token shards beyond test_data.c's uint16 files: the
 * uint32 layout (llm.c's Llama 3 shards: magic 20240801, version 7), the
 * shard writer (data/shard.h), and `fsdp tokenize` turning text and .jsonl
 * corpora into shards through a tokenizer.json (tests/fixtures/tok_*.json).
 * A single file goes to /tmp and is removed by its test; directories are
 * in the suite's scratch directory (testutil.h), removed even when a test
 * fails. Runs from the repository root.
 */
#include <check.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "data/chat.h"
#include "data/data.h"
#include "data/hftok.h"
#include "data/shard.h"
#include "data_util.h"
#include "testutil.h"

#define TOK_GPT2 "tests/fixtures/tok_gpt2.json"
#define TOK_LLAMA3 "tests/fixtures/tok_llama3.json"
#define TOK_QWEN2 "tests/fixtures/tok_qwen2.json"

/* ---- uint32 shards and the writer ------------------------------------------ */

START_TEST(test_shard_uint32)
{
    char path[64];
    temp_path(path, sizeof path, "shard", ".bin");
    size_t n = 3000;
    uint32_t *tok = malloc(n * sizeof *tok);
    int *all = malloc(n * sizeof *all);
    for (size_t i = 0; i < n; i++)
        all[i] = (int)(tok[i] = (uint32_t)((i * 7919 + 11) % 128256)); /* Llama 3's vocabulary */
    tok[17] = 128255;
    all[17] = 128255;
    write_token_shard(path, FSDP_SHARD_MAGIC_U32, FSDP_SHARD_VERSION_U32, (int)n, tok, 4, n, 0);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, path, 128256, 1), FSDP_STATUS_OK);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), n);
    ck_assert_int_eq(fsdp_data_vocab(d), 128256);
    ck_assert(!fsdp_data_masked(d));
    for (uint64_t m = 0; m < 12; m++)
        check_batch_against(d, all, n, m, 3, 100);
    fsdp_data_close(d);
    /* a token past the vocabulary, a short file, the wrong version */
    ck_assert_int_eq(fsdp_data_open(&d, path, 128255, 1), FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "128255"));
    write_token_shard(path, FSDP_SHARD_MAGIC_U32, FSDP_SHARD_VERSION_U32, (int)n, tok, 4, n, 2);
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 1), FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "of 4 bytes"));
    write_token_shard(path, FSDP_SHARD_MAGIC_U32, 1, (int)n, tok, 4, n, 0);
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 1), FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "version 7"));
    write_token_shard(path, FSDP_SHARD_MAGIC_U16, 7, (int)n, tok, 4, n, 0);
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 1), FSDP_STATUS_FORMAT);
    /* a uint32 shard whose token does not fit an int */
    tok[3] = 0x80000000u;
    write_token_shard(path, FSDP_SHARD_MAGIC_U32, FSDP_SHARD_VERSION_U32, (int)n, tok, 4, n, 0);
    ck_assert_int_eq(fsdp_data_open(&d, path, 0, 1), FSDP_STATUS_FORMAT);
    free(tok);
    free(all);
    unlink(path);
}
END_TEST

/* The writer picks uint16 up to 65536 ids and uint32 past it; the reader
 * gets back every token, also across a glob of a uint16 and a uint32
 * shard; nothing is at the path until commit; bad ids are refused. */
START_TEST(test_shard_writer)
{
    char dir[128], p16[160], p32[160], glob[160];
    fsdp_test_mkdir(dir, sizeof dir, "writer");
    snprintf(p16, sizeof p16, "%s/a_0.bin", dir);
    snprintf(p32, sizeof p32, "%s/a_1.bin", dir);
    snprintf(glob, sizeof glob, "%s/a_*.bin", dir);
    size_t n = 70000;
    int *ids = malloc(2 * n * sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        ids[i] = (int)((i * 31) % 65536);
        ids[n + i] = (int)((i * 131071) % 151936); /* Qwen2's vocabulary */
    }
    const char *paths[2] = {p16, p32};
    int vocab[2] = {65536, 151936};
    long sizes[2] = {1024 + 2 * (long)n, 1024 + 4 * (long)n};
    for (int k = 0; k < 2; k++) {
        fsdp_shard_writer *w = NULL;
        ck_assert_int_eq(fsdp_shard_writer_open(&w, paths[k], vocab[k]), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_shard_writer_add(w, ids + k * n, 1000), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_shard_writer_add(w, ids + k * n + 1000, n - 1000), FSDP_STATUS_OK);
        int bad = vocab[k];
        ck_assert_int_eq(fsdp_shard_writer_add(w, &bad, 1), FSDP_STATUS_INVALID_ARG);
        bad = -1;
        ck_assert_int_eq(fsdp_shard_writer_add(w, &bad, 1), FSDP_STATUS_INVALID_ARG);
        ck_assert_uint_eq(fsdp_shard_writer_count(w), n);
        ck_assert_int_ne(access(paths[k], F_OK), 0); /* not there before commit */
        ck_assert_int_eq(fsdp_shard_writer_close(w, true), FSDP_STATUS_OK);
        FILE *f = fopen(paths[k], "rb");
        fseek(f, 0, SEEK_END);
        ck_assert_int_eq(ftell(f), sizes[k]);
        fclose(f);
    }
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, glob, 0, 1), FSDP_STATUS_OK);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), 2 * n);
    for (uint64_t m = 0; m < 20; m++)
        check_batch_against(d, ids, 2 * n, m * 97, 4, 512);
    fsdp_data_close(d);
    /* an abandoned writer leaves nothing behind */
    char p3[160];
    snprintf(p3, sizeof p3, "%s/b.bin", dir);
    fsdp_shard_writer *w = NULL;
    ck_assert_int_eq(fsdp_shard_writer_open(&w, p3, 1000), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_shard_writer_add(w, ids, 10), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_shard_writer_close(w, false), FSDP_STATUS_OK);
    ck_assert_int_ne(access(p3, F_OK), 0);
    ck_assert_int_eq(fsdp_shard_writer_open(&w, p3, 0), FSDP_STATUS_INVALID_ARG);
    snprintf(p3, sizeof p3, "%s/no/such/dir.bin", dir);
    ck_assert_int_eq(fsdp_shard_writer_open(&w, p3, 10), FSDP_STATUS_IO);
    free(ids);
}
END_TEST

/* The tokens of a shard file (its header checked). */
static int *read_shard(const char *path, size_t *n, int *token_bytes)
{
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s missing", path);
    int32_t h[256];
    ck_assert_uint_eq(fread(h, sizeof h, 1, f), 1);
    *token_bytes = h[0] == FSDP_SHARD_MAGIC_U16 ? 2 : 4;
    ck_assert_int_eq(h[1], *token_bytes == 2 ? FSDP_SHARD_VERSION_U16 : FSDP_SHARD_VERSION_U32);
    *n = (size_t)h[2];
    int *ids = malloc((*n + 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) {
        uint32_t v = 0;
        ck_assert_uint_eq(fread(&v, (size_t)*token_bytes, 1, f), 1);
        ids[i] = (int)v;
    }
    ck_assert_int_eq(fgetc(f), EOF);
    fclose(f);
    return ids;
}

/* Text and jsonl into shards: the documents with their separators, split
 * at --shard-tokens; a vocabulary past 65536 ids gives uint32 shards. */
START_TEST(test_tokenize_files)
{
    char dir[128], in[160], out[160], p[192], msg[4096];
    fsdp_test_mkdir(dir, sizeof dir, "tokenize");
    fsdp_hftok *t = tok_open(TOK_LLAMA3);
    int bos = fsdp_hftok_bos(t);
    snprintf(in, sizeof in, "%s/c.jsonl", dir);
    FILE *f = fopen(in, "w");
    fprintf(f, "{\"text\": \"one <|eot_id|> \\u00e9\"}\n{\"text\": \"two\"}\n"
               "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
               "{\"role\": \"assistant\", \"content\": \"a\"}]}\n"
               "{\"prompt\": \"p\", \"completion\": \"c\"}\n");
    fclose(f);
    int want[256];
    size_t n = 0;
    want[n++] = bos;
    enc(t, "one <|eot_id|> \xc3\xa9", want, &n);
    want[n++] = bos;
    enc(t, "two", want, &n);
    fsdp_chat_msg m[2] = {{"user", "q", 1}, {"assistant", "a", 1}};
    fsdp_ids ids = {0};
    fsdp_flags tr = {0};
    ck_assert_int_eq(fsdp_chat_render(t, fsdp_chat_format_find("llama3"), m, 2, &ids, &tr),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(ids.p[0], bos); /* begins with BOS: no second one */
    memcpy(want + n, ids.p, ids.n * sizeof(int));
    n += ids.n;
    want[n++] = bos;
    enc(t, "p", want, &n);
    enc(t, "c", want, &n);
    want[n++] = fsdp_hftok_eot(t);
    snprintf(out, sizeof out, "%s/o.bin", dir);
    int rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s", in, out, TOK_LLAMA3);
    ck_assert_msg(rc == 0 && strstr(msg, "from 4 documents"), "rc %d: %s", rc, msg);
    size_t got_n;
    int tb;
    int *got = read_shard(out, &got_n, &tb);
    ck_assert_int_eq(tb, 2);
    ck_assert_uint_eq(got_n, n);
    ck_assert(!memcmp(got, want, n * sizeof *got));
    free(got);
    /* split into shards of 7 tokens, then read back as a glob */
    rc = fsdp_test_cli(msg, sizeof msg,
                       "tokenize %s %s --tokenizer %s --shard-tokens 7 --quiet", in,
                       out, TOK_LLAMA3);
    ck_assert_msg(rc == 0 && !*msg, "rc %d: %s", rc, msg);
    size_t at = 0;
    int k = 0;
    for (;; k++) {
        snprintf(p, sizeof p, "%s/o_%06d.bin", dir, k);
        if (access(p, F_OK) != 0)
            break;
        got = read_shard(p, &got_n, &tb);
        ck_assert_uint_le(got_n, 7);
        ck_assert(!memcmp(got, want + at, got_n * sizeof *got));
        at += got_n;
        free(got);
    }
    ck_assert_uint_eq(at, n);
    ck_assert_int_eq(k, (int)((n + 6) / 7));
    snprintf(p, sizeof p, "%s/o_*.bin", dir);
    fsdp_data *d = NULL;
    ck_assert_int_eq(fsdp_data_open(&d, p, 0, 1), FSDP_STATUS_OK);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), n);
    fsdp_data_close(d);
    /* a text file with a tokenizer past 65536 ids: uint32 tokens */
    snprintf(in, sizeof in, "%s/t.txt", dir);
    f = fopen(in, "w");
    fprintf(f, "hello world\n");
    fclose(f);
    snprintf(p, sizeof p, "%s/big.json", dir);
    size_t len;
    FILE *src = fopen(TOK_GPT2, "rb");
    fseek(src, 0, SEEK_END);
    len = (size_t)ftell(src);
    fseek(src, 0, SEEK_SET);
    char *json = malloc(len + 1);
    ck_assert_uint_eq(fread(json, 1, len, src), len);
    fclose(src);
    char *id = strstr(json, "\"id\": 656");
    ck_assert_ptr_nonnull(id);
    f = fopen(p, "wb");
    fwrite(json, 1, (size_t)(id - json), f);
    fprintf(f, "\"id\": 100000");
    fwrite(id + 9, 1, len - (size_t)(id + 9 - json), f);
    fclose(f);
    free(json);
    snprintf(out, sizeof out, "%s/t.bin", dir);
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s", in, out, p);
    ck_assert_msg(rc == 0 && strstr(msg, "(uint32)"), "rc %d: %s", rc, msg);
    got = read_shard(out, &got_n, &tb);
    ck_assert_int_eq(tb, 4);
    ck_assert_int_eq(got[0], 100000); /* <|endoftext|> before the document */
    free(got);
    fsdp_ids_free(&ids);
    fsdp_flags_free(&tr);
    fsdp_hftok_free(t);
}
END_TEST

/* Failures leave no output; usage errors exit 2 and say what is needed. */
/* `fsdp tokenize` writes a chat row as training renders it: the same tokens, nothing
 * added (it once put <|endoftext|> before ChatML rows), with the built-in format and with
 * the model's own template beside the tokenizer. */
START_TEST(test_tokenize_like_training)
{
    char dir[128], tok[192], cfg[192], in[192], out[192], msg[4096];
    fsdp_test_mkdir(dir, sizeof dir, _i ? "with_template" : "builtin");
    char *json = fsdp_test_read_file(TOK_QWEN2, NULL);
    pathf(tok, sizeof tok, "%s/tokenizer.json", dir);
    fsdp_test_write_file(tok, json);
    free(json);
    if (_i) {
        pathf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
        fsdp_test_write_file(cfg, "{\"chat_template\": \"{% for m in messages %}{{ '<|im_start|>'"
                                  " + m.role + '\\\\n' + m.content | trim + '<|im_end|>\\\\n' }}"
                                  "{% endfor %}\", \"eos_token\": \"<|im_end|>\"}");
    }
    pathf(in, sizeof in, "%s/chat.jsonl", dir);
    fsdp_test_write_file(in, "{\"messages\": [{\"role\": \"user\", \"content\": \" 1+1? "
                             "<|im_end|>\"}, {\"role\": \"assistant\", \"content\": \"2\"}]}\n");
    pathf(out, sizeof out, "%s/o.bin", dir);
    int rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s", in, out, tok);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, msg);
    ck_assert_ptr_nonnull(strstr(msg, _i ? "chat: chat template of" : "chat: built-in chat "
                                                                     "format chatml"));
    ck_assert_ptr_nonnull(strstr(msg, "1 special-token strings in the text were kept as text"));
    size_t n;
    int tb;
    int *got = read_shard(out, &n, &tb);
    fsdp_data *d = NULL;
    fsdp_data_opts o = {.spec = in, .seed = 1, .tokenizer = tok};
    ck_assert_msg(fsdp_data_open_opts(&d, &o) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    ck_assert_uint_eq(fsdp_data_n_examples(d), 1);
    ck_assert_uint_eq(fsdp_data_special_text(d), 1);
    ck_assert_ptr_nonnull(strstr(fsdp_data_chat(d), _i ? "chat template" : "chatml"));
    int T = (int)fsdp_data_n_tokens(d);
    int *inputs = malloc((size_t)T * sizeof *inputs), *targets = malloc((size_t)T * sizeof(int));
    ck_assert_int_eq(fsdp_data_batch(d, 0, 1, T, inputs, targets), FSDP_STATUS_OK);
    ck_assert_msg(n == (size_t)T && !memcmp(got, inputs, n * sizeof *got),
                  "the shard has %zu tokens (first %d), training's example %d (first %d)", n,
                  got[0], T, inputs[0]);
    free(inputs);
    free(targets);
    free(got);
    fsdp_data_close(d);
}
END_TEST

START_TEST(test_tokenize_errors)
{
    char dir[128], in[160], out[160], msg[4096], p[192];
    fsdp_test_mkdir(dir, sizeof dir, "tokenize");
    snprintf(in, sizeof in, "%s/c.jsonl", dir);
    FILE *f = fopen(in, "w");
    for (int i = 0; i < 50; i++)
        fprintf(f, "{\"text\": \"row %d\"}\n", i);
    fprintf(f, "{\"text\": 5}\n");
    fclose(f);
    snprintf(out, sizeof out, "%s/o.bin", dir);
    int rc = fsdp_test_cli(msg, sizeof msg,
                           "tokenize %s %s --tokenizer %s --shard-tokens 10", in, out,
                           TOK_GPT2);
    ck_assert_msg(rc == 1 && strstr(msg, "line 51") && strstr(msg, "must be a string"),
                  "rc %d: %s", rc, msg);
    snprintf(p, sizeof p, "ls %s | wc -l", dir);
    FILE *ls = popen(p, "r");
    int files = -1;
    ck_assert_int_eq(fscanf(ls, "%d", &files), 1);
    pclose(ls);
    ck_assert_int_eq(files, 1); /* only the input: every shard written was removed */
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s", in, out);
    ck_assert_msg(rc == 2 && strstr(msg, "--tokenizer"), "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s --format csv", in, out,
                       TOK_GPT2);
    ck_assert_msg(rc == 2 && strstr(msg, "csv"), "rc %d: %s", rc, msg);
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize --help");
    ck_assert_msg(rc == 0 && strstr(msg, "--shard-tokens") && strstr(msg, "chatml"), "%s", msg);
    rc = fsdp_test_cli(msg, sizeof msg,
                       "tokenize %s/none.txt %s --tokenizer %s", dir, out, TOK_GPT2);
    ck_assert_msg(rc == 1 && strstr(msg, "none.txt"), "rc %d: %s", rc, msg);
    ck_assert_int_ne(access(out, F_OK), 0);
}
END_TEST

/* The entries of dir whose names start with prefix. */
static int count_named(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* Issue 29, 1: a failed `fsdp tokenize` used to remove the file already at
 * OUT (and, with --shard-tokens, the shards an earlier run left there):
 * the shards it had committed were removed again, the final path among
 * them. Now nothing is put in place until every shard is complete: a bad
 * row, or a disk that fills, leave every output path as it was. */
START_TEST(test_tokenize_failure_keeps_outputs)
{
    char dir[128], good[160], bad[160], out[160], p[192], msg[4096];
    fsdp_test_mkdir(dir, sizeof dir, "keep");
    pathf(good, sizeof good, "%s/good.jsonl", dir);
    pathf(bad, sizeof bad, "%s/bad.jsonl", dir);
    pathf(out, sizeof out, "%s/o.bin", dir);
    FILE *f = fopen(good, "w");
    for (int i = 0; i < 40; i++)
        fprintf(f, "{\"text\": \"row %d of the corpus\"}\n", i);
    fclose(f);
    f = fopen(bad, "w");
    fprintf(f, "{\"text\": \"a\"}\n{bad\n");
    fclose(f);
    /* one file */
    fsdp_test_write_file(out, "keep\n");
    int rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s", bad, out, TOK_LLAMA3);
    ck_assert_msg(rc == 1 && strstr(msg, "line 2"), "rc %d: %s", rc, msg);
    char *kept = fsdp_test_read_file(out, NULL);
    ck_assert_str_eq(kept, "keep\n");
    free(kept);
    /* shards of an earlier run stay as they were, byte for byte */
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s --shard-tokens 50 --quiet",
                       good, out, TOK_LLAMA3);
    ck_assert_msg(rc == 0, "rc %d: %s", rc, msg);
    int n_before = count_named(dir, "o_");
    ck_assert_int_ge(n_before, 3);
    pathf(p, sizeof p, "%s/o_000001.bin", dir);
    size_t len0, len1;
    char *before = fsdp_test_read_file(p, &len0);
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s --shard-tokens 1", bad, out,
                       TOK_LLAMA3);
    ck_assert_msg(rc == 1, "rc %d: %s", rc, msg);
    char *after = fsdp_test_read_file(p, &len1);
    ck_assert(len0 == len1 && !memcmp(before, after, len0));
    free(after);
    ck_assert_int_eq(count_named(dir, "o_"), n_before); /* no temporary file left either */
    /* a disk that fills (a file-size limit: writes past it fail with EFBIG) */
    fsdp_test_write_file(out, "keep\n");
    f = fopen(good, "a");
    for (int i = 0; i < 2000; i++) /* well past 1 KiB of tokens */
        fprintf(f, "{\"text\": \"more row %d of the corpus\"}\n", i);
    fclose(f);
    rc = fsdp_test_sh(msg, sizeof msg, "trap '' XFSZ; ulimit -f 1; exec %s tokenize %s %s "
                       "--tokenizer %s", FSDP_BIN, good, out, TOK_LLAMA3);
    ck_assert_msg(rc == 1 && strstr(msg, "disk full"), "rc %d: %s", rc, msg);
    kept = fsdp_test_read_file(out, NULL);
    ck_assert_str_eq(kept, "keep\n");
    free(kept);
    rc = fsdp_test_sh(msg, sizeof msg, "trap '' XFSZ; ulimit -f 1; exec %s tokenize %s %s "
                       "--tokenizer %s --shard-tokens 100000", FSDP_BIN, good, out, TOK_LLAMA3);
    ck_assert_msg(rc == 1 && strstr(msg, "disk full"), "rc %d: %s", rc, msg);
    after = fsdp_test_read_file(p, &len1);
    ck_assert(len0 == len1 && !memcmp(before, after, len0));
    free(after);
    free(before);
    ck_assert_int_eq(count_named(dir, "o_"), n_before);
}
END_TEST

/* Issue 29, 6: `--shard-tokens` used to leave the shards of an earlier run
 * with higher numbers, which a later --data 'OUT_*.bin' read with the new
 * ones. They are removed, and the command says so (even with --quiet).
 * Also: the summary names the shards written (it printed the literal
 * "OUT_NNNNNN.bin"), and an empty OUT is a usage error (it was "cannot
 * rename '.tmp.N.0' to ''"). */
START_TEST(test_tokenize_stale_shards)
{
    char dir[128], in[160], out[160], p[192], msg[4096];
    fsdp_test_mkdir(dir, sizeof dir, "stale");
    pathf(in, sizeof in, "%s/c.jsonl", dir);
    pathf(out, sizeof out, "%s/o", dir);
    FILE *f = fopen(in, "w");
    for (int i = 0; i < 10; i++)
        fprintf(f, "{\"text\": \"row %d\"}\n", i);
    fclose(f);
    int rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s --shard-tokens 3",
                           in, out, TOK_GPT2);
    ck_assert_msg(rc == 0 && !strstr(msg, "removed"), "rc %d: %s", rc, msg);
    int n_old = count_named(dir, "o_");
    ck_assert_int_ge(n_old, 5);
    char first[192], last[192];
    pathf(first, sizeof first, "%s/o_000000.bin", dir);
    pathf(last, sizeof last, "%s/o_%06d.bin", dir, n_old - 1);
    REQUIRE(strstr(msg, first) && strstr(msg, last) && !strstr(msg, "NNNNNN"), "%s", msg);
    fsdp_data *d = NULL;
    pathf(p, sizeof p, "%s/o_*.bin", dir);
    ck_assert_int_eq(fsdp_data_open(&d, p, 0, 1), FSDP_STATUS_OK);
    uint64_t tokens = fsdp_data_n_tokens(d);
    fsdp_data_close(d);
    /* the same corpus in one shard: the others are gone, and said to be */
    rc = fsdp_test_cli(msg, sizeof msg,
                       "tokenize %s %s --tokenizer %s --shard-tokens 1000 --quiet", in, out,
                       TOK_GPT2);
    pathf(first, sizeof first, "%s/o_000001.bin", dir);
    ck_assert_msg(rc == 0 && strstr(msg, "removed") && strstr(msg, first) &&
                      strstr(msg, last) && strstr(msg, "o_*.bin"), "rc %d: %s", rc, msg);
    ck_assert_int_eq(count_named(dir, "o_"), 1);
    ck_assert_int_eq(fsdp_data_open(&d, p, 0, 1), FSDP_STATUS_OK);
    ck_assert_uint_eq(fsdp_data_n_tokens(d), tokens);
    fsdp_data_close(d);
    /* files not named as shards are not touched */
    pathf(p, sizeof p, "%s/o_val.bin", dir);
    fsdp_test_write_file(p, "x");
    pathf(p, sizeof p, "%s/o_00001.bin", dir);
    fsdp_test_write_file(p, "x");
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s %s --tokenizer %s --shard-tokens 1000",
                       in, out, TOK_GPT2);
    ck_assert_msg(rc == 0 && !strstr(msg, "removed"), "rc %d: %s", rc, msg);
    ck_assert_int_eq(count_named(dir, "o_"), 3);
    /* an empty OUT */
    rc = fsdp_test_cli(msg, sizeof msg, "tokenize %s '' --tokenizer %s", in, TOK_GPT2);
    ck_assert_msg(rc == 2 && strstr(msg, "OUT is empty"), "rc %d: %s", rc, msg);
    fsdp_tokenize_opts o = {.in = in, .out = "", .tokenizer = TOK_GPT2};
    fsdp_tokenize_result res;
    ck_assert_int_eq(fsdp_tokenize_file(&o, &res), FSDP_STATUS_INVALID_ARG);
}
END_TEST

/* Issue 29, 9: `--shard-tokens 1` fsynced every shard and its directory
 * (47-60 s for 11k tokens); the shards are now synced once, together. */
START_TEST(test_tokenize_syncs_once)
{
    char dir[128], in[160], out[160];
    fsdp_test_mkdir(dir, sizeof dir, "sync");
    pathf(in, sizeof in, "%s/t.txt", dir);
    pathf(out, sizeof out, "%s/o.bin", dir);
    FILE *f = fopen(in, "w");
    for (int i = 0; i < 300; i++)
        fprintf(f, "w%d ", i);
    fclose(f);
    fsdp_tokenize_opts o = {.in = in, .out = out, .tokenizer = TOK_GPT2, .shard_tokens = 1};
    fsdp_tokenize_result res;
    uint64_t before = fsdp_fileio_sync_count();
    ck_assert_int_eq(fsdp_tokenize_file(&o, &res), FSDP_STATUS_OK);
    uint64_t syncs = fsdp_fileio_sync_count() - before;
    ck_assert_int_ge(res.n_shards, 300);
    REQUIRE(syncs <= 2, "%d shards cost %llu syncs (one of the filesystem, one of the "
            "directory expected)", res.n_shards, (unsigned long long)syncs);
    ck_assert_int_eq(count_named(dir, "o_"), res.n_shards);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"files", 60, .tmpdir = true, FSDP_TESTS(test_shard_uint32, test_shard_writer)},
        {"tokenize", 120, .tmpdir = true,
         FSDP_TESTS(test_tokenize_files, FSDP_TEST_LOOP(test_tokenize_like_training, 2),
                    test_tokenize_errors, test_tokenize_failure_keeps_outputs,
                    test_tokenize_stale_shards, test_tokenize_syncs_once)},
    };
    return fsdp_test_main("shard", tcases, FSDP_TEST_LEN(tcases));
}
