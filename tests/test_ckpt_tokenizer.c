/*
 * test_ckpt_tokenizer.c - checkpoints carry their tokenizer (issue 28, 7;
 * src/ckpt/ckpt_tok.h): the manifest's `tokenizer_file` lines round-trip
 * and hostile ones are refused; a run trained with --tokenizer writes the
 * files into every checkpoint, and `sample` (plain and --chat), `eval`,
 * `convert` and `train --model` of that checkpoint find it without
 * --tokenizer, giving what
 * they give with it; a resumed run keeps it; a file edited afterwards is
 * refused (an explicit --tokenizer still wins); `convert --to hf` writes a
 * generation_config.json with the chat format's stop tokens; checkpoints
 * without a tokenizer (the version-1 fixture) still read.
 *
 * Runs the fsdp command on a 1-layer GPT-2 whose vocabulary holds the
 * Llama 3 test tokenizer (665 ids: <|begin_of_text|> 659, <|end_of_text|>
 * 660, <|eot_id|> 664). Runs from the repository root.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_tok.h"
#include "core/error.h"
#include "core/json.h"
#include "file_util.h"
#include "testutil.h"

#define TOK_LLAMA3 "tests/fixtures/tok_llama3.json"
#define CKPT_V1 "tests/fixtures/ckpt_v1_tiny"
#define MODEL "gpt2:layers=1,heads=2,channels=32,vocab=665,context=64"
#define TRAIN "train --model " MODEL " --steps 2 --batch 2 --seq 16 --eval 0 --quiet " \
              "--backend cpu --devices 2"

/* ---- the manifest's lines ------------------------------------------------------------ */

/* A tiny model's manifest at `path` carrying tokenizer.json and
 * tokenizer_config.json (bytes of its own), written and its text returned. */
static char *write_carrying(const char *path, const char *tokdir)
{
    fsdp_model model;
    ck_assert_int_eq(fsdp_model_from_spec(MODEL, &model), FSDP_STATUS_OK);
    size_t padded[4], shard[4];
    for (int u = 0; u < model.n_units; u++)
        padded[u] = shard[u] = (model.units[u].numel + 4095) / 4096 * 4096;
    fsdp_ckpt_manifest m = {.version = FSDP_CKPT_VERSION, .run_id = 0x1234, .world_size = 1,
                            .batch = 2, .seq = 16, .grad_accum = 1};
    snprintf(m.shard, sizeof m.shard, "full");
    snprintf(m.compute_dtype, sizeof m.compute_dtype, "fp32");
    fsdp_ckpt_manifest_set_model(&m, &model);
    ck_assert_int_eq(fsdp_ckpt_manifest_set_units(&m, &model, padded, shard), FSDP_STATUS_OK);
    char p[256];
    mkdir(tokdir, 0755);
    pathf(p, sizeof p, "%s/tokenizer.json", tokdir);
    spit(p, "{\"t\": 1}", 8);
    pathf(p, sizeof p, "%s/tokenizer_config.json", tokdir);
    spit(p, "{}", 2);
    pathf(p, sizeof p, "%s/notes.txt", tokdir); /* not a tokenizer file: left behind */
    spit(p, "x", 1);
    pathf(p, sizeof p, "%s/tokenizer.json", tokdir);
    ck_assert_int_eq(fsdp_ckpt_tok_load(&m, p, NULL), FSDP_STATUS_OK);
    ck_assert_int_eq(m.n_tok_files, 2);
    ck_assert_int_eq(fsdp_ckpt_manifest_write(path, &m), FSDP_STATUS_OK);
    fsdp_ckpt_manifest_free(&m);
    fsdp_model_free(&model);
    return slurp(path);
}

START_TEST(test_manifest_lines)
{
    char path[128], tokdir[128], bad[128];
    fsdp_test_path(path, sizeof path, "manifest");
    fsdp_test_path(tokdir, sizeof tokdir, "tok");
    fsdp_test_path(bad, sizeof bad, "bad");
    char *text = write_carrying(path, tokdir);
    REQUIRE(strstr(text, "tokenizer_file tokenizer.json 8 ") &&
                strstr(text, "tokenizer_file tokenizer_config.json 2 "),
            "%s", text);
    fsdp_ckpt_manifest r;
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &r), FSDP_STATUS_OK);
    ck_assert_int_eq(r.n_tok_files, 2);
    ck_assert_str_eq(r.tok_files[0].name, "tokenizer.json");
    ck_assert_uint_eq(r.tok_files[0].size_bytes, 8);
    ck_assert_str_eq(r.tok_files[1].name, "tokenizer_config.json");
    ck_assert_ptr_null(r.tok_files[0].data);
    ck_assert_int_gt(r.tok_files[1].line, r.tok_files[0].line);
    fsdp_ckpt_manifest_free(&r);
    static const struct {
        const char *old, *new, *expect;
    } cases[] = {
        {"tokenizer_file tokenizer_config.json", "tokenizer_file notes.txt",
         "not a tokenizer file"},
        {"tokenizer_file tokenizer_config.json", "tokenizer_file tokenizer.json", "twice"},
        {"tokenizer_file tokenizer_config.json 2 ", "tokenizer_file tokenizer_config.json 2x ",
         "size"},
        {"tokenizer_file tokenizer_config.json 2 ",
         "tokenizer_file tokenizer_config.json 999999999999 ", "size"},
        {"tokenizer_file tokenizer_config.json 2 ", "tokenizer_file tokenizer_config.json 2 3 ",
         "expected 'tokenizer_file"},
        {"tokenizer_file tokenizer_config.json 2 ", "tokenizer_file tokenizer_config.json 2 G",
         "hex"},
        {"tokenizer_file tokenizer.json 8 ", "tokenizer_file special_tokens_map.json 8 ",
         "do not start with tokenizer.json"},
        {"version 4\n", "version 2\n", "'tokenizer' is not part of a version-2"},
        {"tokenizer_file tokenizer.json 8 ", "tokenizer_file tokenizer.json 9 ", "does not match"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(cases); i++) {
        char *t = mutate(text, cases[i].old, cases[i].new);
        spit(bad, t, strlen(t));
        fsdp_status st = fsdp_ckpt_manifest_read(bad, &r);
        REQUIRE(st == FSDP_STATUS_FORMAT && strstr(fsdp_error_msg(), " line ") &&
                    strstr(fsdp_error_msg(), cases[i].expect),
                "case %zu: %s: %s", i, fsdp_status_name(st), fsdp_error_msg());
        ck_assert_int_eq(r.n_tok_files, 0);
        free(t);
    }
    free(text);
    /* without a tokenizer the manifest has no such line: it reads as before */
    fsdp_ckpt_manifest plain;
    fsdp_test_path(bad, sizeof bad, "plain");
    ck_assert_int_eq(fsdp_ckpt_manifest_read(path, &plain), FSDP_STATUS_OK);
    for (int i = 0; i < plain.n_tok_files; i++)
        plain.tok_files[i].data = NULL;
    plain.n_tok_files = 0;
    ck_assert_int_eq(fsdp_ckpt_manifest_write(bad, &plain), FSDP_STATUS_OK);
    text = slurp(bad);
    REQUIRE(!strstr(text, "tokenizer_file"), "%s", text);
    free(text);
    fsdp_ckpt_manifest_free(&plain);
}
END_TEST

/* The version-1 fixture carries no tokenizer: found is false, no error. */
START_TEST(test_old_checkpoint_has_none)
{
    char buf[512];
    bool found = true;
    ck_assert_int_eq(fsdp_ckpt_tok_find(CKPT_V1, buf, sizeof buf, &found), FSDP_STATUS_OK);
    ck_assert(!found);
    found = true;
    ck_assert_int_eq(fsdp_ckpt_tok_find("tests/fixtures/hf_gpt2", buf, sizeof buf, &found),
                     FSDP_STATUS_OK);
    ck_assert(!found);
    ck_assert_int_eq(fsdp_ckpt_tok_find("tiny", buf, sizeof buf, &found), FSDP_STATUS_OK);
    ck_assert(!found);
    char out[4096];
    int rc = fsdp_test_cli(out, sizeof out, "sample --model %s --prompt 1,2 --tokens 2 "
                           "--backend cpu", CKPT_V1);
    REQUIRE(rc == 0, "sample of the version-1 checkpoint: %d: %s", rc, out);
}
END_TEST

/* ---- through the commands ----------------------------------------------------------- */

static bool same(const char *a, const char *b)
{
    size_t na, nb;
    char *x = slurp_n(a, &na), *y = slurp_n(b, &nb);
    bool eq = na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return eq;
}

static int json_int(const fsdp_json *o, const char *key)
{
    const fsdp_json *v = fsdp_json_get(o, key);
    return v && v->type == FSDP_JSON_NUMBER ? (int)v->number : -1;
}

START_TEST(test_commands_find_it)
{
    char dir[128], p[256], q[256], out[1 << 14], with[4096], without[4096];
    fsdp_test_mkdir(dir, sizeof dir, "run");
    /* a tokenizer directory: tokenizer.json and a companion */
    pathf(p, sizeof p, "%s/tok", dir);
    mkdir(p, 0755);
    copy_file(TOK_LLAMA3, strcat(p, "/tokenizer.json"));
    pathf(q, sizeof q, "%s/tok/special_tokens_map.json", dir);
    spit(q, "{\"eos_token\": \"<|eot_id|>\"}\n", 28);
    pathf(q, sizeof q, "%s/t.txt", dir);
    FILE *f = fopen(q, "w");
    for (int i = 0; i < 40; i++)
        fprintf(f, "Hello world, line %d of a small corpus.\n", i);
    fclose(f);
    int rc = fsdp_test_cli(out, sizeof out, TRAIN " --data %s --tokenizer %s --ckpt-dir %s/ck",
                           q, p, dir);
    REQUIRE(rc == 0, "train: %d: %s", rc, out);
    pathf(q, sizeof q, "%s/ck/step_00000002/tokenizer.json", dir);
    ck_assert(same(q, TOK_LLAMA3));
    pathf(q, sizeof q, "%s/ck/step_00000002/special_tokens_map.json", dir);
    ck_assert(exists(q));

    /* sample, plain and --chat, and eval: the same without --tokenizer */
    static const char *const cmds[] = {
        "sample --model %s/ck --prompt 'Hello world' --tokens 4 --backend cpu",
        "sample --model %s/ck --prompt 'Hi' --chat --tokens 4 --backend cpu",
        "eval --model %s/ck --data %s/t.txt --steps 1 --batch 2 --seq 16 --backend cpu",
        "train --model %s/ck --data %s/t.txt --steps 1 --batch 2 --seq 16 --eval 0 --quiet "
        "--backend cpu",
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(cmds); i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, cmds[i], dir, dir);
        rc = fsdp_test_cli(without, sizeof without, "%s", cmd);
        REQUIRE(rc == 0, "%s: %d: %s", cmd, rc, without);
        rc = fsdp_test_cli(with, sizeof with, "%s --tokenizer %s", cmd, p);
        REQUIRE(rc == 0 && !strcmp(with, without), "%s: '%s' without --tokenizer, '%s' with",
                cmd, without, with);
    }
    ck_assert(strstr(without, "final loss"));

    /* convert to a Hugging Face directory: its files and a generation config
     * that stops at <|eot_id|> and <|end_of_text|> */
    rc = fsdp_test_cli(out, sizeof out, "convert %s/ck %s/hf --to hf", dir, dir);
    REQUIRE(rc == 0 && strstr(out, "generation_config.json (written)"), "convert: %d: %s", rc,
            out);
    pathf(q, sizeof q, "%s/hf/tokenizer.json", dir);
    ck_assert(same(q, TOK_LLAMA3));
    pathf(q, sizeof q, "%s/hf/special_tokens_map.json", dir);
    ck_assert(exists(q));
    pathf(q, sizeof q, "%s/hf/generation_config.json", dir);
    fsdp_json *g = NULL;
    ck_assert_int_eq(fsdp_json_parse_file(q, &g), FSDP_STATUS_OK);
    const fsdp_json *eos = fsdp_json_get(g, "eos_token_id");
    REQUIRE(eos && eos->type == FSDP_JSON_ARRAY && eos->n == 2 &&
                fsdp_json_at(eos, 0)->number == 664 && fsdp_json_at(eos, 1)->number == 660,
            "eos_token_id: %s", slurp(q));
    ck_assert_int_eq(json_int(g, "bos_token_id"), 659);
    ck_assert_int_eq(json_int(g, "pad_token_id"), 660);
    fsdp_json_free(g);
    /* a base model's own generation config, which stops at the end of text
     * only: <|eot_id|> is added, the rest kept */
    pathf(q, sizeof q, "%s/tok/generation_config.json", dir);
    const char *base_gen = "{\"eos_token_id\": 660, \"temperature\": 0.6}";
    spit(q, base_gen, strlen(base_gen));
    rc = fsdp_test_cli(out, sizeof out, "convert %s/ck %s/hf-base --to hf --tokenizer %s", dir,
                       dir, p);
    REQUIRE(rc == 0 && strstr(out, "generation_config.json (its end of turn added)"),
            "convert with a base generation config: %d: %s", rc, out);
    pathf(q, sizeof q, "%s/hf-base/generation_config.json", dir);
    ck_assert_int_eq(fsdp_json_parse_file(q, &g), FSDP_STATUS_OK);
    eos = fsdp_json_get(g, "eos_token_id");
    REQUIRE(eos && eos->n == 2 && fsdp_json_at(eos, 0)->number == 660 &&
                fsdp_json_at(eos, 1)->number == 664 &&
                fsdp_json_get(g, "temperature")->number == 0.6,
            "%s", slurp(q));
    fsdp_json_free(g);
    /* ... and back into a checkpoint, which carries it again */
    rc = fsdp_test_cli(out, sizeof out, "convert %s/hf %s/ck2 --to ckpt --quiet", dir, dir);
    pathf(q, sizeof q, "%s/ck2/step_00000000/tokenizer.json", dir);
    REQUIRE(rc == 0 && same(q, TOK_LLAMA3), "hf -> ckpt: %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s/ck2 --prompt 'Hello world' "
                       "--tokens 4 --backend cpu", dir);
    REQUIRE(rc == 0 && !strncmp(out, "Hello world", 11), "sample of ck2: %d: %s", rc, out);

    /* a resumed run keeps it */
    pathf(q, sizeof q, "%s/t.txt", dir);
    rc = fsdp_test_cli(out, sizeof out, "train --model " MODEL " --steps 3 --batch 2 --seq 16 "
                       "--eval 0 --quiet --backend cpu --devices 2 --data %s --tokenizer %s "
                       "--ckpt-dir %s/ck --resume", q, p, dir);
    REQUIRE(rc == 0, "resume: %d: %s", rc, out);
    pathf(q, sizeof q, "%s/ck/step_00000003/tokenizer.json", dir);
    ck_assert(same(q, TOK_LLAMA3));

    /* edited afterwards: refused by sample, eval and convert; --tokenizer wins */
    spit(q, "{}", 2);
    static const fsdp_test_cli_case tampered[] = {
        {"sample --model %s/ck --prompt hi --tokens 1 --backend cpu", 1, "no longer matches"},
        {"eval --model %s/ck --data %s/t.txt --steps 1 --batch 2 --backend cpu", 1,
         "no longer matches"},
        {"convert %s/ck %s/hf3 --to hf", 1, "no longer matches"},
    };
    for (size_t i = 0; i < FSDP_TEST_LEN(tampered); i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, tampered[i].args, dir, dir);
        rc = fsdp_test_cli(out, sizeof out, "%s", cmd);
        REQUIRE(rc == tampered[i].rc && strstr(out, tampered[i].expect) &&
                    strstr(out, "tokenizer.json") && strstr(out, "--tokenizer"),
                "%s: %d: %s", cmd, rc, out);
    }
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s/ck --prompt 'Hello world' --tokens 4 "
                       "--backend cpu --tokenizer %s", dir, p);
    REQUIRE(rc == 0 && !strncmp(out, "Hello world", 11), "--tokenizer wins: %d: %s", rc, out);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"format", 60, .tmpdir = true,
         FSDP_TESTS(test_manifest_lines, test_old_checkpoint_has_none)},
        {"commands", 120, .tmpdir = true, FSDP_TESTS(test_commands_find_it)},
    };
    return fsdp_test_main("ckpt_tokenizer", tcases, FSDP_TEST_LEN(tcases));
}
