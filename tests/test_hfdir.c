/*
 * test_hfdir.c - Hugging Face model directories (src/ckpt/hfdir*.c):
 * transformers' own GPT-2 directory read (logits against its greedy
 * decoding) and written back byte for byte; directories fsdp writes, in
 * fp32 and bf16, one file or sharded with an index, read back exactly and
 * round-tripped through a checkpoint byte for byte; each rank of an
 * engine reading only its shard's bytes; the commands (convert, sample
 * with the directory's tokenizer and --chat, eval); and the Llama golden
 * directories once a family reads them. Hostile directories:
 * test_hfdir_hostile.c.
 *
 * Runs from the repository root. Each test works in a directory of its
 * own in the suite's scratch directory (testutil.h).
 */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/hfdir.h"
#include "ckpt/modelfile.h"
#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "core/fileio.h"
#include "core/world.h"
#include "engine/engine.h"
#include "hfdir_util.h"
#include "model_files_util.h"
#include "testutil.h"
#include "train/infer.h"

/* Every file of directory a is in b with the same bytes, and b has no other. */
static void require_same_dir(const char *a, const char *b, const char *what)
{
    char cmd[1200], out[256];
    snprintf(cmd, sizeof cmd, "diff -r -q '%s' '%s' 2>&1 | head -3", a, b);
    FILE *p = popen(cmd, "r");
    size_t k = fread(out, 1, sizeof out - 1, p);
    out[k] = '\0';
    pclose(p);
    REQUIRE(k == 0, "%s: directories differ: %s", what, out);
}

/* IN -> checkpoint -> Hugging Face directory OUT with dt and shard. */
static void via_checkpoint(const char *in, const char *ck, const char *out, fsdp_dtype dt,
                           uint64_t shard)
{
    loaded a, b;
    load_ok(in, &a);
    write_loaded(ck, "ckpt", &a, FSDP_DTYPE_F32);
    load_ok(ck, &b);
    require_same(&a, &b, "Hugging Face directory -> checkpoint");
    write_hf_ok(out, &b, dt, shard);
    loaded_free(&a);
    loaded_free(&b);
}

/* ---- transformers' own directory ----------------------------------------------------- */

START_TEST(test_transformers_directory)
{
    fsdp_modelfile *mf = NULL;
    ck_assert_int_eq(fsdp_modelfile_open(&mf, HF_FIXTURE), FSDP_STATUS_OK);
    ck_assert_str_eq(fsdp_modelfile_format_short_name(fsdp_modelfile_format_get(mf)), "hf");
    ck_assert_str_eq(fsdp_modelfile_config(mf), "layers=2,heads=2,channels=16,vocab=96,context=32");
    ck_assert_str_eq(fsdp_modelfile_dtype_name(mf), "fp32");
    ck_assert_str_eq(fsdp_modelfile_companions(mf), HF_FIXTURE);
    fsdp_modelfile_close(mf);

    /* greedy decoding from its prompt: transformers' tokens, and logits */
    fsdp_st_file g;
    ck_assert_int_eq(fsdp_st_open(HF_FIXTURE "/golden.safetensors", &g), FSDP_STATUS_OK);
    size_t n;
    unsigned char *gb = read_file(HF_FIXTURE "/golden.safetensors", &n);
    const int32_t *prompt = NULL, *tokens = NULL;
    const float *want = NULL;
    int n_prompt = 0, N = 0, V = 96;
    for (int i = 0; i < g.n_tensors; i++) {
        const void *p = gb + g.data_offset + g.tensors[i].begin;
        if (!strcmp(g.tensors[i].name, "prompt"))
            prompt = p, n_prompt = (int)g.tensors[i].numel;
        else if (!strcmp(g.tensors[i].name, "tokens"))
            tokens = p, N = (int)g.tensors[i].numel;
        else if (!strcmp(g.tensors[i].name, "logits"))
            want = p;
    }
    ck_assert(prompt && tokens && want && N > 0);
    for (int devices = 1; devices <= 2; devices++) {
        fsdp_infer_config ic;
        fsdp_infer_config_default(&ic);
        ic.backend = FSDP_BACKEND_CPU;
        ic.model_path = HF_FIXTURE;
        ic.n_ranks = devices;
        int out[16], n_out = 0;
        float *logits = malloc((size_t)N * (size_t)V * sizeof *logits);
        fsdp_sample_config sc = {.prompt = prompt, .n_prompt = n_prompt, .n_tokens = N,
                                 .logits = logits};
        REQUIRE(fsdp_infer_sample(&ic, &sc, out, &n_out) == FSDP_STATUS_OK, "%s",
                fsdp_error_msg());
        ck_assert_int_eq(n_out, N);
        double worst = 0, scale = 0;
        for (int k = 0; k < N * V; k++) {
            double d = logits[k] - want[k];
            worst = d * d > worst * worst ? (d < 0 ? -d : d) : worst;
            scale = want[k] * want[k] > scale * scale ? (want[k] < 0 ? -want[k] : want[k]) : scale;
        }
        for (int k = 0; k < N; k++)
            REQUIRE(out[k] == tokens[k], "%d device(s): token %d is %d, transformers chose %d",
                    devices, k, out[k], tokens[k]);
        REQUIRE(worst <= 1e-5 * scale, "%d device(s): logits differ from transformers' by %g "
                "(largest logit %g)", devices, worst, scale);
        free(logits);
    }
    free(gb);
    fsdp_st_free(&g);

    /* read and written back: transformers' model.safetensors byte for byte */
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    via_checkpoint(HF_FIXTURE, path_in(dir, "ck"), path_in(dir, "back"), FSDP_DTYPE_F32, 0);
    REQUIRE(same_file(HF_FIXTURE "/model.safetensors", path_in(dir, "back/model.safetensors")),
            "transformers' model.safetensors is not written back byte for byte");
    loaded a, b;
    load_ok(HF_FIXTURE, &a);
    load_ok(path_in(dir, "back"), &b);
    require_same(&a, &b, "transformers' directory written back");
    loaded_free(&a);
    loaded_free(&b);
}
END_TEST

/* ---- directories fsdp writes ---------------------------------------------------------- */

START_TEST(test_write_read_roundtrip)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    loaded src;
    quantized(SPEC, &src);
    const uint64_t shards[2] = {0, 20000}; /* one file; files of at most 20 kB */
    fsdp_dtype dts[2] = {FSDP_DTYPE_F32, FSDP_DTYPE_BF16};
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 2; s++) {
            char name[32], hf[128];
            snprintf(name, sizeof name, "hf_%d_%d", d, s);
            snprintf(hf, sizeof hf, "%s/%s", dir, name);
            write_hf_ok(hf, &src, dts[d], shards[s]);
            bool sharded = exists(path_in(hf, FSDP_HF_INDEX));
            REQUIRE(sharded == (s == 1) && exists(path_in(hf, FSDP_HF_WEIGHTS)) == (s == 0),
                    "%s: sharded %d, but the files say otherwise", name, s);
            if (sharded) { /* every file within the limit (no single tensor is larger) */
                fsdp_hfdir_index x;
                size_t n;
                char *t = (char *)read_file(path_in(hf, FSDP_HF_INDEX), &n);
                ck_assert_int_eq(fsdp_hfdir_parse_index("index", t, n, &x), FSDP_STATUS_OK);
                REQUIRE(x.n_files >= 3, "%s: %d files", name, x.n_files);
                uint64_t total = 0;
                for (int f = 0; f < x.n_files; f++) {
                    fsdp_st_file sf;
                    ck_assert_int_eq(fsdp_st_open(path_in(hf, x.files[f]), &sf), FSDP_STATUS_OK);
                    uint64_t data = sf.file_bytes - sf.data_offset;
                    REQUIRE(data <= shards[s] || sf.n_tensors == 1, "%s: %s holds %llu bytes",
                            name, x.files[f], (unsigned long long)data);
                    total += data;
                    fsdp_st_free(&sf);
                }
                ck_assert_uint_eq(total, x.total_size);
                fsdp_hfdir_index_free(&x);
                free(t);
            }
            loaded l;
            load_ok(hf, &l);
            ck_assert_str_eq(l.kind_dtype, d ? "bf16" : "fp32");
            require_same(&src, &l, name);
            loaded_free(&l);
            /* HF -> checkpoint -> HF: the same bytes, every file */
            snprintf(name, sizeof name, "ck_%d_%d", d, s);
            char back[32];
            snprintf(back, sizeof back, "back_%d_%d", d, s);
            via_checkpoint(hf, path_in(dir, name), path_in(dir, back), dts[d], shards[s]);
            require_same_dir(hf, path_in(dir, back), back);
        }
    loaded_free(&src);
}
END_TEST

/* ---- each rank reads its own shard ------------------------------------------------------ */

struct counting {
    const fsdp_modelfile *mf;
    const fsdp_shardmap *sm;
    uint64_t bytes[8];         /* slot r written by rank r's thread only */
};

static fsdp_status counting_init(void *arg, const fsdp_model *m, int unit, size_t begin,
                                 size_t end, float *dst)
{
    struct counting *c = arg;
    uint64_t before = fsdp_modelfile_thread_bytes_read();
    FSDP_TRY(fsdp_modelfile_init_fn((void *)c->mf, m, unit, begin, end, dst));
    /* the slot whose rows of a parameter begin there (init reads runs of whole rows) */
    const fsdp_shard_unit *su = &c->sm->units[unit];
    int slot = -1;
    for (int i = 0; i < su->n_params && slot < 0; i++) {
        const fsdp_shard_param *sp = &su->params[i];
        if (begin >= sp->spec->offset && begin < sp->spec->offset + sp->spec->numel)
            slot = (int)((begin - sp->spec->offset) / sp->row_numel / sp->shard_rows);
    }
    ck_assert_int_ge(slot, 0);
    c->bytes[slot] += fsdp_modelfile_thread_bytes_read() - before;
    return FSDP_STATUS_OK;
}

static fsdp_status init_only(fsdp_world *w, int rank, void *arg)
{
    (void)w;
    fsdp_engine *e = NULL;
    fsdp_status st = fsdp_engine_init(&e, arg, rank);
    fsdp_engine_free(e);
    return st;
}

/* The bytes the flat reader reads for rank r's shard of every unit:
 * stored elements of the range, whole rows of a transposed tensor's band. */
static uint64_t expected_bytes(const fsdp_model *m, const fsdp_shardmap *sm, int r, int esz)
{
    uint64_t total = 0;
    for (int u = 0; u < m->n_units; u++) {
        const fsdp_shard_unit *su = &sm->units[u];
        for (int k = 0; k < su->n_params; k++) {
            const fsdp_shard_param *sp = &su->params[k];
            const fsdp_param_spec *p = sp->spec;
            int i = (int)(p - m->units[u].params);
            size_t at, n = fsdp_shard_param_run(sp, r, &at);
            size_t a = at - p->offset, b = a + n;
            if (!n)
                continue;
            fsdp_weight_tensor w;
            m->family->safetensors->tensor(m, u, i, &w);
            if (w.transposed) {
                size_t R = (size_t)p->shape[1];
                total += ((b - 1) / R - a / R + 1) * R * (uint64_t)esz;
            } else {
                size_t s = b < w.stored_numel ? b : (size_t)w.stored_numel;
                total += a < s ? (s - a) * (uint64_t)esz : 0;
            }
        }
    }
    return total;
}

START_TEST(test_ranks_read_their_shards)
{
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    loaded src;
    quantized(SPEC, &src);
    char hf[128], st_file[128];
    snprintf(hf, sizeof hf, "%s/hf", dir);
    snprintf(st_file, sizeof st_file, "%s/m.safetensors", dir);
    write_hf_ok(hf, &src, FSDP_DTYPE_BF16, 20000);
    const int N = 3;
    fsdp_model m;
    fsdp_modelfile *mf = NULL;
    ck_assert_int_eq(fsdp_modelfile_resolve(hf, &m, &mf), FSDP_STATUS_OK);
    fsdp_engine_config ec = {.backend = FSDP_BACKEND_CPU, .n_ranks = N, .ranks_per_device = 1,
                             .shard = FSDP_SHARD_FULL, .compute_dtype = FSDP_DTYPE_F32,
                             .inference = true, .batch = 1, .seq = 8, .grad_accum = 1};
    fsdp_world *w = NULL;
    fsdp_engine_shared sh;
    ck_assert_int_eq(fsdp_world_init(&w, N), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_engine_shared_init(&sh, &ec, &m, NULL, w), FSDP_STATUS_OK);
    struct counting c = {.mf = mf, .sm = &sh.sm};
    sh.init_fn = counting_init;
    sh.init_arg = &c;
    REQUIRE(fsdp_world_launch(w, init_only, &sh) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
    uint64_t sum = 0, data = 0;
    for (int r = 0; r < N; r++) {
        uint64_t want = expected_bytes(&m, &sh.sm, r, 2);
        REQUIRE(c.bytes[r] == want, "rank %d read %llu bytes, its shard has %llu", r,
                (unsigned long long)c.bytes[r], (unsigned long long)want);
        sum += c.bytes[r];
    }
    for (int u = 0; u < m.n_units; u++)
        for (int i = 0; i < m.units[u].n_params; i++) {
            fsdp_weight_tensor t;
            m.family->safetensors->tensor(&m, u, i, &t);
            data += t.stored_numel * 2;
        }
    /* together the ranks read the files about once: only transposed bands
     * cut by a shard boundary are read twice */
    REQUIRE(sum >= data && sum < data + data / 4, "the ranks read %llu bytes of %llu",
            (unsigned long long)sum, (unsigned long long)data);
    fsdp_engine_shared_free(&sh);
    fsdp_world_free(w);
    fsdp_modelfile_close(mf);
    fsdp_model_free(&m);

    /* and an evaluation reads the same model as the single file does */
    write_loaded(st_file, "safetensors", &src, FSDP_DTYPE_BF16);
    float loss[2];
    const char *paths[2] = {hf, st_file};
    for (int k = 0; k < 2; k++) {
        fsdp_infer_config ic;
        infer_config_cpu(&ic, paths[k], N);
        fsdp_infer_eval_result res;
        REQUIRE(fsdp_infer_eval(&ic, "synthetic", 3, 3, &res) == FSDP_STATUS_OK, "%s",
                fsdp_error_msg());
        loss[k] = res.mean;
        free(res.losses);
    }
    REQUIRE(!memcmp(&loss[0], &loss[1], 4), "eval of the directory %.9g, of the file %.9g",
            (double)loss[0], (double)loss[1]);
    loaded_free(&src);
}
END_TEST

/* ---- the commands ----------------------------------------------------------------------- */

#define TOK_LLAMA3 "tests/fixtures/tok_llama3.json"

START_TEST(test_commands)
{
    char dir[128], out[1 << 14];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    /* a model whose vocabulary holds the llama3 test tokenizer (665 ids),
     * and a tokenizer directory with the companions */
    loaded src;
    quantized("gpt2:layers=1,heads=2,channels=32,vocab=665,context=64", &src);
    char st_file[128], tokdir[128];
    snprintf(st_file, sizeof st_file, "%s/m.safetensors", dir);
    snprintf(tokdir, sizeof tokdir, "%s/tok", dir);
    write_loaded(st_file, "safetensors", &src, FSDP_DTYPE_F32);
    mkdir(tokdir, 0755);
    size_t n;
    unsigned char *tok = read_file(TOK_LLAMA3, &n);
    write_file(path_in(tokdir, "tokenizer.json"), tok, n);
    free(tok);
    write_file(path_in(tokdir, "tokenizer_config.json"), "{\"x\": 1}\n", 9);
    write_file(path_in(tokdir, "generation_config.json"), "{\"eos_token_id\": 664}\n", 22);
    write_file(path_in(tokdir, "notes.txt"), "not copied", 10);

    /* convert: a file to a directory (the default), with the tokenizer's companions */
    int rc = fsdp_test_cli(out, sizeof out, "convert %s %s/hf --tokenizer %s/tokenizer.json",
                           st_file, dir, tokdir);
    REQUIRE(rc == 0 && strstr(out, "Hugging Face directory") &&
            strstr(out, "tokenizer_config.json, generation_config.json, tokenizer.json"),
            "convert: rc %d: %s", rc, out);
    ck_assert(same_file(TOK_LLAMA3, path_in(dir, "hf/tokenizer.json")));
    ck_assert(same_file(path_in(tokdir, "generation_config.json"),
                        path_in(dir, "hf/generation_config.json")));
    ck_assert(!exists(path_in(dir, "hf/notes.txt")));
    /* the directory to a checkpoint (the default from one), and back with its tokenizer */
    rc = fsdp_test_cli(out, sizeof out, "convert %s/hf %s/ck --quiet", dir, dir);
    REQUIRE(rc == 0 && !out[0], "convert to a checkpoint: rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "convert %s/hf %s/hf2 --to hf --dtype bf16 "
                       "--shard-size 50000", dir, dir);
    REQUIRE(rc == 0 && exists(path_in(dir, "hf2/" FSDP_HF_INDEX)) &&
            same_file(TOK_LLAMA3, path_in(dir, "hf2/tokenizer.json")),
            "convert hf -> sharded bf16 hf: rc %d: %s", rc, out);
    /* without --dtype a bf16 IN stays bf16 (--dtype fp32 widens it), read back the same */
    rc = fsdp_test_cli(out, sizeof out, "convert %s/hf2 %s/hf3 --to hf", dir, dir);
    REQUIRE(rc == 0 && strstr(out, "hf3' (bf16") && strstr(out, "dtype: bf16, as IN"),
            "convert bf16 hf -> hf: rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "convert %s/hf2 %s/hf4 --to hf --dtype fp32", dir, dir);
    REQUIRE(rc == 0 && strstr(out, "hf4' (fp32") && !strstr(out, "dtype:"),
            "convert bf16 hf -> fp32 hf: rc %d: %s", rc, out);
    for (int k = 0; k < 2; k++) {
        char *cfg = (char *)read_file(path_in(dir, k ? "hf4/config.json" : "hf3/config.json"), &n);
        REQUIRE(strstr(cfg, k ? "float32" : "bfloat16"), "config of hf%d: %s", 3 + k, cfg);
        free(cfg);
    }
    static const fsdp_test_cli_case bad[] = {
        {"convert tests/fixtures/tiny_gpt2.bin /tmp/x.bin --shard-size 1000", 2, "Hugging Face"},
        {"convert tests/fixtures/tiny_gpt2.bin /tmp/x --to zip", 2, "llmc|safetensors|hf|ckpt"},
        {"convert tests/fixtures/tiny_gpt2.bin /dev/null --to hf", 1, "never replaces"},
        {"convert tests/fixtures/hf_gpt2 /tmp/x --to hf --tokenizer " TOK_LLAMA3, 2,
         "another model's tokenizer"},
    };
    fsdp_test_cli_cases(bad, FSDP_TEST_LEN(bad));

    /* sample: the directory's tokenizer, the same text on 1 and 3 devices */
    char s1[4096], s2[4096];
    rc = fsdp_test_cli(s1, sizeof s1, "sample --model %s/hf --prompt 'Hello world' --tokens 6 "
                       "--backend cpu", dir);
    REQUIRE(rc == 0 && !strncmp(s1, "Hello world", 11), "sample: rc %d: %s", rc, s1);
    rc = fsdp_test_cli(s2, sizeof s2, "sample --model %s/hf2 --prompt 'Hello world' --tokens 6 "
                       "--backend cpu --devices 3", dir);
    REQUIRE(rc == 0 && !strcmp(s1, s2), "sharded bf16 on 3 devices: '%s' vs '%s'", s2, s1);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s/ck --prompt 'Hello world' --tokens 6 "
                       "--backend cpu --tokenizer %s", dir, TOK_LLAMA3);
    REQUIRE(rc == 0 && !strcmp(s1, out), "the checkpoint with --tokenizer: '%s' vs '%s'", out,
            s1);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s --prompt hi --chat --backend cpu",
                       st_file);
    REQUIRE(rc == 2 && strstr(out, "tokenizer.json"), "--chat without a tokenizer: %d: %s", rc,
            out);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s/hf --prompt hi --chat --chat-format "
                       "chatml --backend cpu", dir);
    REQUIRE(rc == 2 && strstr(out, "<|im_start|>"), "chatml with a llama3 tokenizer: %d: %s", rc,
            out);
    /* --chat ends at the end of the turn: a model whose every logit favours
     * <|eot_id|> (664) answers nothing and stops after one token */
    loaded eot;
    quantized("gpt2:layers=1,heads=2,channels=32,vocab=665,context=64", &eot);
    const fsdp_param_spec *w = fsdp_model_find_param(&eot.m, "wte.weight", NULL),
                          *g = fsdp_model_find_param(&eot.m, "ln_f.weight", NULL),
                          *bb = fsdp_model_find_param(&eot.m, "ln_f.bias", NULL);
    for (int c = 0; c < 32; c++) {
        eot.units[0][g->offset + (size_t)c] = 0.0f;                  /* h = ln_f.bias */
        eot.units[0][bb->offset + (size_t)c] = c % 2 ? 1.0f : -1.0f;
        eot.units[0][w->offset + 664 * 32 + (size_t)c] = c % 2 ? 2.0f : -2.0f;
    }
    ck_assert_int_eq(write_hf(path_in(dir, "eot"), &eot, FSDP_DTYPE_F32, 0, tokdir, NULL),
                     FSDP_STATUS_OK);
    rc = fsdp_test_cli(out, sizeof out, "sample --model %s/eot --prompt 'Hello' --chat --system "
                       "'Be brief' --tokens 5 --backend cpu --logits %s/l.bin", dir, dir);
    struct stat sb;
    REQUIRE(rc == 0 && !strcmp(out, "\n") && stat(path_in(dir, "l.bin"), &sb) == 0 &&
            sb.st_size == 665 * 4, "--chat did not stop at <|eot_id|>: rc %d, '%s', %lld bytes "
            "of logits", rc, out, (long long)sb.st_size);
    loaded_free(&eot);

    /* eval: the directory's tokenizer, as --tokenizer gives it to the file */
    char txt[128];
    snprintf(txt, sizeof txt, "%s/t.txt", dir);
    FILE *f = fopen(txt, "w");
    for (int i = 0; i < 50; i++)
        fprintf(f, "Hello world, line %d of a small corpus.\n", i);
    fclose(f);
    char e1[512], e2[512];
    rc = fsdp_test_cli(e1, sizeof e1, "eval --model %s/hf --data %s --steps 2 --batch 2 --seq 16 "
                       "--backend cpu", dir, txt);
    REQUIRE(rc == 0 && !strncmp(e1, "mean loss ", 10), "eval: %d: %s", rc, e1);
    rc = fsdp_test_cli(e2, sizeof e2, "eval --model %s --data %s --steps 2 --batch 2 --seq 16 "
                       "--backend cpu --tokenizer %s", st_file, txt, TOK_LLAMA3);
    REQUIRE(rc == 0 && !strncmp(e1, e2, 20), "eval of the directory '%s' vs the file '%s'", e1,
            e2);
    /* train: the directory's tokenizer too, and the same losses as the file
     * with --tokenizer */
    char t1[4096], t2[4096];
    rc = fsdp_test_cli(t1, sizeof t1, "train --model %s/hf --data %s --steps 2 --batch 2 --seq 16 "
                       "--devices 2 --eval 0 --quiet", dir, txt);
    REQUIRE(rc == 0 && strstr(t1, "final loss"), "train on the directory: %d: %s", rc, t1);
    rc = fsdp_test_cli(t2, sizeof t2, "train --model %s --data %s --steps 2 --batch 2 --seq 16 "
                       "--devices 2 --eval 0 --quiet --tokenizer %s", st_file, txt, TOK_LLAMA3);
    REQUIRE(rc == 0 && !strcmp(t1, t2), "train on the directory '%s' vs the file '%s'", t1, t2);
    loaded_free(&src);
}
END_TEST

/* {"messages"} rows render as the training run rendered them: a run that chose
 * the built-in llama3 format over the chat template beside its tokenizer
 * records it (the manifest's chat_format), so eval of its checkpoint
 * reproduces the eval loss it logged bit for bit without --chat-format (and
 * with --chat-format llama3), not with the template's tokens; stderr names
 * the rendering used. A resume takes the recorded format, and refuses
 * another. */
START_TEST(test_eval_chat_format)
{
    char dir[128], out[1 << 14];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    char tokdir[160];
    snprintf(tokdir, sizeof tokdir, "%s/tok", dir);
    mkdir(tokdir, 0755);
    size_t n;
    unsigned char *tok = read_file(TOK_LLAMA3, &n);
    write_file(path_in(tokdir, "tokenizer.json"), tok, n);
    free(tok);
    static const char config[] =
        "{\"chat_template\": \"{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
        "<|end_header_id|>{{ m['content'] }}<|eot_id|>{% endfor %}\"}\n";
    write_file(path_in(tokdir, "tokenizer_config.json"), config, strlen(config));
    loaded src;
    quantized("gpt2:layers=1,heads=2,channels=32,vocab=665,context=64", &src);
    ck_assert_int_eq(write_hf(path_in(dir, "hf"), &src, FSDP_DTYPE_F32, 0, tokdir, NULL),
                     FSDP_STATUS_OK);
    loaded_free(&src);
    FILE *f = fopen(path_in(dir, "chat.jsonl"), "w");
    REQUIRE(f, "cannot create chat.jsonl");
    for (int i = 0; i < 6; i++)
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"What is %d plus %d?\"}, "
                "{\"role\": \"assistant\", \"content\": \"It is %d.\"}]}\n", i, i, 2 * i);
    fclose(f);
    int rc = fsdp_test_cli(out, sizeof out, "train --model %s/hf --data %s/chat.jsonl --eval-data "
                           "%s/chat.jsonl --chat-format llama3 --steps 2 --eval-every 2 --batch 2 "
                           "--seq 32 --precision bf16 --ckpt-dir %s/ck --log %s/m.jsonl --quiet "
                           "--backend cpu",
                           dir, dir, dir, dir, dir);
    REQUIRE(rc == 0, "train: rc %d: %s", rc, out);
    /* its fp32 masters convert as fp32, with a word on the run's bf16 */
    rc = fsdp_test_cli(out, sizeof out, "convert %s/ck %s/out --to hf", dir, dir);
    REQUIRE(rc == 0 && strstr(out, "out' (fp32") && strstr(out, "--precision bf16: --dtype bf16"),
            "convert a bf16 run's checkpoint: rc %d: %s", rc, out);
    unsigned char *log = read_file(path_in(dir, "m.jsonl"), &n);
    const char *at = strstr((const char *)log, "\"eval_loss\":");
    REQUIRE(at, "no eval_loss in the log: %s", log);
    char logged[32];
    snprintf(logged, sizeof logged, "%.6g", strtod(at + 12, NULL));
    free(log);
    char e[5][1024];
    /* without flags: the run's rendering, --batch, --seq (which cuts some examples) and
     * --precision, and the batches that read the file once, as the run's --eval-data figure
     * was taken; another rendering, sequence length or precision gives another figure */
    static const char *const flags[5] = {"", "--batch 2 --chat-format llama3",
                                         "--chat-format template", "--seq 64",
                                         "--precision fp32"};
    for (int k = 0; k < 5; k++) {
        rc = fsdp_test_cli(e[k], sizeof e[k], "eval --model %s/ck/step_00000002 --data "
                           "%s/chat.jsonl %s --backend cpu", dir, dir, flags[k]);
        REQUIRE(rc == 0 && strstr(e[k], k != 2 ? "chat: built-in chat format llama3"
                                               : "chat: chat template of"),
                "eval %s: rc %d: %s", flags[k], rc, e[k]);
        REQUIRE(strstr(e[k], k == 1 ? "defaults: --seq 32 --precision bf16 (the checkpoint's "
                                      "run's"
                                    : "defaults: --batch 2 --seq 32 --precision bf16 (")
                    ? k < 3 : k >= 3, "eval %s: %s", flags[k], e[k]);
        const char *mean = strstr(e[k], "mean loss ");
        bool same = mean && !strncmp(mean + 10, logged, strlen(logged)) &&
                    mean[10 + strlen(logged)] == ' ';
        REQUIRE(same == (k < 2), "eval %s: '%s'; the run logged %s", flags[k], e[k], logged);
        REQUIRE(k != 0 || strstr(e[k], " batches of 2 x 32 tokens"), "%s", e[k]);
    }
    /* a model that is no checkpoint: --seq defaults to the longest example rounded up to 64,
     * as train's; batches past the end of the rows are said to be, not counted */
    rc = fsdp_test_cli(out, sizeof out, "eval --model %s/hf --data %s/chat.jsonl --chat-format "
                       "llama3 --batch 8 --steps 5 --per-batch --backend cpu", dir, dir);
    REQUIRE(rc == 0 && strstr(out, "seq: 64 (default: the longest example") &&
                strstr(out, "batch 0 loss ") && strstr(out, "batch 4: past the end of the data") &&
                strstr(out, "over 1 batch of 8 x 64 tokens") && !strstr(out, "no target"),
            "rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "eval --model %s/hf --data synthetic --pack on "
                       "--backend cpu", dir);
    REQUIRE(rc == 2 && strstr(out, "only example rows"), "rc %d: %s", rc, out);
    /* a resume renders as the checkpoint's run did, and refuses another format */
    rc = fsdp_test_cli(out, sizeof out, "train --model %s/hf --data %s/chat.jsonl --steps 3 "
                       "--batch 2 --seq 32 --precision bf16 --ckpt-dir %s/ck --resume "
                       "--chat-format template --backend cpu", dir, dir, dir);
    REQUIRE(rc == 2 && strstr(out, "rendered with --chat-format llama3"), "rc %d: %s", rc, out);
    rc = fsdp_test_cli(out, sizeof out, "train --model %s/hf --data %s/chat.jsonl --steps 3 "
                       "--batch 2 --seq 32 --precision bf16 --ckpt-dir %s/ck --resume "
                       "--backend cpu", dir, dir,
                       dir);
    REQUIRE(rc == 0 && strstr(out, "chat format: llama3 (the checkpoint's run's") &&
                strstr(out, "chat: built-in chat format llama3"), "rc %d: %s", rc, out);
    static const fsdp_test_cli_case bad[] = {
        {"eval --model tests/fixtures/llama_gqa --data synthetic --chat-format bogus", 2,
         "unknown chat format 'bogus'"},
        {"eval --model tests/fixtures/llama_gqa --data synthetic --steps 0", 2, "--steps"},
        {"eval --model tests/fixtures/llama_gqa --data synthetic --batch -1", 2, "--batch"},
        {"train --model tiny --data synthetic --chat-format bogus --steps 1", 2,
         "unknown chat format 'bogus'"},
        {"sample --model tests/fixtures/llama_gqa --prompt 1,2 --chat-format bogus", 2,
         "unknown chat format 'bogus'"},
        {"sample --model tests/fixtures/llama_gqa --prompt 1,2 --chat-format llama3", 2,
         "apply with --chat"},
        {"sample --model tests/fixtures/llama_gqa --prompt 1,2 --system hi", 2,
         "apply with --chat"},
    };
    fsdp_test_cli_cases(bad, FSDP_TEST_LEN(bad));
}
END_TEST

/* ---- the Llama golden directories -------------------------------------------------------- */

START_TEST(test_llama_directories)
{
    static const char *const dirs[] = {"tests/fixtures/llama_gqa", "tests/fixtures/llama_qwen2"};
    for (int i = 0; i < 2; i++) {
        fsdp_modelfile *mf = NULL;
        fsdp_status st = fsdp_modelfile_open(&mf, dirs[i]);
        REQUIRE(st == FSDP_STATUS_OK, "%s: %s", dirs[i], fsdp_error_msg());
        fsdp_modelfile_close(mf);
    }
    char dir[128];
    fsdp_test_mkdir(dir, sizeof dir, "files");
    for (int i = 0; i < 2; i++) {
        char ck[32], back[32];
        snprintf(ck, sizeof ck, "ck%d", i);
        snprintf(back, sizeof back, "back%d", i);
        via_checkpoint(dirs[i], path_in(dir, ck), path_in(dir, back), FSDP_DTYPE_F32, 0);
        char a[128], b[64];
        snprintf(a, sizeof a, "%s/model.safetensors", dirs[i]);
        snprintf(b, sizeof b, "%s/model.safetensors", back);
        REQUIRE(same_file(a, path_in(dir, b)), "%s: transformers' model.safetensors is not "
                "written back byte for byte", dirs[i]);
    }
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"files", 120, .tmpdir = true,
         FSDP_TESTS(test_transformers_directory, test_write_read_roundtrip,
                    test_ranks_read_their_shards, test_llama_directories)},
        {"commands", 300, .tmpdir = true, FSDP_TESTS(test_commands, test_eval_chat_format)},
    };
    return fsdp_test_main("hfdir", tcases, FSDP_TEST_LEN(tcases));
}
