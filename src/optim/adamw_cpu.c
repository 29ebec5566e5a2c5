/*
 * adamw_cpu.c - vectorised, pool-parallel AdamW on host shards (contract in
 * adamw_cpu.h; the operation order it must reproduce is in adamw.h).
 *
 * The build targets x86-64-v2, so the AVX2 and AVX-512F kernels are compiled
 * with per-function target attributes and chosen at run time with
 * __builtin_cpu_supports. Each kernel is a line-for-line transcription of
 * fsdp_adamw_ref: the same seventeen roundings in the same order; then the
 * n % width tail goes through fsdp_adamw_ref. (Bit identity covers every
 * value, infinities and the NaNs that arithmetic creates included; which of
 * two different input NaN payloads survives an operation is the one thing
 * the compiler may decide differently, since it may swap the operands of a
 * commutative operation in either version.) AdamW on a large shard is
 * memory-bound (28 bytes per element), so the kernels stay simple: unaligned
 * loads and stores, no unrolling beyond what the core does itself.
 */
#include <stdint.h>
#include <stdlib.h>

#include "core/bf16.h"
#include "core/error.h"
#include "optim/adamw.h"
#include "optim/adamw_cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ADAMW_CPU_X86 1
#else
#define ADAMW_CPU_X86 0
#endif

/* Hyperparameters of one step, as the kernels take them. */
typedef struct adamw_hp {
    float lr, b1, b2, eps, wd, bc1, bc2, grad_scale;
} adamw_hp;

typedef void (*adamw_kernel_fn)(float *p, const float *grad, float *m, float *v, size_t n,
                                const adamw_hp *hp, void *p_out, fsdp_dtype out_dt);

static void adamw_scalar(float *p, const float *grad, float *m, float *v, size_t n,
                         const adamw_hp *hp, void *p_out, fsdp_dtype out_dt)
{
    fsdp_adamw_ref(p, grad, m, v, n, hp->lr, hp->b1, hp->b2, hp->eps, hp->wd, hp->bc1, hp->bc2,
                   hp->grad_scale, p_out, out_dt);
}

/* The reference on elements [i, n), for the kernels' tails. */
static void adamw_tail(size_t i, float *p, const float *grad, float *m, float *v, size_t n,
                       const adamw_hp *hp, void *p_out, fsdp_dtype out_dt)
{
    if (i == n)
        return;
    void *out = NULL;
    if (p_out)
        out = (char *)p_out + i * fsdp_dtype_size(out_dt);
    adamw_scalar(p + i, grad + i, m + i, v + i, n - i, hp, out, out_dt);
}

#if ADAMW_CPU_X86

/* ---- SSE4.1: 4 lanes -------------------------------------------------- */

/* fp32 -> bf16 round-to-nearest-even as fsdp_f32_to_bf16, 4 lanes, stored
 * to out[0..3]. */
__attribute__((target("sse4.1"))) static inline void bf16_store_sse41(fsdp_bf16 *out, __m128 x)
{
    const __m128i u = _mm_castps_si128(x);
    const __m128i abs = _mm_and_si128(u, _mm_set1_epi32(0x7fffffff));
    const __m128i is_nan = _mm_cmpgt_epi32(abs, _mm_set1_epi32(0x7f800000));
    const __m128i hi = _mm_srli_epi32(u, 16);
    const __m128i lsb = _mm_and_si128(hi, _mm_set1_epi32(1));
    const __m128i rounded =
        _mm_srli_epi32(_mm_add_epi32(_mm_add_epi32(u, _mm_set1_epi32(0x7fff)), lsb), 16);
    const __m128i quiet = _mm_or_si128(hi, _mm_set1_epi32(0x40));
    const __m128i r = _mm_blendv_epi8(rounded, quiet, is_nan);
    _mm_storel_epi64((__m128i *)out, _mm_packus_epi32(r, r)); /* values <= 0xffff: exact */
}

__attribute__((target("sse4.1"))) static void adamw_sse41(float *p, const float *grad, float *m,
                                                          float *v, size_t n, const adamw_hp *hp,
                                                          void *p_out, fsdp_dtype out_dt)
{
    const __m128 lr = _mm_set1_ps(hp->lr), b1 = _mm_set1_ps(hp->b1), b2 = _mm_set1_ps(hp->b2);
    const __m128 omb1 = _mm_set1_ps(1.0f - hp->b1), omb2 = _mm_set1_ps(1.0f - hp->b2);
    const __m128 eps = _mm_set1_ps(hp->eps), wd = _mm_set1_ps(hp->wd);
    const __m128 bc1 = _mm_set1_ps(hp->bc1), bc2 = _mm_set1_ps(hp->bc2);
    const __m128 gs = _mm_set1_ps(hp->grad_scale);
    float *out32 = out_dt == FSDP_DTYPE_F32 ? p_out : NULL;
    fsdp_bf16 *out16 = out_dt == FSDP_DTYPE_BF16 ? p_out : NULL;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128 p0 = _mm_loadu_ps(p + i);
        const __m128 g = _mm_mul_ps(_mm_loadu_ps(grad + i), gs);
        const __m128 bm = _mm_mul_ps(b1, _mm_loadu_ps(m + i));
        const __m128 gm = _mm_mul_ps(omb1, g);
        const __m128 mi = _mm_add_ps(bm, gm);
        const __m128 g2 = _mm_mul_ps(g, g);
        const __m128 bv = _mm_mul_ps(b2, _mm_loadu_ps(v + i));
        const __m128 gv = _mm_mul_ps(omb2, g2);
        const __m128 vi = _mm_add_ps(bv, gv);
        const __m128 mhat = _mm_div_ps(mi, bc1);
        const __m128 vhat = _mm_div_ps(vi, bc2);
        const __m128 den = _mm_add_ps(_mm_sqrt_ps(vhat), eps);
        const __m128 q = _mm_div_ps(mhat, den);
        const __m128 dec = _mm_mul_ps(wd, p0);
        const __m128 upd = _mm_add_ps(q, dec);
        const __m128 step = _mm_mul_ps(lr, upd);
        const __m128 pi = _mm_sub_ps(p0, step);
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        _mm_storeu_ps(p + i, pi);
        if (out32)
            _mm_storeu_ps(out32 + i, pi);
        else if (out16)
            bf16_store_sse41(out16 + i, pi);
    }
    adamw_tail(i, p, grad, m, v, n, hp, p_out, out_dt);
}

/* ---- AVX2: 8 lanes ---------------------------------------------------- */

__attribute__((target("avx2"))) static inline void bf16_store_avx2(fsdp_bf16 *out, __m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
    /* packus works per 128-bit lane: qwords (r0..3, r0..3, r4..7, r4..7);
     * keep qwords 0 and 2. */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(packed));
}

__attribute__((target("avx2"))) static void adamw_avx2(float *p, const float *grad, float *m,
                                                       float *v, size_t n, const adamw_hp *hp,
                                                       void *p_out, fsdp_dtype out_dt)
{
    const __m256 lr = _mm256_set1_ps(hp->lr), b1 = _mm256_set1_ps(hp->b1);
    const __m256 b2 = _mm256_set1_ps(hp->b2);
    const __m256 omb1 = _mm256_set1_ps(1.0f - hp->b1), omb2 = _mm256_set1_ps(1.0f - hp->b2);
    const __m256 eps = _mm256_set1_ps(hp->eps), wd = _mm256_set1_ps(hp->wd);
    const __m256 bc1 = _mm256_set1_ps(hp->bc1), bc2 = _mm256_set1_ps(hp->bc2);
    const __m256 gs = _mm256_set1_ps(hp->grad_scale);
    float *out32 = out_dt == FSDP_DTYPE_F32 ? p_out : NULL;
    fsdp_bf16 *out16 = out_dt == FSDP_DTYPE_BF16 ? p_out : NULL;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 p0 = _mm256_loadu_ps(p + i);
        const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
        const __m256 bm = _mm256_mul_ps(b1, _mm256_loadu_ps(m + i));
        const __m256 gm = _mm256_mul_ps(omb1, g);
        const __m256 mi = _mm256_add_ps(bm, gm);
        const __m256 g2 = _mm256_mul_ps(g, g);
        const __m256 bv = _mm256_mul_ps(b2, _mm256_loadu_ps(v + i));
        const __m256 gv = _mm256_mul_ps(omb2, g2);
        const __m256 vi = _mm256_add_ps(bv, gv);
        const __m256 mhat = _mm256_div_ps(mi, bc1);
        const __m256 vhat = _mm256_div_ps(vi, bc2);
        const __m256 den = _mm256_add_ps(_mm256_sqrt_ps(vhat), eps);
        const __m256 q = _mm256_div_ps(mhat, den);
        const __m256 dec = _mm256_mul_ps(wd, p0);
        const __m256 upd = _mm256_add_ps(q, dec);
        const __m256 step = _mm256_mul_ps(lr, upd);
        const __m256 pi = _mm256_sub_ps(p0, step);
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
        if (out32)
            _mm256_storeu_ps(out32 + i, pi);
        else if (out16)
            bf16_store_avx2(out16 + i, pi);
    }
    adamw_tail(i, p, grad, m, v, n, hp, p_out, out_dt);
}

/* ---- AVX-512F: 16 lanes ----------------------------------------------- */

__attribute__((target("avx512f"))) static inline void bf16_store_avx512(fsdp_bf16 *out, __m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(hi, _mm512_set1_epi32(0x40));
    const __m512i r = _mm512_mask_blend_epi32(is_nan, rounded, quiet);
    _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(r)); /* truncates: exact here */
}

__attribute__((target("avx512f"))) static void adamw_avx512f(float *p, const float *grad,
                                                             float *m, float *v, size_t n,
                                                             const adamw_hp *hp, void *p_out,
                                                             fsdp_dtype out_dt)
{
    const __m512 lr = _mm512_set1_ps(hp->lr), b1 = _mm512_set1_ps(hp->b1);
    const __m512 b2 = _mm512_set1_ps(hp->b2);
    const __m512 omb1 = _mm512_set1_ps(1.0f - hp->b1), omb2 = _mm512_set1_ps(1.0f - hp->b2);
    const __m512 eps = _mm512_set1_ps(hp->eps), wd = _mm512_set1_ps(hp->wd);
    const __m512 bc1 = _mm512_set1_ps(hp->bc1), bc2 = _mm512_set1_ps(hp->bc2);
    const __m512 gs = _mm512_set1_ps(hp->grad_scale);
    float *out32 = out_dt == FSDP_DTYPE_F32 ? p_out : NULL;
    fsdp_bf16 *out16 = out_dt == FSDP_DTYPE_BF16 ? p_out : NULL;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 p0 = _mm512_loadu_ps(p + i);
        const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
        const __m512 bm = _mm512_mul_ps(b1, _mm512_loadu_ps(m + i));
        const __m512 gm = _mm512_mul_ps(omb1, g);
        const __m512 mi = _mm512_add_ps(bm, gm);
        const __m512 g2 = _mm512_mul_ps(g, g);
        const __m512 bv = _mm512_mul_ps(b2, _mm512_loadu_ps(v + i));
        const __m512 gv = _mm512_mul_ps(omb2, g2);
        const __m512 vi = _mm512_add_ps(bv, gv);
        const __m512 mhat = _mm512_div_ps(mi, bc1);
        const __m512 vhat = _mm512_div_ps(vi, bc2);
        const __m512 den = _mm512_add_ps(_mm512_sqrt_ps(vhat), eps);
        const __m512 q = _mm512_div_ps(mhat, den);
        const __m512 dec = _mm512_mul_ps(wd, p0);
        const __m512 upd = _mm512_add_ps(q, dec);
        const __m512 step = _mm512_mul_ps(lr, upd);
        const __m512 pi = _mm512_sub_ps(p0, step);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        _mm512_storeu_ps(p + i, pi);
        if (out32)
            _mm512_storeu_ps(out32 + i, pi);
        else if (out16)
            bf16_store_avx512(out16 + i, pi);
    }
    adamw_tail(i, p, grad, m, v, n, hp, p_out, out_dt);
}

#endif /* ADAMW_CPU_X86 */

/* ---- dispatch --------------------------------------------------------- */

static const adamw_kernel_fn adamw_kernels[FSDP_CPU_ISA_COUNT] = {
    /* [SCALAR]  = */ adamw_scalar,
#if ADAMW_CPU_X86
    /* [SSE41]   = */ adamw_sse41,
    /* [AVX2]    = */ adamw_avx2,
    /* [AVX512F] = */ adamw_avx512f,
#else
    /* [SSE41]   = */ NULL,
    /* [AVX2]    = */ NULL,
    /* [AVX512F] = */ NULL,
#endif
};

const char *fsdp_cpu_isa_name(fsdp_cpu_isa isa)
{
    static const char *const names[FSDP_CPU_ISA_COUNT] = {"scalar", "sse4.1", "avx2", "avx512f"};
    return (unsigned)isa < FSDP_CPU_ISA_COUNT ? names[isa] : "?";
}

bool fsdp_cpu_isa_supported(fsdp_cpu_isa isa)
{
    if ((unsigned)isa >= FSDP_CPU_ISA_COUNT || !adamw_kernels[isa])
        return false;
#if ADAMW_CPU_X86
    switch (isa) {
    case FSDP_CPU_ISA_SSE41:
        return __builtin_cpu_supports("sse4.1");
    case FSDP_CPU_ISA_AVX2:
        return __builtin_cpu_supports("avx2");
    case FSDP_CPU_ISA_AVX512F:
        return __builtin_cpu_supports("avx512f");
    default:
        break;
    }
#endif
    return true;
}

fsdp_cpu_isa fsdp_cpu_isa_best(void)
{
    for (int isa = FSDP_CPU_ISA_COUNT - 1; isa > FSDP_CPU_ISA_SCALAR; isa--)
        if (fsdp_cpu_isa_supported((fsdp_cpu_isa)isa))
            return (fsdp_cpu_isa)isa;
    return FSDP_CPU_ISA_SCALAR;
}

void fsdp_adamw_cpu_isa(fsdp_cpu_isa isa, float *p, const float *grad, float *m, float *v,
                        size_t n, float lr, float b1, float b2, float eps, float wd, float bc1,
                        float bc2, float grad_scale, void *p_out, fsdp_dtype out_dt)
{
    FSDP_ASSERT(fsdp_cpu_isa_supported(isa));
    const adamw_hp hp = {lr, b1, b2, eps, wd, bc1, bc2, grad_scale};
    adamw_kernels[isa](p, grad, m, v, n, &hp, p_out, out_dt);
}

void fsdp_adamw_cpu(float *p, const float *grad, float *m, float *v, size_t n, float lr, float b1,
                    float b2, float eps, float wd, float bc1, float bc2, float grad_scale,
                    void *p_out, fsdp_dtype out_dt)
{
    fsdp_adamw_cpu_isa(fsdp_cpu_isa_best(), p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2,
                       grad_scale, p_out, out_dt);
}

/* ---- pool jobs -------------------------------------------------------- */

struct fsdp_adamw_job {
    fsdp_pool_job pool_job; /* pool bookkeeping; first so the handle is one block */
    fsdp_pool *pool;
    adamw_kernel_fn kernel;
    adamw_hp hp;
    float *p;               /* (n,) */
    const float *grad;      /* (n,) */
    float *m, *v;           /* (n,) */
    size_t n;
    void *p_out;            /* (n,) of out_dt, or NULL */
    fsdp_dtype out_dt;
};

static void adamw_job_chunk(void *arg, size_t chunk)
{
    const fsdp_adamw_job *job = arg;
    const size_t begin = chunk * FSDP_ADAMW_CPU_CHUNK_NUMEL;
    const size_t end = job->n - begin < FSDP_ADAMW_CPU_CHUNK_NUMEL
                           ? job->n
                           : begin + FSDP_ADAMW_CPU_CHUNK_NUMEL;
    void *out = NULL;
    if (job->p_out)
        out = (char *)job->p_out + begin * fsdp_dtype_size(job->out_dt);
    job->kernel(job->p + begin, job->grad + begin, job->m + begin, job->v + begin, end - begin,
                &job->hp, out, job->out_dt);
}

static fsdp_status adamw_check_args(fsdp_cpu_isa isa, const float *p, const float *grad,
                                    const float *m, const float *v, size_t n, float bc1, float bc2,
                                    const void *p_out, fsdp_dtype out_dt)
{
    if (n > 0 && (!p || !grad || !m || !v))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: NULL array among p/grad/m/v for a shard of %zu elements",
                              n);
    if (p_out && out_dt != FSDP_DTYPE_F32 && out_dt != FSDP_DTYPE_BF16)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: p_out dtype %d is not fp32 or bf16", (int)out_dt);
    if (!fsdp_cpu_isa_supported(isa))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: kernel '%s' cannot run on this CPU or build; use the "
                              "best supported ('%s')",
                              fsdp_cpu_isa_name(isa), fsdp_cpu_isa_name(fsdp_cpu_isa_best()));
    if (!(bc1 > 0.0f && bc1 <= 1.0f) || !(bc2 > 0.0f && bc2 <= 1.0f))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: bias corrections bc1=%g bc2=%g are not in (0, 1]; they "
                              "are 1 - beta^t for step t >= 1",
                              (double)bc1, (double)bc2);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_adamw_job_submit(fsdp_pool *pool, fsdp_cpu_isa isa, float *p, const float *grad,
                                  float *m, float *v, size_t n, float lr, float b1, float b2,
                                  float eps, float wd, float bc1, float bc2, float grad_scale,
                                  void *p_out, fsdp_dtype out_dt, fsdp_adamw_job **out)
{
    *out = NULL;
    if (!pool)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu adamw: no pool given; get one with fsdp_pool_acquire()");
    if (isa == FSDP_CPU_ISA_COUNT)
        isa = fsdp_cpu_isa_best();
    FSDP_TRY(adamw_check_args(isa, p, grad, m, v, n, bc1, bc2, p_out, out_dt));
    fsdp_adamw_job *job = calloc(1, sizeof *job);
    if (!job)
        return fsdp_error_set(FSDP_STATUS_OOM, "cpu adamw: out of host memory for a job handle");
    job->pool = pool;
    job->kernel = adamw_kernels[isa];
    job->hp = (adamw_hp){lr, b1, b2, eps, wd, bc1, bc2, grad_scale};
    job->p = p;
    job->grad = grad;
    job->m = m;
    job->v = v;
    job->n = n;
    job->p_out = p_out;
    job->out_dt = out_dt;
    const size_t n_chunks = (n + FSDP_ADAMW_CPU_CHUNK_NUMEL - 1) / FSDP_ADAMW_CPU_CHUNK_NUMEL;
    fsdp_pool_submit(pool, &job->pool_job, adamw_job_chunk, job, n_chunks);
    *out = job;
    return FSDP_STATUS_OK;
}

void fsdp_adamw_job_wait(fsdp_adamw_job *job)
{
    if (!job)
        return;
    fsdp_pool_wait(job->pool, &job->pool_job);
    free(job);
}

bool fsdp_adamw_job_done(fsdp_adamw_job *job)
{
    return fsdp_pool_test(job->pool, &job->pool_job);
}

fsdp_status fsdp_adamw_cpu_parallel(fsdp_pool *pool, float *p, const float *grad, float *m,
                                    float *v, size_t n, float lr, float b1, float b2, float eps,
                                    float wd, float bc1, float bc2, float grad_scale, void *p_out,
                                    fsdp_dtype out_dt)
{
    if (!pool) {
        FSDP_TRY(adamw_check_args(fsdp_cpu_isa_best(), p, grad, m, v, n, bc1, bc2, p_out,
                                  out_dt));
        fsdp_adamw_cpu(p, grad, m, v, n, lr, b1, b2, eps, wd, bc1, bc2, grad_scale, p_out,
                       out_dt);
        return FSDP_STATUS_OK;
    }
    fsdp_adamw_job *job;
    FSDP_TRY(fsdp_adamw_job_submit(pool, FSDP_CPU_ISA_COUNT, p, grad, m, v, n, lr, b1, b2, eps,
                                   wd, bc1, bc2, grad_scale, p_out, out_dt, &job));
    fsdp_adamw_job_wait(job);
    return FSDP_STATUS_OK;
}
