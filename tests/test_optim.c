/*
 * test_optim.c - the optimizer layer below the engine: every vectorised
 * AdamW and SGD kernel (each one this CPU runs) against its scalar
 * reference, bit for bit, on inputs full of the values that break sloppy
 * vector code (denormals, signed zeros, overflow to inf, bf16 rounding
 * ties, odd lengths); the optimizer registry and interface (names, state
 * arrays, hyper-parameter checks, per-step constants, the device step on
 * the cpu op table equal to the host step); the worker pool (generic jobs,
 * zero workers, the refcounted process pool and FSDP_CPU_THREADS); host
 * steps on the pool over ranges against single-threaded, including several
 * threads submitting at once; argument errors. Optimizers through the
 * engine are in test_optim_train.c.
 *
 * Kernels this CPU cannot run print "SKIP: ..." (tools/run_tests.sh counts
 * them) instead of passing silently.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>

#include "ckpt/shard_file.h"
#include "core/bf16.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "ops/optim_kernels.h"
#include "optim/host_step.h"
#include "optim/optim.h"
#include "optim/pool.h"
#include "testutil.h"

/* ---- fixtures -------------------------------------------------------------- */

/* One AdamW problem: state and gradient, plus an output buffer big enough
 * for fp32 p_out. */
typedef struct shard {
    size_t n;
    float *p, *g, *m, *v; /* (n,) */
    float *out;           /* (n,) as fp32, or (n,) bf16 in its first half */
} shard;

typedef struct hparams {
    float lr, b1, b2, eps, wd, bc1, bc2, gs;
} hparams;

static const hparams HP_DEFAULT = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.1f, 0.001f, 1.0f};

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* A value that stresses the kernels: mostly ordinary numbers of the given
 * scale, sometimes a signed zero, a denormal, a huge value or a bf16 rounding
 * tie. nonneg: for v (second moments are never negative). */
static float special_value(uint64_t seed, uint64_t stream, uint64_t i, float scale, int nonneg)
{
    uint64_t r = fsdp_rng_u64(seed, stream, i);
    float sign = (!nonneg && (r >> 63)) ? -1.0f : 1.0f;
    float x;
    switch ((r >> 56) & 15) {
    case 0:
        x = 0.0f;
        break;
    case 1:
        x = nonneg ? 0.0f : -0.0f;
        break;
    case 2: /* denormal */
        x = bits_f32((uint32_t)(r & 0x007fffffu) | 1u);
        break;
    case 3: /* smallest normals */
        x = bits_f32(0x00800000u + (uint32_t)(r & 0xffffu));
        break;
    case 4: /* huge: squares and products overflow to inf */
        x = bits_f32(0x7e000000u + (uint32_t)(r & 0x00ffffffu));
        break;
    case 5: /* bf16 tie: low 16 bits exactly 0x8000 */
        x = bits_f32(((uint32_t)(r >> 8) & 0x3fff0000u) | 0x8000u);
        break;
    default:
        x = fsdp_rng_normal(seed, stream, i) * scale;
        break;
    }
    return sign * (nonneg ? fabsf(x) : x);
}

static shard shard_new(size_t n, uint64_t seed)
{
    shard s = {.n = n};
    size_t bytes = (n ? n : 1) * sizeof(float);
    s.p = malloc(bytes);
    s.g = malloc(bytes);
    s.m = malloc(bytes);
    s.v = malloc(bytes);
    s.out = malloc(bytes);
    ck_assert(s.p && s.g && s.m && s.v && s.out);
    for (size_t i = 0; i < n; i++) {
        s.p[i] = special_value(seed, 1, i, 0.05f, 0);
        s.g[i] = special_value(seed, 2, i, 1e-2f, 0);
        s.m[i] = special_value(seed, 3, i, 1e-3f, 0);
        s.v[i] = special_value(seed, 4, i, 1e-6f, 1);
    }
    memset(s.out, 0xa5, bytes);
    return s;
}

static shard shard_copy(const shard *a)
{
    shard s = shard_new(a->n, 0);
    size_t bytes = (a->n ? a->n : 1) * sizeof(float);
    memcpy(s.p, a->p, bytes);
    memcpy(s.g, a->g, bytes);
    memcpy(s.m, a->m, bytes);
    memcpy(s.v, a->v, bytes);
    memcpy(s.out, a->out, bytes);
    return s;
}

static void shard_free(shard *s)
{
    free(s->p);
    free(s->g);
    free(s->m);
    free(s->v);
    free(s->out);
}

/* Output pointer for mode 0 (none), 1 (fp32), 2 (bf16). */
static void *out_ptr(const shard *s, int mode) { return mode ? s->out : NULL; }
static fsdp_dtype out_dt(int mode) { return mode == 2 ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32; }

/* Kernels under test: AdamW on (p, m, v), SGD on (p, buf = m) with
 * momentum b1 (v untouched). */
enum { OPT_ADAMW = 0, OPT_SGD, OPT_COUNT };
static const char *const OPT_NAMES[OPT_COUNT] = {"AdamW", "SGD"};

static void run_ref_opt(int opt, shard *s, const hparams *h, int mode)
{
    if (opt == OPT_SGD)
        fsdp_sgd_ref(s->p, s->g, s->m, s->n, h->lr, h->b1, h->wd, h->gs, out_ptr(s, mode),
                     out_dt(mode));
    else
        fsdp_adamw_ref(s->p, s->g, s->m, s->v, s->n, h->lr, h->b1, h->b2, h->eps, h->wd, h->bc1,
                       h->bc2, h->gs, out_ptr(s, mode), out_dt(mode));
}

static void run_isa_opt(int opt, fsdp_cpu_isa isa, shard *s, const hparams *h, int mode)
{
    if (opt == OPT_SGD)
        fsdp_sgd_cpu(isa, s->p, s->g, s->m, s->n, h->lr, h->b1, h->wd, h->gs, out_ptr(s, mode),
                     out_dt(mode));
    else
        fsdp_adamw_cpu(isa, s->p, s->g, s->m, s->v, s->n, h->lr, h->b1, h->b2, h->eps, h->wd,
                       h->bc1, h->bc2, h->gs, out_ptr(s, mode), out_dt(mode));
}

static void run_ref(shard *s, const hparams *h, int mode) { run_ref_opt(OPT_ADAMW, s, h, mode); }

/* The hyper-parameters o takes among beta1, beta2, eps and momentum, set
 * to these values (resolved: o has no others). */
static fsdp_optim_hparams hp_named(const fsdp_optim *o, float b1, float b2, float eps,
                                   float momentum, float wd)
{
    static const char *const names[] = {"beta1", "beta2", "eps", "momentum"};
    const float values[] = {b1, b2, eps, momentum};
    fsdp_optim_hparams hp = {.weight_decay = wd};
    for (int i = 0; i < 4; i++)
        if (fsdp_optim_hparam_index(o, names[i]) >= 0)
            ck_assert_int_eq(fsdp_optim_hparam_set(o, &hp, names[i], values[i]), FSDP_STATUS_OK);
    fsdp_optim_hparams_resolve(o, &hp, &hp);
    ck_assert_uint_eq(hp.given, (1u << o->n_hparams) - 1u);
    return hp;
}

/* The same AdamW step as the optimizer interface takes it. */
static fsdp_optim_hparams adamw_hp(const hparams *h)
{
    return hp_named(&fsdp_optim_adamw, h->b1, h->b2, h->eps, 0.0f, h->wd);
}

static fsdp_optim_consts adamw_consts(const hparams *h)
{
    return (fsdp_optim_consts){.lr = h->lr, .grad_scale = h->gs, .k = {h->bc1, h->bc2}};
}

/* The whole shard as one AdamW range (decay h->wd). */
static fsdp_optim_range adamw_range(shard *s, const hparams *h, int mode)
{
    return (fsdp_optim_range){.p = s->p, .grad = s->g, .state = {s->m, s->v},
                              .p_out = out_ptr(s, mode), .out_dt = out_dt(mode), .n = s->n,
                              .wd = h->wd};
}

/* Assert two arrays hold the same bits; name the first differing element. */
static void expect_same_bits(const char *what, const void *a, const void *b, size_t n,
                             size_t elem, const char *ctx)
{
    if (memcmp(a, b, n * elem) == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *x = (const uint8_t *)a + i * elem, *y = (const uint8_t *)b + i * elem;
        if (memcmp(x, y, elem) != 0) {
            uint32_t ux = 0, uy = 0;
            memcpy(&ux, x, elem);
            memcpy(&uy, y, elem);
            ck_abort_msg("%s: %s differs at element %zu of %zu: 0x%08x vs reference 0x%08x", ctx,
                         what, i, n, uy, ux);
        }
    }
}

/* ref and got must agree on p, m, v, and the output of the given mode. */
static void expect_same_shard(const shard *ref, const shard *got, int mode, const char *ctx)
{
    expect_same_bits("p", ref->p, got->p, ref->n, 4, ctx);
    expect_same_bits("m", ref->m, got->m, ref->n, 4, ctx);
    expect_same_bits("v", ref->v, got->v, ref->n, 4, ctx);
    if (mode)
        expect_same_bits(mode == 2 ? "p_out (bf16)" : "p_out (fp32)", ref->out, got->out, ref->n,
                         mode == 2 ? 2 : 4, ctx);
}

/* ---- vectorised kernels against the reference ------------------------------ */

static const size_t ODD_LENGTHS[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63,
                                     64, 65, 100, 1021, 4099};

static const hparams HP_SETS[] = {
    {1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, 0.1f, 0.001f, 1.0f},           /* step 1 */
    {6e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 0.6513216f, 0.4012630f, 0.37f}, /* no decay, clipped */
    {3.0f, 0.5f, 0.75f, 1e-30f, 2.5f, 1.0f, 1.0f, 1e20f},             /* extreme: overflows */
    {1e-2f, 0.0f, 0.0f, 0.0f, 1e-3f, 1.0f, 1.0f, 1e-30f},             /* betas 0, eps 0 */
};

/* Loop index: optimizer * FSDP_CPU_ISA_COUNT + the ISA under test. */
START_TEST(test_isa_matches_reference)
{
    fsdp_cpu_isa isa = (fsdp_cpu_isa)(_i % FSDP_CPU_ISA_COUNT);
    int opt = _i / FSDP_CPU_ISA_COUNT;
    if (!fsdp_cpu_isa_supported(isa)) {
        printf("SKIP: %s %s kernel: this CPU or build cannot run it\n", fsdp_cpu_isa_name(isa),
               OPT_NAMES[opt]);
        return;
    }
    char ctx[128];
    uint64_t seed = 100;
    for (size_t h = 0; h < sizeof HP_SETS / sizeof HP_SETS[0]; h++)
        for (size_t k = 0; k < sizeof ODD_LENGTHS / sizeof ODD_LENGTHS[0]; k++)
            for (int mode = 0; mode < 3; mode++) {
                shard ref = shard_new(ODD_LENGTHS[k], seed++);
                shard got = shard_copy(&ref);
                run_ref_opt(opt, &ref, &HP_SETS[h], mode);
                run_isa_opt(opt, isa, &got, &HP_SETS[h], mode);
                snprintf(ctx, sizeof ctx, "%s %s, hparams %zu, n=%zu, out mode %d",
                         OPT_NAMES[opt], fsdp_cpu_isa_name(isa), h, ODD_LENGTHS[k], mode);
                expect_same_shard(&ref, &got, mode, ctx);
                shard_free(&ref);
                shard_free(&got);
            }
}
END_TEST

/* Several consecutive steps from the same state stay identical (the state
 * each step leaves is the next step's input), on misaligned pointers. */
START_TEST(test_isa_multi_step_misaligned)
{
    fsdp_cpu_isa isa = (fsdp_cpu_isa)(_i % FSDP_CPU_ISA_COUNT);
    int opt = _i / FSDP_CPU_ISA_COUNT;
    if (!fsdp_cpu_isa_supported(isa)) {
        printf("SKIP: %s %s kernel (multi-step): this CPU or build cannot run it\n",
               fsdp_cpu_isa_name(isa), OPT_NAMES[opt]);
        return;
    }
    const size_t n = 2053, off = 3; /* element offset 3: 12-byte misalignment */
    shard ref = shard_new(n + off, 7);
    shard got = shard_copy(&ref);
    for (int t = 1; t <= 6; t++) {
        hparams h = HP_DEFAULT;
        h.bc1 = 1.0f - powf(h.b1, (float)t);
        h.bc2 = 1.0f - powf(h.b2, (float)t);
        int mode = t % 3;
        shard r = ref, g = got; /* views at the offset */
        r.p += off, r.g += off, r.m += off, r.v += off, r.out += off, r.n = n;
        g.p += off, g.g += off, g.m += off, g.v += off, g.out += off, g.n = n;
        run_ref_opt(opt, &r, &h, mode);
        run_isa_opt(opt, isa, &g, &h, mode);
        expect_same_shard(&ref, &got, 2, "multi-step, misaligned");
    }
    shard_free(&ref);
    shard_free(&got);
}
END_TEST

/* The bf16 copy is the new fp32 parameter rounded exactly as core/bf16.h
 * rounds: ties to even, NaN kept NaN, infinities and overflow. With lr = 0
 * and zero state, finite parameters pass through unchanged, so the inputs
 * below reach the rounding as they are. */
START_TEST(test_bf16_out_rounding)
{
    static const uint32_t patterns[] = {
        0x3f808000u, /* tie, even: stays 0x3f80 */
        0x3f818000u, /* tie, odd: rounds up to 0x3f82 */
        0x3f807fffu, 0x3f808001u, 0xbf808000u, 0xbf818000u,
        0x7f7fffffu, /* max float: rounds up to inf */
        0x7f7f8000u, 0x00008000u, 0x00018000u, 0x80018000u, /* denormal ties */
        0x00000001u, 0x80000000u, 0x00000000u,
        0x7fc00001u, 0xffa12345u, 0x7f800001u, /* NaNs: must stay NaN */
    };
    const size_t n_pat = sizeof patterns / sizeof patterns[0];
    const size_t n = 3 * 64 + 5; /* each pattern at several lane positions, plus a tail */
    for (int k = 0; k < OPT_COUNT * FSDP_CPU_ISA_COUNT; k++) {
        int isa = k % FSDP_CPU_ISA_COUNT, opt = k / FSDP_CPU_ISA_COUNT;
        if (!fsdp_cpu_isa_supported((fsdp_cpu_isa)isa))
            continue;
        shard ref = shard_new(n, 3);
        for (size_t i = 0; i < n; i++) {
            ref.p[i] = bits_f32(patterns[(i * 7) % n_pat]);
            ref.g[i] = 0.0f;
            ref.m[i] = 0.0f;
            ref.v[i] = 0.0f;
        }
        shard got = shard_copy(&ref);
        hparams h = HP_DEFAULT;
        h.lr = 0.0f;
        h.wd = 0.0f;
        run_ref_opt(opt, &ref, &h, 2);
        run_isa_opt(opt, (fsdp_cpu_isa)isa, &got, &h, 2);
        expect_same_shard(&ref, &got, 2, fsdp_cpu_isa_name((fsdp_cpu_isa)isa));
        const fsdp_bf16 *o = (const fsdp_bf16 *)got.out;
        for (size_t i = 0; i < n; i++) {
            uint32_t in = patterns[(i * 7) % n_pat];
            if ((in & 0x7fffffffu) > 0x7f800000u) {
                ck_assert_msg((o[i] & 0x7fffu) > 0x7f80u, "%s: NaN 0x%08x became 0x%04x",
                              fsdp_cpu_isa_name((fsdp_cpu_isa)isa), in, o[i]);
                continue;
            }
            ck_assert_uint_eq(f32_bits(got.p[i]), in); /* passed through unchanged */
            ck_assert_uint_eq(o[i], fsdp_f32_to_bf16(bits_f32(in)));
        }
        /* Spot checks of the rule itself (element i holds patterns[7i % 17]):
         * a tie with an even mantissa truncates, one with an odd mantissa
         * rounds up, and a tie just under the largest bf16 rounds to inf. */
        ck_assert_uint_eq(n_pat, 17);
        ck_assert_uint_eq(o[0], 0x3f80u); /* patterns[0] = 0x3f808000 */
        ck_assert_uint_eq(o[5], 0x3f82u); /* patterns[1] = 0x3f818000 */
        ck_assert_uint_eq(o[1], 0x7f80u); /* patterns[7] = 0x7f7f8000 */
        shard_free(&ref);
        shard_free(&got);
    }
}
END_TEST

START_TEST(test_best_isa_and_names)
{
    fsdp_cpu_isa best = fsdp_cpu_isa_best();
    ck_assert(fsdp_cpu_isa_supported(best));
    ck_assert(fsdp_cpu_isa_supported(FSDP_CPU_ISA_SCALAR));
    for (int isa = best + 1; isa < FSDP_CPU_ISA_COUNT; isa++)
        ck_assert(!fsdp_cpu_isa_supported((fsdp_cpu_isa)isa));
    ck_assert(!fsdp_cpu_isa_supported(FSDP_CPU_ISA_COUNT));
    ck_assert_str_eq(fsdp_cpu_isa_name(FSDP_CPU_ISA_AVX2), "avx2");
    ck_assert_str_eq(fsdp_cpu_isa_name(FSDP_CPU_ISA_COUNT), "?");
#if defined(__x86_64__)
    ck_assert(fsdp_cpu_isa_supported(FSDP_CPU_ISA_SSE41)); /* x86-64-v2 baseline */
#endif
    printf("optim: best CPU AdamW kernel here: %s\n", fsdp_cpu_isa_name(best));

    /* fsdp_adamw_cpu (the best kernel) equals the reference too. */
    shard ref = shard_new(777, 11);
    shard got = shard_copy(&ref);
    run_ref(&ref, &HP_DEFAULT, 1);
    fsdp_adamw_cpu(FSDP_CPU_ISA_COUNT, got.p, got.g, got.m, got.v, got.n, HP_DEFAULT.lr,
                   HP_DEFAULT.b1, HP_DEFAULT.b2, HP_DEFAULT.eps, HP_DEFAULT.wd, HP_DEFAULT.bc1,
                   HP_DEFAULT.bc2, HP_DEFAULT.gs, got.out, FSDP_DTYPE_F32);
    expect_same_shard(&ref, &got, 1, "fsdp_adamw_cpu");
    shard_free(&ref);
    shard_free(&got);
}
END_TEST

/* ---- the optimizer interface -------------------------------------------- */

START_TEST(test_registry_and_interface)
{
    ck_assert_int_eq(fsdp_optim_count(), 2);
    ck_assert_ptr_eq(fsdp_optim_at(0), &fsdp_optim_adamw); /* the default */
    ck_assert_ptr_eq(fsdp_optim_or_default(NULL), &fsdp_optim_adamw);
    ck_assert_ptr_eq(fsdp_optim_or_default(&fsdp_optim_sgd), &fsdp_optim_sgd);
    ck_assert_ptr_null(fsdp_optim_at(2));
    char buf[128];
    ck_assert_str_eq(fsdp_optim_names(buf, sizeof buf, "|"), "adamw|sgd");
    const fsdp_optim *o = NULL;
    ck_assert_int_eq(fsdp_optim_find("sgd", &o), FSDP_STATUS_OK);
    ck_assert_ptr_eq(o, &fsdp_optim_sgd);
    ck_assert_int_eq(fsdp_optim_find("Adam", &o), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "'Adam' (expected adamw, sgd)"));
    ck_assert_int_eq(fsdp_optim_find(NULL, &o), FSDP_STATUS_INVALID_ARG);
    /* AdamW's state names are the ones checkpoints have always stored */
    ck_assert_int_eq(fsdp_optim_adamw.n_state, 2);
    ck_assert_str_eq(fsdp_optim_state_list(&fsdp_optim_adamw, buf, sizeof buf, ", "),
                     "adam_m, adam_v");
    ck_assert_uint_eq(fsdp_optim_state_bytes(&fsdp_optim_adamw), 8);
    ck_assert_str_eq(fsdp_optim_state_list(&fsdp_optim_sgd, buf, sizeof buf, ","), "momentum");
    ck_assert_uint_eq(fsdp_optim_state_bytes(&fsdp_optim_sgd), 4);
    for (int i = 0; i < fsdp_optim_count(); i++) {
        const fsdp_optim *x = fsdp_optim_at(i);
        ck_assert(x->n_state >= 0 && x->n_state <= FSDP_OPTIM_MAX_STATE);
        ck_assert(x->help && x->help[0] && x->consts && x->device_step && x->host_step);
        /* its hyper-parameters: named once, their defaults in their ranges */
        ck_assert(x->n_hparams >= 0 && x->n_hparams <= FSDP_OPTIM_MAX_HPARAMS);
        fsdp_optim_hparams def;
        fsdp_optim_hparams_resolve(x, &(fsdp_optim_hparams){.weight_decay = 0.1f}, &def);
        ck_assert_msg(fsdp_optim_hparams_check(x, &def) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        for (int k = 0; k < x->n_hparams; k++) {
            const fsdp_optim_hparam *h = &x->hparams[k];
            ck_assert(h->name && h->name[0] && h->help && h->help[0]);
            ck_assert_int_eq(fsdp_optim_hparam_index(x, h->name), k);
            ck_assert(def.v[k] == h->def);
        }
        for (int k = 0; k < x->n_state; k++) { /* names a shard file can store */
            ck_assert(strlen(x->state_names[k]) < FSDP_OPTIM_NAME_MAX);
            ck_assert(fsdp_ckpt_array_name_valid(x->state_names[k]));
            ck_assert_str_ne(x->state_names[k], "master");
        }
        ck_assert(fsdp_ckpt_array_name_valid(x->name)); /* the manifest's optimizer line */
    }

    /* hyper-parameter checks (hp_named sets the ones each optimizer takes) */
    const fsdp_optim_hparams ok = hp_named(&fsdp_optim_adamw, 0.9f, 0.95f, 1e-8f, 0.9f, 0.1f);
    const fsdp_optim_hparams sgd_ok = hp_named(&fsdp_optim_sgd, 0.9f, 0.95f, 1e-8f, 0.9f, 0.1f);
    ck_assert_int_eq(fsdp_optim_hparams_check(&fsdp_optim_adamw, &ok), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_optim_hparams_check(&fsdp_optim_sgd, &sgd_ok), FSDP_STATUS_OK);
    static const struct {
        const fsdp_optim *o;
        float b1, b2, eps, momentum, wd;
        const char *expect;
    } bad[] = {
        {&fsdp_optim_adamw, 1.0f, 0.95f, 1e-8f, 0, 0.1f, "beta1"},
        {&fsdp_optim_adamw, 0.9f, -0.1f, 1e-8f, 0, 0.1f, "beta2"},
        {&fsdp_optim_adamw, NAN, 0.95f, 1e-8f, 0, 0.1f, "beta1"},
        {&fsdp_optim_adamw, 0.9f, 0.95f, 0.0f, 0, 0.1f, "eps"},
        {&fsdp_optim_adamw, 0.9f, 0.95f, INFINITY, 0, 0.1f, "eps"},
        {&fsdp_optim_adamw, 0.9f, 0.95f, 1e-8f, 0, -1.0f, "weight decay"},
        {&fsdp_optim_adamw, 0.9f, 0.95f, 1e-8f, 0, INFINITY, "weight decay"},
        {&fsdp_optim_sgd, 0, 0, 0, 1.0f, 0.1f, "momentum"},
        {&fsdp_optim_sgd, 0, 0, 0, -0.5f, 0.1f, "momentum"},
        {&fsdp_optim_sgd, 0, 0, 0, NAN, 0.1f, "momentum"},
        {&fsdp_optim_sgd, 0, 0, 0, 0.9f, NAN, "weight decay"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fsdp_optim_hparams hp = hp_named(bad[i].o, bad[i].b1, bad[i].b2, bad[i].eps,
                                         bad[i].momentum, bad[i].wd);
        ck_assert_int_eq(fsdp_optim_hparams_check(bad[i].o, &hp), FSDP_STATUS_INVALID_ARG);
        ck_assert_msg(strstr(fsdp_error_msg(), bad[i].expect), "case %zu: %s", i,
                      fsdp_error_msg());
    }
    /* SGD reads no betas or eps: entries past its own are not looked at */
    fsdp_optim_hparams sgd_only = sgd_ok;
    sgd_only.v[1] = 7.0f;
    sgd_only.v[2] = 0.0f;
    ck_assert_int_eq(fsdp_optim_hparams_check(&fsdp_optim_sgd, &sgd_only), FSDP_STATUS_OK);
    /* by name: a name the optimizer does not take is refused, naming those it does */
    fsdp_optim_hparams named = {0};
    ck_assert_int_eq(fsdp_optim_hparam_set(&fsdp_optim_sgd, &named, "beta1", 0.5f),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "(it takes: momentum)"));
    ck_assert_uint_eq(named.given, 0);
    ck_assert_int_eq(fsdp_optim_hparam_set(&fsdp_optim_adamw, &named, "eps", 1e-6f),
                     FSDP_STATUS_OK);
    fsdp_optim_hparams_resolve(&fsdp_optim_adamw, &named, &named); /* the rest: defaults */
    ck_assert(named.v[0] == 0.9f && named.v[1] == 0.95f && named.v[2] == 1e-6f);
    /* the CLI's flags: each name once, in registry order, with every declarer's help */
    ck_assert_int_eq(fsdp_optim_flag_count(), 4);
    static const char *const flags[] = {"beta1", "beta2", "eps", "momentum"};
    for (int i = 0; i < 4; i++)
        ck_assert_str_eq(fsdp_optim_flag_at(i), flags[i]);
    ck_assert_ptr_null(fsdp_optim_flag_at(4));
    char help[256];
    ck_assert_str_eq(fsdp_optim_flag_help("momentum", help, sizeof help),
                     "momentum of --optimizer sgd, in [0, 1) (default 0.9)");
    ck_assert_ptr_nonnull(strstr(fsdp_optim_flag_help("eps", help, sizeof help), "> 0"));

    /* per-step constants: AdamW's bias corrections in double, rounded once */
    fsdp_optim_consts c;
    ck_assert_int_eq(fsdp_optim_adamw.consts(&ok, 0, 1e-3f, 1.0f, &c), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "t = 1"));
    ck_assert_int_eq(fsdp_optim_adamw.consts(&ok, 3, 1e-3f, 0.5f, &c), FSDP_STATUS_OK);
    ck_assert(c.lr == 1e-3f && c.grad_scale == 0.5f);
    ck_assert(c.k[0] == (float)(1.0 - pow((double)0.9f, 3.0)));
    ck_assert(c.k[1] == (float)(1.0 - pow((double)0.95f, 3.0)));
    ck_assert_int_eq(fsdp_optim_sgd.consts(&sgd_ok, 0, 1e-3f, 1.0f, &c),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_int_eq(fsdp_optim_sgd.consts(&sgd_ok, 9, 0.1f, 0.25f, &c), FSDP_STATUS_OK);
    ck_assert(c.lr == 0.1f && c.grad_scale == 0.25f);
}
END_TEST

/* The device step through the cpu op table and the host step (the best
 * vector kernel) give the same bits, p_out included; with no op table
 * (meta) the device step changes nothing. */
START_TEST(test_device_step_equals_host_step)
{
    fsdp_op_ctx ops = {.iface = &fsdp_ops_cpu_i, .dt = FSDP_DTYPE_F32};
    fsdp_op_ctx meta = {.iface = NULL, .dt = FSDP_DTYPE_F32};
    for (int i = 0; i < fsdp_optim_count(); i++) {
        const fsdp_optim *o = fsdp_optim_at(i);
        const fsdp_optim_hparams hp = hp_named(o, 0.9f, 0.95f, 1e-8f, 0.85f, 0.1f);
        for (int mode = 0; mode < 3; mode++) {
            shard a = shard_new(10007, 300 + (uint64_t)(3 * i + mode)), b = shard_copy(&a);
            shard untouched = shard_copy(&a);
            for (int t = 1; t <= 3; t++) {
                fsdp_optim_consts c;
                ck_assert_int_eq(o->consts(&hp, (uint64_t)t, 1e-3f * (float)t, 0.7f, &c),
                                 FSDP_STATUS_OK);
                const hparams h = {.wd = 0.05f};
                fsdp_optim_range ra = adamw_range(&a, &h, mode), rb = adamw_range(&b, &h, mode);
                o->device_step(&ops, &hp, &c, &ra);
                o->host_step(FSDP_CPU_ISA_COUNT, &hp, &c, &rb);
                fsdp_optim_range rm = adamw_range(&untouched, &h, mode);
                o->device_step(&meta, &hp, &c, &rm);
            }
            char ctx[64];
            snprintf(ctx, sizeof ctx, "%s device vs host step, out mode %d", o->name, mode);
            expect_same_shard(&a, &b, mode, ctx);
            shard fresh = shard_new(10007, 300 + (uint64_t)(3 * i + mode));
            expect_same_shard(&fresh, &untouched, 0, "meta device step");
            ck_assert(memcmp(a.p, fresh.p, 10007 * 4) != 0); /* the step did something */
            shard_free(&a);
            shard_free(&b);
            shard_free(&untouched);
            shard_free(&fresh);
        }
    }
}
END_TEST

/* A job over several ranges of one shard, each with its own weight decay,
 * cut into chunks across range ends, equals the ranges stepped one by one
 * on one thread. */
START_TEST(test_job_ranges)
{
    fsdp_pool *pool;
    ck_assert_int_eq(fsdp_pool_create(2, &pool), FSDP_STATUS_OK);
    const size_t C = FSDP_OPTIM_CHUNK_NUMEL, n = 3 * C + 777;
    const size_t cut[] = {0, 100, 100, C + 5, 2 * C, n}; /* [100, 100) is empty */
    const float wd[] = {0.1f, 0.0f, 0.0f, 0.3f, 0.02f};
    const int n_ranges = 5;
    for (int i = 0; i < fsdp_optim_count(); i++) {
        const fsdp_optim *o = fsdp_optim_at(i);
        const fsdp_optim_hparams hp = hp_named(o, 0.9f, 0.999f, 1e-8f, 0.9f, 0.0f);
        shard ref = shard_new(n, 800 + (uint64_t)i), got = shard_copy(&ref);
        fsdp_optim_consts c;
        ck_assert_int_eq(o->consts(&hp, 2, 1e-2f, 1.0f, &c), FSDP_STATUS_OK);
        fsdp_optim_range rr[5], rg[5];
        for (int k = 0; k < n_ranges; k++) {
            size_t lo = cut[k], len = cut[k + 1] - cut[k];
            const hparams h = {.wd = wd[k]};
            shard a = ref, b = got;
            a.p += lo, a.g += lo, a.m += lo, a.v += lo, a.out += lo / 2, a.n = len;
            b.p += lo, b.g += lo, b.m += lo, b.v += lo, b.out += lo / 2, b.n = len;
            rr[k] = adamw_range(&a, &h, 2);
            rg[k] = adamw_range(&b, &h, 2);
            rr[k].p_out = (fsdp_bf16 *)ref.out + lo; /* bf16: 2 bytes per element */
            rg[k].p_out = (fsdp_bf16 *)got.out + lo;
            o->host_step(FSDP_CPU_ISA_SCALAR, &hp, &c, &rr[k]);
        }
        fsdp_optim_job *job;
        ck_assert_int_eq(fsdp_optim_job_submit(pool, o, &hp, &c, rg, n_ranges, FSDP_CPU_ISA_COUNT,
                                               &job),
                         FSDP_STATUS_OK);
        fsdp_optim_job_wait(job, NULL, NULL);
        expect_same_shard(&ref, &got, 2, o->name);
        shard_free(&ref);
        shard_free(&got);
    }
    fsdp_pool_destroy(pool);
}
END_TEST

/* ---- the pool ---------------------------------------------------------- */

typedef struct count_job {
    size_t n_chunks;
    atomic_int *hits;        /* (n_chunks,) times each chunk ran */
} count_job;

static void count_chunk(void *arg, size_t chunk)
{
    count_job *cj = arg;
    ck_assert_uint_lt(chunk, cj->n_chunks);
    atomic_fetch_add(&cj->hits[chunk], 1);
}

static void expect_each_chunk_once(const count_job *cj)
{
    for (size_t c = 0; c < cj->n_chunks; c++)
        ck_assert_msg(atomic_load(&cj->hits[c]) == 1, "chunk %zu ran %d times", c,
                      atomic_load(&cj->hits[c]));
}

static void pool_run_counts(fsdp_pool *pool, size_t n_chunks)
{
    count_job cj = {.n_chunks = n_chunks};
    cj.hits = calloc(n_chunks ? n_chunks : 1, sizeof *cj.hits);
    ck_assert_ptr_nonnull(cj.hits);
    fsdp_pool_job job;
    fsdp_pool_submit(pool, &job, count_chunk, &cj, n_chunks);
    if (n_chunks == 0)
        ck_assert(fsdp_pool_test(pool, &job));
    fsdp_pool_wait(pool, &job);
    ck_assert(fsdp_pool_test(pool, &job));
    expect_each_chunk_once(&cj);
    free(cj.hits);
}

START_TEST(test_pool_generic_jobs)
{
    for (int workers = 0; workers <= 3; workers++) {
        fsdp_pool *pool;
        ck_assert_int_eq(fsdp_pool_create(workers, &pool), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_pool_n_workers(pool), workers);
        pool_run_counts(pool, 0);
        pool_run_counts(pool, 1);
        pool_run_counts(pool, 1000);
        fsdp_pool_destroy(pool);
    }
    fsdp_pool *pool;
    ck_assert_int_eq(fsdp_pool_create(-1, &pool), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_null(pool);
}
END_TEST

/* A job submitted and never helped still finishes: workers do it all. */
START_TEST(test_pool_async_progress)
{
    fsdp_pool *pool;
    ck_assert_int_eq(fsdp_pool_create(2, &pool), FSDP_STATUS_OK);
    count_job cj = {.n_chunks = 64};
    cj.hits = calloc(cj.n_chunks, sizeof *cj.hits);
    fsdp_pool_job job;
    fsdp_pool_submit(pool, &job, count_chunk, &cj, cj.n_chunks);
    while (!fsdp_pool_test(pool, &job))
        sched_yield();
    expect_each_chunk_once(&cj); /* finished means every chunk's effects are visible */
    fsdp_pool_wait(pool, &job);
    free(cj.hits);
    fsdp_pool_destroy(pool);
}
END_TEST

/* FSDP_CPU_THREADS is read once per process; these tests set it, so they
 * need Check's fork per test (the default; CK_FORK=no turns it off). */
static bool env_tests_possible(void)
{
    const char *f = getenv("CK_FORK");
    if (f && !strcmp(f, "no")) {
        printf("SKIP: FSDP_CPU_THREADS tests need a fresh process per test (CK_FORK=no)\n");
        return false;
    }
    return true;
}

START_TEST(test_pool_process_pool_env)
{
    if (!env_tests_possible())
        return;
    ck_assert_int_eq(setenv("FSDP_CPU_THREADS", "3", 1), 0);
    ck_assert_str_eq(fsdp_env_get(FSDP_ENV_CPU_THREADS), "3"); /* forked test: read fresh */
    ck_assert_int_eq(fsdp_pool_default_threads(1), 3);
    fsdp_pool *a, *b;
    ck_assert_int_eq(fsdp_pool_acquire(1, &a), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_pool_acquire(5, &b), FSDP_STATUS_OK);
    ck_assert_ptr_eq(a, b); /* one pool per process */
    ck_assert_int_eq(fsdp_pool_n_workers(a), 3);
    fsdp_pool_release(b);
    pool_run_counts(a, 100); /* still alive: one reference left */
    fsdp_pool_release(a);
    /* The last release joined it; the next acquire makes a new one. */
    ck_assert_int_eq(fsdp_pool_acquire(1, &b), FSDP_STATUS_OK);
    pool_run_counts(b, 10);
    fsdp_pool_release(b);
}
END_TEST

START_TEST(test_pool_default_threads)
{
    if (!env_tests_possible())
        return;
    /* FSDP_CPU_THREADS unset (forked test, env read fresh): cores - busy. */
    ck_assert_int_eq(unsetenv("FSDP_CPU_THREADS"), 0);
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int expect = nproc - 1 < 1 ? 1 : (int)(nproc - 1);
    ck_assert_int_eq(fsdp_pool_default_threads(1), expect);
    ck_assert_int_eq(fsdp_pool_default_threads(0), (int)nproc);
    ck_assert_int_eq(fsdp_pool_default_threads(1000), 1);
}
END_TEST

/* ---- AdamW on the pool ------------------------------------------------- */

START_TEST(test_pool_adamw_matches_single)
{
    const size_t n = 5 * FSDP_OPTIM_CHUNK_NUMEL + 123;
    fsdp_pool *pool;
    ck_assert_int_eq(fsdp_pool_create(3, &pool), FSDP_STATUS_OK);
    for (int mode = 0; mode < 3; mode++) {
        shard ref = shard_new(n, 40 + mode);
        shard got = shard_copy(&ref);
        const hparams *h = &HP_SETS[mode % 2];
        run_ref(&ref, h, mode);
        fsdp_optim_hparams hp = adamw_hp(h);
        fsdp_optim_consts c = adamw_consts(h);
        fsdp_optim_range r = adamw_range(&got, h, mode);
        ck_assert_int_eq(fsdp_optim_host_step_parallel(pool, &fsdp_optim_adamw, &hp, &c, &r, 1),
                         FSDP_STATUS_OK);
        expect_same_shard(&ref, &got, mode, "pool of 3");
        /* pool NULL: the calling thread alone, same bits. */
        shard solo = shard_new(n, 40 + mode);
        r = adamw_range(&solo, h, mode);
        ck_assert_int_eq(fsdp_optim_host_step_parallel(NULL, &fsdp_optim_adamw, &hp, &c, &r, 1),
                         FSDP_STATUS_OK);
        expect_same_shard(&ref, &solo, mode, "pool NULL");
        shard_free(&ref);
        shard_free(&got);
        shard_free(&solo);
    }
    fsdp_pool_destroy(pool);
}
END_TEST

/* Each ISA through a zero-worker pool (the waiter runs every chunk) and
 * through a two-worker pool, with several jobs in flight from one thread. */
START_TEST(test_pool_adamw_jobs_in_flight)
{
    const size_t sizes[] = {0, 1, FSDP_OPTIM_CHUNK_NUMEL, FSDP_OPTIM_CHUNK_NUMEL + 1,
                            3 * FSDP_OPTIM_CHUNK_NUMEL - 5};
    const size_t n_jobs = sizeof sizes / sizeof sizes[0];
    for (int workers = 0; workers <= 2; workers += 2) {
        fsdp_pool *pool;
        ck_assert_int_eq(fsdp_pool_create(workers, &pool), FSDP_STATUS_OK);
        for (int isa = 0; isa < FSDP_CPU_ISA_COUNT; isa++) {
            if (!fsdp_cpu_isa_supported((fsdp_cpu_isa)isa))
                continue;
            shard ref[5], got[5];
            fsdp_optim_job *jobs[5];
            const hparams *h = &HP_DEFAULT;
            fsdp_optim_hparams hp = adamw_hp(h);
            fsdp_optim_consts c = adamw_consts(h);
            for (size_t j = 0; j < n_jobs; j++) {
                ref[j] = shard_new(sizes[j], 500 + j);
                got[j] = shard_copy(&ref[j]);
                run_ref(&ref[j], h, 2);
                fsdp_optim_range r = adamw_range(&got[j], h, 2);
                ck_assert_int_eq(fsdp_optim_job_submit(pool, &fsdp_optim_adamw, &hp, &c, &r, 1,
                                                       (fsdp_cpu_isa)isa, &jobs[j]),
                                 FSDP_STATUS_OK);
            }
            for (size_t j = n_jobs; j-- > 0;) { /* wait in reverse order */
                uint64_t t0 = 1, t1 = 1;
                fsdp_optim_job_wait(jobs[j], &t0, &t1);
                ck_assert(sizes[j] == 0 ? t0 == 0 && t1 == 0 : t0 > 0 && t1 >= t0);
                expect_same_shard(&ref[j], &got[j], 2, fsdp_cpu_isa_name((fsdp_cpu_isa)isa));
                shard_free(&ref[j]);
                shard_free(&got[j]);
            }
        }
        fsdp_pool_destroy(pool);
    }
}
END_TEST

typedef struct submitter {
    int id;
    int ok; /* steps that matched the reference */
} submitter;

/* A "rank": several AdamW steps on its own shard through the shared process
 * pool, each checked against the reference run on the same state. */
static void *submitter_main(void *arg)
{
    submitter *sb = arg;
    fsdp_pool *pool;
    if (fsdp_pool_acquire(4, &pool) != FSDP_STATUS_OK)
        return NULL;
    const size_t n = 2 * FSDP_OPTIM_CHUNK_NUMEL + 1000 * (size_t)sb->id + 7;
    shard ref = shard_new(n, 900 + sb->id);
    shard got = shard_copy(&ref);
    for (int t = 1; t <= 3; t++) {
        hparams h = HP_SETS[(sb->id + t) % 2];
        run_ref(&ref, &h, t % 3);
        fsdp_optim_job *job;
        fsdp_optim_hparams hp = adamw_hp(&h);
        fsdp_optim_consts c = adamw_consts(&h);
        fsdp_optim_range r = adamw_range(&got, &h, t % 3);
        if (fsdp_optim_job_submit(pool, &fsdp_optim_adamw, &hp, &c, &r, 1, FSDP_CPU_ISA_COUNT,
                                  &job) != FSDP_STATUS_OK)
            break;
        fsdp_optim_job_wait(job, NULL, NULL);
        size_t out_bytes = (t % 3) ? n * ((t % 3) == 2 ? 2 : 4) : 0;
        if (memcmp(ref.p, got.p, n * 4) || memcmp(ref.m, got.m, n * 4) ||
            memcmp(ref.v, got.v, n * 4) || memcmp(ref.out, got.out, out_bytes))
            break;
        sb->ok++;
    }
    shard_free(&ref);
    shard_free(&got);
    fsdp_pool_release(pool);
    return NULL;
}

START_TEST(test_pool_concurrent_submitters)
{
    /* Pool size: 2 workers when the environment can be set, else whatever
     * the process pool already has; the test holds either way. */
    ck_assert_int_eq(setenv("FSDP_CPU_THREADS", "2", 1), 0);
    enum { N_RANKS = 4 };
    pthread_t th[N_RANKS];
    submitter sb[N_RANKS];
    fsdp_pool *keep; /* hold a reference so the pool outlives every rank */
    ck_assert_int_eq(fsdp_pool_acquire(N_RANKS, &keep), FSDP_STATUS_OK);
    for (int r = 0; r < N_RANKS; r++) {
        sb[r] = (submitter){.id = r};
        ck_assert_int_eq(pthread_create(&th[r], NULL, submitter_main, &sb[r]), 0);
    }
    for (int r = 0; r < N_RANKS; r++) {
        pthread_join(th[r], NULL);
        ck_assert_msg(sb[r].ok == 3, "rank %d: %d of 3 steps matched the reference", r, sb[r].ok);
    }
    fsdp_pool_release(keep);
}
END_TEST

START_TEST(test_job_invalid_args)
{
    fsdp_pool *pool;
    ck_assert_int_eq(fsdp_pool_create(1, &pool), FSDP_STATUS_OK);
    shard s = shard_new(10, 1);
    const hparams h = HP_DEFAULT;
    fsdp_optim_hparams hp = adamw_hp(&h);
    fsdp_optim_consts c = adamw_consts(&h);
    const fsdp_optim *o = &fsdp_optim_adamw;
    fsdp_optim_job *job = (fsdp_optim_job *)(uintptr_t)1; /* reset to NULL on failure */

    fsdp_error_clear();
    fsdp_optim_range r = adamw_range(&s, &h, 0);
    r.grad = NULL;
    ck_assert_int_eq(fsdp_optim_job_submit(pool, o, &hp, &c, &r, 1, FSDP_CPU_ISA_COUNT, &job),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_null(job);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "NULL"));
    r = adamw_range(&s, &h, 0);
    r.state[1] = NULL; /* AdamW's second array */
    ck_assert_int_eq(fsdp_optim_host_step_parallel(NULL, o, &hp, &c, &r, 1),
                     FSDP_STATUS_INVALID_ARG);

    r = adamw_range(&s, &h, 1);
    r.out_dt = FSDP_DTYPE_COUNT;
    ck_assert_int_eq(fsdp_optim_job_submit(pool, o, &hp, &c, &r, 1, FSDP_CPU_ISA_COUNT, &job),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "dtype"));

    r = adamw_range(&s, &h, 0);
    ck_assert_int_eq(fsdp_optim_job_submit(pool, o, &hp, &c, &r, 1,
                                           (fsdp_cpu_isa)(FSDP_CPU_ISA_COUNT + 1), &job),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "best supported"));

    ck_assert_int_eq(fsdp_optim_job_submit(NULL, o, &hp, &c, &r, 1, FSDP_CPU_ISA_COUNT, &job),
                     FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "fsdp_pool_acquire"));

    /* Nothing was changed by the failed calls. */
    shard fresh = shard_new(10, 1);
    expect_same_shard(&fresh, &s, 0, "after rejected calls");
    /* n == 0 with NULL arrays is a valid empty step, and so is no range */
    fsdp_optim_range empty = {.out_dt = FSDP_DTYPE_F32};
    ck_assert_int_eq(fsdp_optim_host_step_parallel(pool, o, &hp, &c, &empty, 1), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_optim_host_step_parallel(pool, o, &hp, &c, NULL, 0), FSDP_STATUS_OK);
    shard_free(&fresh);
    shard_free(&s);
    fsdp_pool_destroy(pool);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"kernels", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_isa_matches_reference, OPT_COUNT * FSDP_CPU_ISA_COUNT),
                    FSDP_TEST_LOOP(test_isa_multi_step_misaligned, OPT_COUNT * FSDP_CPU_ISA_COUNT),
                    test_bf16_out_rounding, test_best_isa_and_names, test_registry_and_interface,
                    test_device_step_equals_host_step)},
        {"pool", 60,
         FSDP_TESTS(test_pool_generic_jobs, test_pool_async_progress, test_pool_process_pool_env,
                    test_pool_default_threads, test_pool_adamw_matches_single,
                    test_pool_adamw_jobs_in_flight, test_pool_concurrent_submitters,
                    test_job_ranges, test_job_invalid_args)},
    };
    return fsdp_test_main("optim", tcases, FSDP_TEST_LEN(tcases));
}
