/*
 * test_hfdir_hostile.c - Hugging Face model directories that are not what
 * they should be (src/ckpt/hfdir*.c): tensors of mixed dtypes read
 * exactly; every hostile config.json (syntax, model type, architecture,
 * the keys whose values fsdp does not compute), tensor (missing,
 * mis-shaped, unknown dtype or name, twice), index (syntax, missing
 * files, paths out of the directory, entries the files contradict) and
 * framing (no weights, pickled weights, a broken shard header, a FIFO, an
 * oversized config) refused naming the file and the tensor; and the
 * writer never replacing a file or a non-empty directory, nor leaving
 * anything behind when it fails.
 *
 * Runs from the repository root; each test in a directory of its own in
 * the suite's scratch directory (testutil.h).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/modelfile.h"
#include "hfdir_util.h"
#include "model_files_util.h"
#include "testutil.h"

START_TEST(test_mixed_dtypes)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    loaded src, l;
    quantized(SPEC, &src);
    static const char *const dts[] = {"F32", "BF16", "F16"};
    tdir d;
    tdir_from(&d, &src, 2, dts, 3);
    tdir_write(&d, path_in(dir, "mixed"));
    load_ok(path_in(dir, "mixed"), &l);
    ck_assert_str_eq(l.kind_dtype, "mixed");
    require_same(&src, &l, "F32 + BF16 + F16 in two files");
    loaded_free(&l);
    tdir_free(&d);
    loaded_free(&src);
}
END_TEST

/* Expect opening d (after a mutation) to fail with `want`, naming frags. */
static void expect_dir_error(tdir *d, const char *dir, const char *name, fsdp_status want,
                             const char *frag1, const char *frag2)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    tdir_write(d, p);
    fsdp_model m;
    fsdp_modelfile *mf = NULL;
    fsdp_status st = fsdp_modelfile_resolve(p, &m, &mf);
    expect_error(st, want, name, frag1, frag2, NULL);
    REQUIRE(!mf, "%s: a file came back with an error", name);
}

START_TEST(test_hostile_directories)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    loaded src;
    quantized(SPEC, &src);
    static const char *const f32[] = {"F32"};
    const char *T = "transformer.h.1.attn.c_attn.weight";
    tdir d;
#define CASE(name, mutate, want, f1, f2)                   \
    do {                                                   \
        tdir_from(&d, &src, 2, f32, 1);                    \
        mutate;                                            \
        expect_dir_error(&d, dir, name, want, f1, f2);     \
        tdir_free(&d);                                     \
    } while (0)
    /* config.json */
    CASE("cfg_json", snprintf(d.config, sizeof d.config, "{\"model_type\": \"gpt2\""),
         FSDP_STATUS_FORMAT, "config.json", "not valid JSON");
    CASE("cfg_array", snprintf(d.config, sizeof d.config, "[1]"), FSDP_STATUS_FORMAT,
         "config.json", "not an object");
    CASE("cfg_no_type", replace(d.config, sizeof d.config, "\"model_type\"", "\"model_typo\""),
         FSDP_STATUS_FORMAT, "config.json", "model_type");
    CASE("cfg_type", replace(d.config, sizeof d.config, "\"gpt2\"", "\"mamba\""),
         FSDP_STATUS_UNSUPPORTED, "mamba", "gpt2");
    CASE("cfg_arch", replace(d.config, sizeof d.config, "GPT2LMHeadModel",
                             "GPT2ForSequenceClassification"),
         FSDP_STATUS_UNSUPPORTED, "GPT2ForSequenceClassification", "causal");
    CASE("cfg_act", replace(d.config, sizeof d.config, "gelu_new", "relu"), FSDP_STATUS_FORMAT,
         "activation_function", "config.json");
    CASE("cfg_eps", replace(d.config, sizeof d.config, "1e-05", "1e-06"), FSDP_STATUS_FORMAT,
         "layer_norm_epsilon", "config.json");
    CASE("cfg_untied", replace(d.config, sizeof d.config, "\"tie_word_embeddings\": true",
                               "\"tie_word_embeddings\": false"),
         FSDP_STATUS_FORMAT, "tie_word_embeddings", "config.json");
    CASE("cfg_inner", replace(d.config, sizeof d.config, "\"n_inner\": null", "\"n_inner\": 100"),
         FSDP_STATUS_FORMAT, "n_inner", "config.json");
    CASE("cfg_no_heads", replace(d.config, sizeof d.config, "\"n_head\"", "\"n_heads\""),
         FSDP_STATUS_FORMAT, "n_head", "config.json");
    CASE("cfg_heads", replace(d.config, sizeof d.config, "\"n_head\": 2", "\"n_head\": 3"),
         FSDP_STATUS_FORMAT, "cannot build", "cfg_heads");
    CASE("cfg_layers", replace(d.config, sizeof d.config, "\"n_layer\": 2", "\"n_layer\": -1"),
         FSDP_STATUS_FORMAT, "n_layer", "integer");
    /* tensors: named with their file */
    CASE("t_missing", tdrop(&d, T), FSDP_STATUS_FORMAT, "is missing", T);
    CASE("t_shape", tfind(&d, T)->shape[1] = 64, FSDP_STATUS_FORMAT, T, "shape");
    CASE("t_dtype", snprintf(tfind(&d, T)->dtype, 8, "I32"), FSDP_STATUS_FORMAT, T, "I32");
    CASE("t_unknown", snprintf(tfind(&d, T)->name, 96, "transformer.h.1.attn.c_attnx.weight"),
         FSDP_STATUS_FORMAT, "c_attnx", "model-0000");
    CASE("t_twice", snprintf(tfind(&d, "transformer.ln_f.bias")->name, 96, "ln_f.weight"),
         FSDP_STATUS_FORMAT, "ln_f.weight", "both");
    CASE("t_layer", snprintf(tfind(&d, T)->name, 96, "transformer.h.7.attn.c_attn.weight"),
         FSDP_STATUS_FORMAT, "h.7", "not part of");
#undef CASE
    /* the index against the files */
    struct {
        const char *name, *from, *to, *f1, *f2;
    } idx[] = {
        {"i_json", "}}", "}", "not valid JSON", FSDP_HF_INDEX},
        {"i_no_map", "weight_map", "weight_mop", "no \"weight_map\"", FSDP_HF_INDEX},
        {"i_missing_file", "model-00002-of-00002.safetensors\"",
         "model-00003-of-00002.safetensors\"", "model-00003-of-00002.safetensors", "not a file"},
        {"i_slash", "\"model-00002-of-00002.safetensors\"", "\"../x.safetensors\"", "../x",
         "not in a file of the directory"},
        {"i_not_string", "\"model-00002-of-00002.safetensors\"", "2", "JSON number",
         "weight_map"},
        {"i_unlisted", "\"transformer.ln_f.bias\": \"model-00002-of-00002.safetensors\", ", "",
         "does not list", "transformer.ln_f.bias"},
        {"i_misplaced", "\"transformer.ln_f.bias\": \"model-00002-of-00002.safetensors\"",
         "\"transformer.ln_f.bias\": \"model-00001-of-00002.safetensors\"", "places in",
         "transformer.ln_f.bias"},
        {"i_twice", "\"weight_map\": {", "\"weight_map\": {\"transformer.ln_f.bias\": "
         "\"model-00002-of-00002.safetensors\", ", "appears twice", "transformer.ln_f.bias"},
    };
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) {
        tdir_from(&d, &src, 2, f32, 1);
        char p[128];
        snprintf(p, sizeof p, "%s/%s", dir, idx[i].name);
        tdir_write(&d, p);
        size_t n;
        char *text = (char *)read_file(path_in(p, FSDP_HF_INDEX), &n), buf[8192];
        snprintf(buf, sizeof buf, "%s", text);
        replace(buf, sizeof buf, idx[i].from, idx[i].to);
        write_file(path_in(p, FSDP_HF_INDEX), buf, strlen(buf));
        free(text);
        fsdp_model m;
        fsdp_modelfile *mf = NULL;
        expect_error(fsdp_modelfile_resolve(p, &m, &mf), FSDP_STATUS_FORMAT, idx[i].name,
                     idx[i].f1, idx[i].f2, NULL);
        tdir_free(&d);
    }
    /* no weights; pickled weights; a broken shard header; config.json a FIFO */
    tdir_from(&d, &src, 2, f32, 1);
    char p[128];
    snprintf(p, sizeof p, "%s/no_weights", dir);
    tdir_write(&d, p);
    unlink(path_in(p, FSDP_HF_INDEX));
    fsdp_model m;
    fsdp_modelfile *mf = NULL;
    expect_error(fsdp_modelfile_resolve(p, &m, &mf), FSDP_STATUS_FORMAT, "no weights",
                 "holds neither", FSDP_HF_WEIGHTS, NULL);
    write_file(path_in(p, "pytorch_model.bin"), "x", 1);
    expect_error(fsdp_modelfile_resolve(p, &m, &mf), FSDP_STATUS_FORMAT, "pickle",
                 "pytorch_model.bin", "safe_serialization", NULL);
    snprintf(p, sizeof p, "%s/bad_shard", dir);
    tdir_write(&d, p);
    write_file(path_in(p, "model-00002-of-00002.safetensors"), "\xff\xff\xff\xff\xff\xff\xff\x7f"
               "{}", 10);
    expect_error(fsdp_modelfile_resolve(p, &m, &mf), FSDP_STATUS_FORMAT, "bad shard",
                 "model-00002-of-00002.safetensors", "header length", NULL);
    snprintf(p, sizeof p, "%s/fifo", dir);
    tdir_write(&d, p);
    unlink(path_in(p, "config.json"));
    ck_assert_int_eq(mkfifo(path_in(p, "config.json"), 0644), 0);
    expect_error(fsdp_modelfile_resolve(p, &m, &mf), FSDP_STATUS_IO, "FIFO config",
                 "config.json", "not a regular file", NULL);
    snprintf(p, sizeof p, "%s/big_config", dir);
    tdir_write(&d, p);
    char *big = malloc(FSDP_HF_CONFIG_MAX_BYTES + 2);
    memset(big, ' ', FSDP_HF_CONFIG_MAX_BYTES + 1);
    memcpy(big, "{}", 2);
    write_file(path_in(p, "config.json"), big, FSDP_HF_CONFIG_MAX_BYTES + 1);
    free(big);
    expect_error(fsdp_modelfile_resolve(p, &m, &mf), FSDP_STATUS_FORMAT, "big config",
                 "config.json", "more than", NULL);
    tdir_free(&d);
    loaded_free(&src);
}
END_TEST

START_TEST(test_writer_refuses)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    loaded src;
    quantized(SPEC, &src);
    /* a file at OUT is never replaced */
    char file[128], full[128], empty[128], out[128];
    snprintf(file, sizeof file, "%s/a_file", dir);
    snprintf(full, sizeof full, "%s/full", dir);
    snprintf(empty, sizeof empty, "%s/empty", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    write_file(file, "keep", 4);
    expect_error(write_hf(file, &src, FSDP_DTYPE_F32, 0, NULL, NULL), FSDP_STATUS_IO, "file",
                 "not a directory", "never replaces", NULL);
    size_t n;
    unsigned char *b = read_file(file, &n);
    REQUIRE(n == 4 && !memcmp(b, "keep", 4), "the file at OUT was changed");
    free(b);
    /* a directory with something in it neither */
    mkdir(full, 0755);
    write_file(path_in(full, "x"), "x", 1);
    expect_error(write_hf(full, &src, FSDP_DTYPE_F32, 0, NULL, NULL), FSDP_STATUS_INVALID_ARG,
                 "non-empty dir", "not empty", NULL);
    /* an empty one is filled */
    mkdir(empty, 0755);
    ck_assert_int_eq(write_hf(empty, &src, FSDP_DTYPE_BF16, 0, NULL, NULL), FSDP_STATUS_OK);
    ck_assert(exists(path_in(empty, FSDP_HF_WEIGHTS)));
    /* a failure leaves neither OUT nor its temporary directory */
    expect_error(write_hf(out, &src, FSDP_DTYPE_F32, 1000, NULL, path_in(dir, "no_such.json")),
                 FSDP_STATUS_IO, "missing tokenizer", "no_such.json", NULL);
    ck_assert(!exists(out));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -c tmp", dir);
    FILE *p = popen(cmd, "r");
    int left = -1;
    REQUIRE(fscanf(p, "%d", &left) == 1 && left == 0, "%d temporary entries left in %s", left,
            dir);
    pclose(p);
    loaded_free(&src);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"hostile", 120, .tmpdir = true,
         FSDP_TESTS(test_mixed_dtypes, test_hostile_directories, test_writer_refuses)},
    };
    return fsdp_test_main("hfdir_hostile", tcases, FSDP_TEST_LEN(tcases));
}
