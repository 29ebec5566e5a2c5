/*
 * test_registry.c - the model registry (models/registry.c) and the one
 * --model entry point (fsdp_modelfile_resolve): every named shape of every
 * family builds and carries a canonical config that rebuilds it; specs
 * round-trip; the strict key=value reader; the help text names every shape
 * once; and every family's weight-file mappings keep their contract
 * (a permutation for llm.c, names that map back, consistent shapes), so a
 * new family is checked by this suite without new tests.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "case_util.h"
#include "ckpt/modelfile.h"
#include "core/error.h"
#include "models/registry.h"
#include "testutil.h"

static void build_ok(const char *spec, fsdp_model *m)
{
    fsdp_status st = fsdp_model_from_spec(spec, m);
    REQUIRE(st == FSDP_STATUS_OK, "'%s': %s", spec, fsdp_error_msg());
}

/* Same family, config, units and parameter specs. */
static void same_model(const fsdp_model *a, const fsdp_model *b, const char *what)
{
    REQUIRE(a->family == b->family && !strcmp(a->config, b->config), "%s: %s vs %s", what,
            a->config, b->config);
    REQUIRE(a->n_units == b->n_units && a->numel == b->numel &&
                a->vocab_size == b->vocab_size && a->padded_vocab_size == b->padded_vocab_size &&
                a->max_seq_len == b->max_seq_len,
            "%s: the models differ", what);
    for (int u = 0; u < a->n_units; u++) {
        REQUIRE(a->units[u].n_params == b->units[u].n_params, "%s: unit %d", what, u);
        for (int i = 0; i < a->units[u].n_params; i++) {
            const fsdp_param_spec *p = &a->units[u].params[i], *q = &b->units[u].params[i];
            REQUIRE(!strcmp(p->name, q->name) && p->numel == q->numel && p->offset == q->offset,
                    "%s: parameter %s vs %s", what, p->name, q->name);
        }
    }
}

/* Keys in a key list ("a=1,b=2" -> 2). */
static int n_keys(const char *list)
{
    int n = 1;
    for (; *list; list++)
        n += *list == ',';
    return n;
}

START_TEST(test_every_named_shape_builds)
{
    int shapes = 0;
    ck_assert_int_ge(fsdp_model_family_count(), 1);
    ck_assert_ptr_null(fsdp_model_family_at(fsdp_model_family_count()));
    ck_assert_ptr_null(fsdp_model_family_at(-1));
    for (int i = 0; i < fsdp_model_family_count(); i++) {
        const fsdp_model_family *f = fsdp_model_family_at(i);
        ck_assert_ptr_eq(fsdp_model_family_find(f->name), f);
        REQUIRE(f->title && f->doc && f->grammar && f->build && f->flops_per_token,
                "family %s lacks an entry", f->name);
        for (int k = 0; k < f->n_shapes; k++, shapes++) {
            const fsdp_model_shape *s = &f->shapes[k];
            fsdp_model m, again, respec;
            build_ok(s->name, &m);
            ck_assert_ptr_eq(m.family, f);
            ck_assert_str_eq(m.name, s->name);
            /* the table's config is already canonical: every key, in order */
            REQUIRE(!strcmp(m.config, s->config), "%s: table says '%s', canonical is '%s'",
                    s->name, s->config, m.config);
            ck_assert_int_eq(n_keys(m.config), n_keys(f->grammar));
            ck_assert_int_gt(m.n_units, 1);
            ck_assert_uint_gt(m.numel, 0);
            /* at least the forward and backward of most parameters, and
             * attention's share growing with T (an untied embedding table is
             * a lookup: not every parameter multiplies) */
            ck_assert(m.family->flops_per_token(&m, 16) > 4.0 * (double)m.numel);
            ck_assert(m.family->flops_per_token(&m, 32) > m.family->flops_per_token(&m, 16));
            /* rebuilt from the family and config (what a checkpoint records) */
            ck_assert_int_eq(fsdp_model_build(f, m.config, &again), FSDP_STATUS_OK);
            same_model(&m, &again, s->name);
            ck_assert_str_eq(again.name, s->name);
            /* and from its spec form */
            char spec[FSDP_MODEL_NAME_MAX];
            fsdp_model_spec_of(&m, spec, sizeof spec);
            build_ok(spec, &respec);
            same_model(&m, &respec, spec);
            fsdp_model_free(&m);
            fsdp_model_free(&again);
            fsdp_model_free(&respec);
        }
    }
    ck_assert_int_ge(shapes, 6);
    ck_assert_ptr_null(fsdp_model_family_find("mamba"));
    ck_assert_ptr_null(fsdp_model_family_find(NULL));
}
END_TEST

START_TEST(test_canonical_configs_round_trip)
{
    static const char *const specs[] = {
        "custom:layers=3,vocab=1000",
        "custom:vocab=1000,layers=3",
        "gpt2:layers=3,vocab=1000",
        "gpt2:context=8,channels=48,heads=3,layers=1,vocab=129",
        "custom:layers=80,heads=64,channels=8192,vocab=32000,context=4096",
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        fsdp_model m, back;
        build_ok(specs[i], &m);
        ck_assert_int_eq(n_keys(m.config), n_keys(m.family->grammar));
        char spec[FSDP_MODEL_NAME_MAX];
        fsdp_model_spec_of(&m, spec, sizeof spec);
        ck_assert_str_eq(m.name, spec); /* no named shape has this config */
        build_ok(spec, &back);
        same_model(&m, &back, specs[i]);
        ck_assert_str_eq(back.config, m.config); /* canonical is a fixed point */
        fsdp_model_free(&m);
        fsdp_model_free(&back);
    }
    /* key order and spelling do not change the canonical form */
    fsdp_model a, b;
    build_ok(specs[0], &a);
    build_ok(specs[1], &b);
    ck_assert_str_eq(a.config, b.config);
    fsdp_model_free(&a);
    fsdp_model_free(&b);
}
END_TEST

START_TEST(test_what_reads_as_a_spec)
{
    static const char *const yes[] = {"tiny", "gpt2-xl", "custom:layers=2", "gpt2:layers=2",
                                      "custom", "custom:", "gpt2:"};
    static const char *const no[] = {"model.bin", "m.safetensors", "/tmp/ck", "gpt2x",
                                     "mamba:layers=2", "", "tiny/", "./tiny"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        REQUIRE(fsdp_model_is_spec(yes[i]), "'%s' should read as a spec", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        REQUIRE(!fsdp_model_is_spec(no[i]), "'%s' should not read as a spec", no[i]);
    ck_assert(!fsdp_model_is_spec(NULL));
}
END_TEST

/* A family with an int and a float key, to test the reader alone. */
static fsdp_status fake_build(fsdp_model *m, const char *config)
{
    (void)m, (void)config;
    return FSDP_STATUS_UNSUPPORTED;
}

static const fsdp_model_family fake = {
    .name = "fake", .title = "Fake", .doc = "test", .grammar = "n=N,eps=E", .build = fake_build,
};

START_TEST(test_key_reader)
{
    int n = 7;
    double eps = 0.5;
    const fsdp_model_key keys[] = {
        {"n", FSDP_MODEL_KEY_INT, &n, 1, 100},
        {"eps", FSDP_MODEL_KEY_FLOAT, &eps, 0.0, 1.0},
    };
    ck_assert_int_eq(fsdp_model_keys_parse(&fake, "eps=1e-5", keys, 2), FSDP_STATUS_OK);
    ck_assert_int_eq(n, 7); /* left out: the default stays */
    ck_assert(eps == 1e-5);
    ck_assert_int_eq(fsdp_model_keys_parse(&fake, "n=100,eps=0.25", keys, 2), FSDP_STATUS_OK);
    ck_assert_int_eq(n, 100);
    ck_assert(eps == 0.25);
    static const text_case bad[] = {
        {"", "empty"},
        {"n=1,,eps=0", "empty entry"},
        {",n=1", "empty entry"},
        {"n=1,", "empty entry"},
        {"n=1,n=2", "'n' is given twice"},
        {"m=1", "unknown key 'm'"},
        {"n", "not key=value"},
        {"n=", "needs an integer"},
        {"n=1.5", "needs an integer"},
        {"n=0x10", "needs an integer"},
        {"n=101", "n=101 is out of range; use 1..100"},
        {"n=0", "out of range"},
        {"n=99999999999999999999999", "needs an integer"},
        {"eps=nan", "needs a number"},
        {"eps=inf", "needs a number"},
        {"eps=0x1p-3", "needs a number"},
        {"eps=2", "out of range"},
        {"eps=-0.5", "out of range"},
        {"eps=1e400", "needs a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = 7;
        eps = 0.5;
        fsdp_status st = fsdp_model_keys_parse(&fake, bad[i].in, keys, 2);
        REQUIRE(st == FSDP_STATUS_INVALID_ARG, "'%s' was accepted", bad[i].in);
        REQUIRE(strstr(fsdp_error_msg(), bad[i].want) && strstr(fsdp_error_msg(), "Fake config") &&
                    strstr(fsdp_error_msg(), "n=N,eps=E"),
                "'%s': message '%s' lacks '%s' or the grammar", bad[i].in, fsdp_error_msg(),
                bad[i].want);
        REQUIRE(n == 7 && eps == 0.5, "'%s': a refused config changed the values", bad[i].in);
    }
}
END_TEST

/* s holds `word` exactly `times` times as a whole '|'/space/',' separated token */
static int count_token(const char *s, const char *word)
{
    int k = 0;
    size_t n = strlen(word);
    for (const char *p = s; (p = strstr(p, word)); p += n) {
        bool start = p == s || strchr("|, ", p[-1]);
        bool end = !p[n] || strchr("|, ", p[n]);
        k += start && end;
    }
    return k;
}

START_TEST(test_help_names_every_shape_once)
{
    char help[2048], files[256], value[4096];
    size_t n = fsdp_model_spec_help(help, sizeof help);
    ck_assert_uint_eq(n, strlen(help));
    fsdp_modelfile_help(files, sizeof files);
    fsdp_modelfile_value_help(value, sizeof value);
    for (int i = 0; i < fsdp_model_family_count(); i++) {
        const fsdp_model_family *f = fsdp_model_family_at(i);
        for (int k = 0; k < f->n_shapes; k++) {
            REQUIRE(count_token(help, f->shapes[k].name) == 1, "'%s' appears %d times in '%s'",
                    f->shapes[k].name, count_token(help, f->shapes[k].name), help);
            ck_assert_int_eq(count_token(value, f->shapes[k].name), 1);
        }
        REQUIRE(strstr(help, f->grammar) && strstr(help, f->doc),
                "the help lacks %s's grammar or doc line", f->name);
    }
    for (int i = 0; i < fsdp_modelfile_format_count(); i++)
        REQUIRE(strstr(files, fsdp_modelfile_format_name(fsdp_modelfile_format_at(i))) ||
                    strstr(files, "checkpoint"),
                "the file help lacks format %d", i);
    REQUIRE(strstr(value, help) && strstr(value, files), "'%s'", value);
    /* the format table's names and suffixes: what convert reads */
    char names[96];
    ck_assert_str_eq(fsdp_modelfile_format_names(names, sizeof names, "|"),
                     "llmc|safetensors|hf|ckpt|peft");
    /* peft is written only (convert --to peft): never what a --model value is */
    REQUIRE(!strstr(files, "PEFT") && !strstr(files, "adapter"), "'%s'", files);
    ck_assert_ptr_eq(fsdp_modelfile_format_of("tests/fixtures/lora_gqa/adapter_init"),
                     fsdp_modelfile_format_find("ckpt"));
    ck_assert_ptr_eq(fsdp_modelfile_format_by_suffix("/x/m.bin"),
                     fsdp_modelfile_format_find("llmc"));
    ck_assert_ptr_eq(fsdp_modelfile_format_by_suffix("m.safetensors"),
                     fsdp_modelfile_format_find("safetensors"));
    ck_assert_ptr_null(fsdp_modelfile_format_by_suffix("m.bin.d"));
    for (int i = 0; i < fsdp_modelfile_format_count(); i++) {
        const fsdp_modelfile_format *f = fsdp_modelfile_format_at(i);
        const char *sn = fsdp_modelfile_format_short_name(f);
        bool dir = !strcmp(sn, "hf") || !strcmp(sn, "ckpt") || !strcmp(sn, "peft");
        ck_assert_int_eq(fsdp_modelfile_format_is_dir(f), dir);
        ck_assert_int_eq(fsdp_modelfile_format_writes_bf16(f),
                         strcmp(sn, "ckpt") != 0 && strcmp(sn, "peft") != 0);
        ck_assert_int_eq(fsdp_modelfile_format_ships_tokenizer(f),
                         !strcmp(fsdp_modelfile_format_short_name(f), "hf"));
    }
    /* a short buffer: truncated, terminated, the length that fits */
    char small[16];
    ck_assert_uint_eq(fsdp_model_spec_help(small, sizeof small), sizeof small - 1);
    ck_assert_uint_eq(strlen(small), sizeof small - 1);
    /* the commands print it: each shape once per --model help */
    static const char *const cmds[] = {"train", "plan", "shardmap"};
    for (int c = 0; c < 3; c++) {
        char cmd[256], out[16384];
        snprintf(cmd, sizeof cmd, "%s %s --help 2>&1", FSDP_BIN, cmds[c]);
        FILE *p = popen(cmd, "r");
        ck_assert_ptr_nonnull(p);
        size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = '\0';
        pclose(p);
        const fsdp_model_family *f = fsdp_model_family_at(0);
        for (int k = 0; k < f->n_shapes; k++)
            REQUIRE(count_token(out, f->shapes[k].name) == 1, "fsdp %s --help names '%s' %d "
                    "times", cmds[c], f->shapes[k].name, count_token(out, f->shapes[k].name));
    }
}
END_TEST

START_TEST(test_resolve)
{
    fsdp_model m;
    fsdp_modelfile *mf = (fsdp_modelfile *)1;
    /* a spec: a model, no file */
    ck_assert_int_eq(fsdp_modelfile_resolve("tiny", &m, &mf), FSDP_STATUS_OK);
    ck_assert_ptr_null(mf);
    ck_assert_str_eq(m.name, "tiny");
    fsdp_model_free(&m);
    /* a file: the model it holds, the file bound to it */
    ck_assert_int_eq(fsdp_modelfile_resolve("tests/fixtures/tiny_gpt2.bin", &m, &mf),
                     FSDP_STATUS_OK);
    ck_assert_ptr_nonnull(mf);
    ck_assert_str_eq(m.config, fsdp_modelfile_config(mf));
    float x[4];
    ck_assert_int_eq(fsdp_modelfile_read_range(mf, 0, 0, 4, x), FSDP_STATUS_OK);
    fsdp_modelfile_close(mf);
    fsdp_model_free(&m);
    /* a file, shape only */
    ck_assert_int_eq(fsdp_modelfile_resolve("tests/fixtures/tiny_gpt2.safetensors", &m, NULL),
                     FSDP_STATUS_OK);
    ck_assert_int_eq(m.vocab_size, 200);
    fsdp_model_free(&m);
    /* errors: a bad spec, something that is neither, a missing file */
    const struct {
        const char *value;
        fsdp_status st;
        const char *frag;
    } bad[] = {
        {"custom:layers=0", FSDP_STATUS_INVALID_ARG, "out of range"},
        {"nothing-here", FSDP_STATUS_INVALID_ARG, "tiny|small"},
        {"/nonexistent/m.bin", FSDP_STATUS_IO, "/nonexistent/m.bin"},
        {NULL, FSDP_STATUS_INVALID_ARG, "no model given"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mf = (fsdp_modelfile *)1;
        fsdp_status st = fsdp_modelfile_resolve(bad[i].value, &m, &mf);
        REQUIRE(st == bad[i].st && strstr(fsdp_error_msg(), bad[i].frag), "'%s': %s (%s)",
                bad[i].value, fsdp_status_name(st), fsdp_error_msg());
        ck_assert_ptr_null(mf);
        ck_assert_ptr_null(m.units);
    }
    /* a name wins over a directory of that name; "./name" is the directory */
    char dir[64] = "/tmp/fsdp_registry_XXXXXX", cwd[4096];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
    ck_assert_int_eq(chdir(dir), 0);
    ck_assert_int_eq(mkdir("tiny", 0755), 0);
    ck_assert_int_eq(fsdp_modelfile_resolve("tiny", &m, NULL), FSDP_STATUS_OK);
    fsdp_model_free(&m);
    ck_assert_int_ne(fsdp_modelfile_resolve("./tiny", &m, NULL), FSDP_STATUS_OK);
    REQUIRE(strstr(fsdp_error_msg(), "no complete checkpoint"), "%s", fsdp_error_msg());
    ck_assert_int_eq(rmdir("tiny"), 0);
    ck_assert_int_eq(chdir(cwd), 0);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

/* ---- the weight-file mappings' contract, for every family that has them --------- */

START_TEST(test_weight_mappings_contract)
{
    for (int i = 0; i < fsdp_model_family_count(); i++) {
        const fsdp_model_family *f = fsdp_model_family_at(i);
        for (int k = 0; k < f->n_shapes; k++) {
            fsdp_model m;
            build_ok(f->shapes[k].name, &m);
            int n = 0;
            for (int u = 0; u < m.n_units; u++)
                n += m.units[u].n_params;
            if (f->llmc) { /* a permutation of the parameters; the header reads back */
                int *order = malloc((size_t)n * sizeof *order);
                char *seen = calloc((size_t)n, 1);
                f->llmc->order(&m, order);
                for (int j = 0; j < n; j++) {
                    REQUIRE(order[j] >= 0 && order[j] < n && !seen[order[j]],
                            "%s: llm.c order entry %d is %d", m.name, j, order[j]);
                    seen[order[j]] = 1;
                }
                int32_t h[254] = {0};
                char config[FSDP_MODEL_CONFIG_MAX];
                f->llmc->header(&m, h, 254);
                ck_assert_int_eq(f->llmc->config(h, 254, config, sizeof config), FSDP_STATUS_OK);
                fsdp_model back;
                ck_assert_int_eq(fsdp_model_build(f, config, &back), FSDP_STATUS_OK);
                ck_assert_str_eq(back.config, m.config);
                fsdp_model_free(&back);
                free(order);
                free(seen);
            }
            if (f->safetensors) { /* names map back to their parameters; shapes add up */
                for (int u = 0; u < m.n_units; u++)
                    for (int j = 0; j < m.units[u].n_params; j++) {
                        const fsdp_param_spec *p = &m.units[u].params[j];
                        fsdp_weight_tensor t;
                        f->safetensors->tensor(&m, u, j, &t);
                        char param[FSDP_WEIGHT_NAME_MAX];
                        REQUIRE(f->safetensors->match(t.name, param, sizeof param) ==
                                        FSDP_WEIGHT_PARAM && !strcmp(param, p->name),
                                "%s: tensor '%s' does not map back to '%s'", m.name, t.name,
                                p->name);
                        uint64_t numel = 1;
                        for (int d = 0; d < t.ndim; d++)
                            numel *= t.shape[d];
                        REQUIRE(numel == t.stored_numel && numel <= p->numel &&
                                    (!t.transposed || (p->ndim == 2 && numel == p->numel)),
                                "%s: tensor '%s' shape does not fit parameter '%s'", m.name,
                                t.name, p->name);
                    }
                char key[16][64], val[16][64];
                int nm = f->safetensors->metadata(&m, key, val, 16);
                ck_assert_int_ge(nm, 0);
                ck_assert_int_le(nm, 16);
            }
            fsdp_model_free(&m);
        }
    }
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"registry", 120,
         FSDP_TESTS(test_every_named_shape_builds, test_canonical_configs_round_trip,
                    test_what_reads_as_a_spec, test_key_reader, test_help_names_every_shape_once,
                    test_resolve, test_weight_mappings_contract)},
    };
    return fsdp_test_main("registry", tcases, FSDP_TEST_LEN(tcases));
}
