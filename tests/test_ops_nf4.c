/*
 * test_ops_nf4.c - the nf4_dequant op on the cpu (contract in ops/ops.h,
 * format in ops/nf4.h) against:
 *   - bitsandbytes' dequantize_4bit (tests/fixtures/nf4/golden.safetensors,
 *     tools/gen_nf4_golden.py: 64, 3 x 128 and 1600 elements, with a block
 *     of zeros, code midpoints, +-3e38 and subnormals): fp32 bit for bit,
 *     through the op and through every instruction set's kernel; bf16 is
 *     the fp32 golden rounded to nearest even, which is bitsandbytes' own
 *     bf16 output except where its CPU kernel flushes a subnormal to zero
 *     (checked: those are the only differences);
 *   - the fixture's facts: the 16 code values, the even element in the
 *     high nibble;
 *   - a naive formula, code value[nibble] * absmax rounded once, on random
 *     bytes and absmax values (zeros, negatives, large) over a few thousand
 *     elements, every kernel, writing exactly n elements;
 *   - the same bits on 1 and 3 threads per device (a length the team
 *     splits) and through the asynchronous stream table.
 */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/safetensors.h"
#include "core/bf16.h"
#include "device/cpu.h"
#include "fixture_util.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/nf4.h"
#include "ops/optim_kernels.h"
#include "ops_util.h"
#include "testutil.h"

#define REGEN "tools/gen_nf4_golden.py"

/* ---- the golden file ----------------------------------------------------------- */

typedef struct gold {
    unsigned char *blob;
    fsdp_st_file st;
} gold;

static void gold_load(gold *g)
{
    char path[600];
    size_t size = 0;
    g->blob = fixture_read("nf4/golden.safetensors", REGEN, &size, path, sizeof path);
    ck_assert_msg(fsdp_st_parse_buffer(path, g->blob, size, &g->st) == FSDP_STATUS_OK, "%s",
                  fsdp_error_msg());
}

static void gold_free(gold *g)
{
    fsdp_st_free(&g->st);
    free(g->blob);
}

/* A malloc'd copy of tensor `name` of dtype `dtype`; its numel in *numel. */
static void *gold_get(const gold *g, const char *name, const char *dtype, size_t *numel)
{
    for (int i = 0; i < g->st.n_tensors; i++) {
        const fsdp_st_tensor *t = &g->st.tensors[i];
        if (strcmp(t->name, name))
            continue;
        ck_assert_msg(!strcmp(t->dtype_name, dtype), "%s is %s, not %s; regenerate it (%s)",
                      name, t->dtype_name, dtype, REGEN);
        size_t bytes = t->end - t->begin;
        void *p = malloc(bytes + 1);
        ck_assert_ptr_nonnull(p);
        memcpy(p, g->blob + g->st.data_offset + t->begin, bytes);
        *numel = t->numel;
        return p;
    }
    ck_abort_msg("the fixture has no tensor '%s'; regenerate it (%s)", name, REGEN);
    return NULL;
}

/* One fixture case: n elements' codes and absmax, bitsandbytes' outputs. */
typedef struct gcase {
    size_t n;
    uint8_t *codes;    /* (n / 2,) */
    float *absmax;     /* (n / 64,) */
    float *fp32;       /* (n,) */
    fsdp_bf16 *bf16;   /* (n,) */
} gcase;

static const char *const CASES[] = {"len64", "len384", "len1600"};
static const size_t CASE_N[] = {64, 384, 1600};
#define N_CASES 3

static gcase gcase_load(const gold *g, int k)
{
    char name[64];
    size_t numel;
    gcase c = {.n = CASE_N[k]};
    snprintf(name, sizeof name, "%s/codes", CASES[k]);
    c.codes = gold_get(g, name, "U8", &numel);
    ck_assert_uint_eq(numel, c.n / 2);
    snprintf(name, sizeof name, "%s/absmax", CASES[k]);
    c.absmax = gold_get(g, name, "F32", &numel);
    ck_assert_uint_eq(numel, c.n / FSDP_NF4_BLOCK);
    snprintf(name, sizeof name, "%s/fp32", CASES[k]);
    c.fp32 = gold_get(g, name, "F32", &numel);
    ck_assert_uint_eq(numel, c.n);
    snprintf(name, sizeof name, "%s/bf16", CASES[k]);
    c.bf16 = gold_get(g, name, "BF16", &numel);
    ck_assert_uint_eq(numel, c.n);
    return c;
}

static void gcase_free(gcase *c)
{
    free(c->codes), free(c->absmax), free(c->fp32), free(c->bf16);
}

/* ---- running the op ------------------------------------------------------------ */

/* The op on e's context into a fresh buffer of n elements of e's dtype,
 * with a guard of 64 elements after it that must stay untouched. */
static void *run_op(env *e, const uint8_t *codes, const float *absmax, size_t n)
{
    size_t es = fsdp_dtype_size(e->ctx.dt);
    unsigned char *out = malloc((n + 64) * es);
    ck_assert_ptr_nonnull(out);
    memset(out, 0xa5, (n + 64) * es);
    e->ctx.iface->nf4_dequant(&e->ctx, out, codes, absmax, n);
    ck_assert_int_eq(e->ctx.iface->sync_error(&e->ctx), FSDP_STATUS_OK);
    for (size_t i = n * es; i < (n + 64) * es; i++)
        ck_assert_msg(out[i] == 0xa5, "nf4_dequant wrote past its %zu elements", n);
    return out;
}

/* The kernel of one instruction set, the same way. */
static void *run_isa(fsdp_cpu_isa isa, fsdp_dtype dt, const uint8_t *codes, const float *absmax,
                     size_t n)
{
    size_t es = fsdp_dtype_size(dt);
    unsigned char *out = malloc((n + 64) * es);
    ck_assert_ptr_nonnull(out);
    memset(out, 0xa5, (n + 64) * es);
    fsdp_cpu_nf4_dequant_isa(isa, out, dt, codes, absmax, n);
    for (size_t i = n * es; i < (n + 64) * es; i++)
        ck_assert_msg(out[i] == 0xa5, "the %s kernel wrote past its %zu elements",
                      fsdp_cpu_isa_name(isa), n);
    return out;
}

/* got (dt, n) equals want (fp32 values, rounded to bf16 when dt is bf16)
 * bit for bit; `how` names the run. */
static void expect_bits(const void *got, fsdp_dtype dt, const float *want, size_t n,
                        const char *how)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == FSDP_DTYPE_BF16) {
            fsdp_bf16 w = fsdp_f32_to_bf16(want[i]), h = ((const fsdp_bf16 *)got)[i];
            ck_assert_msg(h == w, "%s: bf16 element %zu is 0x%04x, want 0x%04x (%g)", how, i, h,
                          w, (double)want[i]);
        } else {
            uint32_t a, b;
            memcpy(&a, (const float *)got + i, 4);
            memcpy(&b, want + i, 4);
            ck_assert_msg(a == b, "%s: element %zu is %a, want %a", how, i,
                          (double)((const float *)got)[i], (double)want[i]);
        }
    }
}

/* The op (one thread) and every kernel the CPU runs give want (fp32
 * values; rounded once when dt is bf16) on codes and absmax (n); `label`
 * names the data in messages. */
static void expect_everywhere(fsdp_dtype dt, const uint8_t *codes, const float *absmax, size_t n,
                              const float *want, const char *label)
{
    char how[128];
    env e;
    env_init_threads(&e, dt, 1);
    void *out = run_op(&e, codes, absmax, n);
    snprintf(how, sizeof how, "%s, %s, through the op", label, fsdp_dtype_name(dt));
    expect_bits(out, dt, want, n, how);
    free(out);
    env_fini(&e);
    for (int isa = 0; isa < FSDP_CPU_ISA_COUNT; isa++) {
        if (!fsdp_cpu_isa_supported((fsdp_cpu_isa)isa))
            continue;
        out = run_isa((fsdp_cpu_isa)isa, dt, codes, absmax, n);
        snprintf(how, sizeof how, "%s, %s, %s kernel", label, fsdp_dtype_name(dt),
                 fsdp_cpu_isa_name((fsdp_cpu_isa)isa));
        expect_bits(out, dt, want, n, how);
        free(out);
    }
}

/* ---- against bitsandbytes ------------------------------------------------------ */

START_TEST(test_fixture_facts)
{
    gold g;
    gold_load(&g);
    size_t numel;
    float *map = gold_get(&g, "quant_map", "F32", &numel);
    ck_assert_uint_eq(numel, 16);
    ck_assert_msg(memcmp(map, fsdp_nf4_code, sizeof(float) * 16) == 0,
                  "the kernels' NF4 code values are not bitsandbytes' quant_map");
    uint8_t *even_high = gold_get(&g, "even_nibble_high", "U8", &numel);
    ck_assert_uint_eq(numel, 1);
    ck_assert_msg(even_high[0] == 1, "bitsandbytes keeps the even element in the low nibble; "
                                     "ops/nf4.h says high");
    free(map), free(even_high);
    gold_free(&g);
}
END_TEST

/* bitsandbytes' fp32 output everywhere; bf16 is that output rounded once. */
static void check_golden(fsdp_dtype dt, int k)
{
    gold g;
    gold_load(&g);
    gcase c = gcase_load(&g, k);
    expect_everywhere(dt, c.codes, c.absmax, c.n, c.fp32, CASES[k]);
    gcase_free(&c);
    gold_free(&g);
}

START_TEST(test_golden_fp32) { check_golden(FSDP_DTYPE_F32, _i); }
END_TEST

START_TEST(test_golden_bf16) { check_golden(FSDP_DTYPE_BF16, _i); }
END_TEST

/* bitsandbytes' own bf16 output is the fp32 one rounded to nearest even,
 * but for subnormal values, which its CPU kernel flushes to a signed zero;
 * fsdp keeps them (as torch's .to(bfloat16) does). The special case has
 * such a block, so the exception is exercised, not assumed. */
START_TEST(test_bnb_bf16_differs_only_by_flushing)
{
    gold g;
    gold_load(&g);
    size_t flushed = 0;
    for (int k = 0; k < N_CASES; k++) {
        gcase c = gcase_load(&g, k);
        for (size_t i = 0; i < c.n; i++) {
            fsdp_bf16 ours = fsdp_f32_to_bf16(c.fp32[i]), bnb = c.bf16[i];
            if (ours == bnb)
                continue;
            ck_assert_msg(fpclassify(fsdp_bf16_to_f32(ours)) == FP_SUBNORMAL &&
                              (bnb & 0x7fff) == 0 && (bnb & 0x8000) == (ours & 0x8000),
                          "%s element %zu: bitsandbytes' bf16 0x%04x, the rounded fp32 0x%04x",
                          CASES[k], i, bnb, ours);
            flushed++;
        }
        gcase_free(&c);
    }
    ck_assert_msg(flushed > 0, "no subnormal in the fixture: regenerate it (%s)", REGEN);
    gold_free(&g);
}
END_TEST

/* ---- against the naive formula ------------------------------------------------- */

/* n elements of random codes (every byte value likely) and absmax values
 * (a zero block, a negative one, one near the fp32 maximum). */
typedef struct rcase {
    size_t n;
    uint8_t *codes;
    float *absmax;
    float *want; /* code value * absmax, fp32 */
} rcase;

static rcase rcase_init(size_t n, uint64_t seed)
{
    rcase r = {.n = n};
    size_t nb = n / FSDP_NF4_BLOCK;
    float *u = frand_stream(n / 2, seed, 27, 1.0f);
    r.codes = malloc(n / 2);
    for (size_t i = 0; i < n / 2; i++)
        r.codes[i] = (uint8_t)((u[i] + 1.0f) * 128.0f);
    free(u);
    r.absmax = frand_stream(nb, seed + 1, 27, 4.0f);
    r.absmax[0] = 0.0f;
    if (nb > 2)
        r.absmax[1] = 3.3e38f, r.absmax[2] = 1e-39f;
    r.want = fbuf(n);
    const float *code = fsdp_nf4_code;
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = r.codes[i / 2];
        r.want[i] = code[i % 2 ? byte & 15 : byte >> 4] * r.absmax[i / FSDP_NF4_BLOCK];
    }
    return r;
}

static void rcase_free(rcase *r)
{
    free(r->codes), free(r->absmax), free(r->want);
}

static const size_t NAIVE_N[] = {64, 128 * 3, 64 * 97};

START_TEST(test_naive_formula)
{
    rcase r = rcase_init(NAIVE_N[_i], 700 + _i);
    char label[32];
    snprintf(label, sizeof label, "n %zu", r.n);
    expect_everywhere(FSDP_DTYPE_F32, r.codes, r.absmax, r.n, r.want, label);
    expect_everywhere(FSDP_DTYPE_BF16, r.codes, r.absmax, r.n, r.want, label);
    rcase_free(&r);
}
END_TEST

/* ---- threads and streams -------------------------------------------------------- */

/* More blocks than one chunk of the team holds (FSDP_CPU_GRAIN / 64). */
#define SPLIT_N ((size_t)FSDP_NF4_BLOCK * 1500)

START_TEST(test_threads_bit_identical)
{
    fsdp_dtype dt = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    rcase r = rcase_init(SPLIT_N, 800 + _i);
    void *res[2];
    for (int t = 0; t < 2; t++) {
        env e;
        env_init_threads(&e, dt, t ? 3 : 1);
        res[t] = run_op(&e, r.codes, r.absmax, r.n);
        env_fini(&e);
    }
    ck_assert_msg(memcmp(res[0], res[1], r.n * fsdp_dtype_size(dt)) == 0,
                  "1 and 3 threads differ");
    expect_bits(res[1], dt, r.want, r.n, "3 threads");
    free(res[0]), free(res[1]);
    rcase_free(&r);
}
END_TEST

START_TEST(test_async_stream_same_bits)
{
    fsdp_dtype dt = _i ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    rcase r = rcase_init(SPLIT_N, 900 + _i);
    env e;
    env_init(&e, dt);
    void *inline_res = run_op(&e, r.codes, r.absmax, r.n);
    env_fini(&e);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_ASYNC, 3);
    ck_assert_int_eq(fsdp_device_init(&e.dev, FSDP_BACKEND_CPU, NULL, 0, 0, 0), FSDP_STATUS_OK);
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_INLINE, 0);
    ck_assert_int_eq(fsdp_ops_init(&e.ctx, &e.dev, dt), FSDP_STATUS_OK);
    ck_assert_ptr_eq(e.ctx.iface, &fsdp_ops_cpu_async_i);
    size_t bytes = r.n * fsdp_dtype_size(dt);
    void *async_res = malloc(bytes);
    ck_assert_ptr_nonnull(async_res);
    memset(async_res, 0xa5, bytes);
    e.ctx.iface->nf4_dequant(&e.ctx, async_res, r.codes, r.absmax, r.n);
    ck_assert_int_eq(e.ctx.iface->sync_error(&e.ctx), FSDP_STATUS_OK);
    ck_assert_int_eq(fsdp_device_stream_sync(&e.dev, e.ctx.stream), FSDP_STATUS_OK);
    fsdp_ops_fini(&e.ctx);
    fsdp_device_fini(&e.dev);
    ck_assert_msg(memcmp(inline_res, async_res, bytes) == 0, "inline and async streams differ");
    free(inline_res), free(async_res);
    rcase_free(&r);
}
END_TEST

int main(void)
{
    /* The other cases run inline whatever FSDP_CPU_STREAMS says (env_init
     * wants the inline table); the async one opens its own device. */
    fsdp_device_cpu_set_streams(FSDP_CPU_STREAMS_INLINE, 0);
    const fsdp_test_tcase tcases[] = {
        {"bitsandbytes", 30,
         FSDP_TESTS(test_fixture_facts, FSDP_TEST_LOOP(test_golden_fp32, N_CASES),
                    FSDP_TEST_LOOP(test_golden_bf16, N_CASES),
                    test_bnb_bf16_differs_only_by_flushing)},
        {"naive", 30, FSDP_TESTS(FSDP_TEST_LOOP(test_naive_formula, 3))},
        {"determinism", 30,
         FSDP_TESTS(FSDP_TEST_LOOP(test_threads_bit_identical, 2),
                    FSDP_TEST_LOOP(test_async_stream_same_bits, 2))},
    };
    return fsdp_test_main("ops_nf4", tcases, FSDP_TEST_LEN(tcases));
}
