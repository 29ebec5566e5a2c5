/*
 * rng.c - fsdp_rng_normal over a range, fast and with the same bits.
 *
 * Box-Muller's log and cos through libm cost ~30 ns a value (cos's branches
 * on a random argument mispredict), which made a 127M-parameter model's
 * initialisation take ~4 s. Here log and cos are polynomials without
 * branches on the value. They are not libm's bits, so each value also gets
 * a bound E on the distance between the double computed here and the one
 * libm's expression gives. Rounding to float is monotonic, so when v - E
 * and v + E round to the same float, libm's double rounds to it too. Else
 * (one value in 20 million measured, where a double lies within E of a
 * float's rounding boundary) the value is computed with libm. The floats
 * are libm's, bit for bit, whatever the platform's libm rounds as long as
 * its log and cos are within a few ulp (glibc's are within one).
 *
 * The bounds are generous. log: |s| <= 0.1716 after reduction, the series
 * to s^23 leaves < 1e-19; the sum's and the reduction's rounding < 8 ulp.
 * cos: the argument is reduced by pi/2 in two parts (fdlibm's pio2_1, 33
 * bits, so k pio2_1 and x - k pio2_1 are exact; its tail's error < 1e-26);
 * the Taylor series of sin and cos on |r| <= pi/4 to r^19 and r^18 leave
 * < 1e-20.
 */
#include "core/rng.h"

#include <stdbool.h>
#include <string.h>

/* Box-Muller in double without branches on the value, so that the
 * compiler vectorises a block of them: the exponent and the quadrant are
 * found with double arithmetic.
 *
 * log(u1): u1 = m 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s),
 * s = (m - 1) / (m + 1), |s| <= 0.1716; relative error below 1e-15.
 * cos(x), x = 2 pi u2 in [0, 2 pi): x = k pi/2 + r, |r| <= pi/4, in two parts
 * (fdlibm's pio2_1, 33 bits, so k pio2_1 and x - k pio2_1 are exact); the
 * absolute error is below 4e-16 (|cos x| + |r|) + 1e-25. */
#define RNG_BLOCK 64

/* Series coefficients, highest power first. log m = 2 s (1 + s^2 LOG(s^2)),
 * LOG = 1/3 + s^2/5 + ... + s^20/23; cos r = 1 - r^2 COS(r^2), COS = 1/2! -
 * r^2/4! + ... + r^16/18!; sin r = r - r^3 SIN(r^2), SIN = 1/3! - r^2/5! +
 * ... + r^16/19!. */
static const double log_coef[] = {1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13,
                                  1.0 / 11, 1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3};
static const double cos_coef[] = {1.0 / 6402373705728000, -1.0 / 20922789888000,
                                  1.0 / 87178291200,      -1.0 / 479001600,
                                  1.0 / 3628800,          -1.0 / 40320,
                                  1.0 / 720,              -1.0 / 24,
                                  1.0 / 2};
static const double sin_coef[] = {1.0 / 121645100408832000, -1.0 / 355687428096000,
                                  1.0 / 1307674368000,      -1.0 / 6227020800,
                                  1.0 / 39916800,           -1.0 / 362880,
                                  1.0 / 5040,               -1.0 / 120,
                                  1.0 / 6};

/* The polynomial with coefficients c[0..n) (highest power first) at x. */
static inline __attribute__((always_inline)) double horner(const double *c, int n, double x)
{
    double p = c[0];
#pragma GCC unroll 16 /* unrolled whole, so that the block's loop vectorises */
    for (int j = 1; j < n; j++)
        p = p * x + c[j];
    return p;
}

#define RNG_LEN(a) ((int)(sizeof(a) / sizeof(a)[0]))

/* Value i of a block (the loop body of the kernels below). */
static inline __attribute__((always_inline)) void block_value(const double *u1, const double *u2,
                                                              double *v, double *bound, int i)
{
    /* log u1: u1 = m 2^e, the exponent read as a double through 2^52's bits */
    uint64_t bits, ebits, mbits;
    double e, m;
    memcpy(&bits, &u1[i], sizeof bits);
    ebits = (bits >> 52) | 0x4330000000000000ull;
    memcpy(&e, &ebits, sizeof e);
    e -= 4503599627370496.0 + 1023.0;
    mbits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    memcpy(&m, &mbits, sizeof m); /* [1, 2) */
    const bool big = m > 1.4142135623730951;
    m = big ? m * 0.5 : m;
    e = big ? e + 1.0 : e;
    const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
    const double lg = e * 0.6931471805599453 +
                      (2.0 * s + 2.0 * s * (s2 * horner(log_coef, RNG_LEN(log_coef), s2)));
    const double rad = sqrt(-2.0 * lg);
    /* cos x: x = k pi/2 + r */
    const double x = 6.283185307179586 * u2[i];
    const double k = floor(x * 0.6366197723675814 + 0.5); /* 0 .. 4 */
    const double r = (x - k * 1.57079632673412561417e+00) - k * 6.07710050650619224932e-11;
    const double r2 = r * r;
    const double cr = 1.0 - r2 * horner(cos_coef, RNG_LEN(cos_coef), r2);
    const double sr = r - r * r2 * horner(sin_coef, RNG_LEN(sin_coef), r2);
    /* quadrant k mod 4: cos x = cr, -sr, -cr, sr */
    const double q = k - 4.0 * floor(k * 0.25);
    const bool odd = (q == 1.0) | (q == 3.0), neg = (q == 1.0) | (q == 2.0);
    double cx = odd ? sr : cr;
    cx = neg ? -cx : cx;
    const double val = rad * cx;
    v[i] = val;
    bound[i] = rad * (4e-15 * fabs(cx) + 4e-16 * fabs(r) + 1e-25) + 4e-16 * fabs(val);
}

/* The values of a block: u1, u2 in; v (the double of Box-Muller's value
 * here) and its bound out; compiled for the baseline and for AVX2. */
static void block_base(const double *u1, const double *u2, double *v, double *bound, int n)
{
    for (int i = 0; i < n; i++)
        block_value(u1, u2, v, bound, i);
}

__attribute__((target("avx2,fma"))) static void block_avx2(const double *u1, const double *u2,
                                                          double *v, double *bound, int n)
{
    for (int i = 0; i < n; i++)
        block_value(u1, u2, v, bound, i);
}

float fsdp_rng_box_muller(uint64_t a, uint64_t b)
{
    const double u1 = fsdp_rng_bm_u1(a), u2 = fsdp_rng_bm_u2(b);
    double v, bound;
    block_base(&u1, &u2, &v, &bound, 1);
    const float lo = (float)(v - bound), hi = (float)(v + bound);
    return lo == hi ? lo : fsdp_rng_box_muller_libm(a, b);
}

void fsdp_rng_normal_fill(uint64_t seed, uint64_t stream, uint64_t first, size_t n, float scale,
                          float *dst)
{
    const uint64_t key = fsdp_rng_key(seed, stream);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    uint64_t a[RNG_BLOCK], b[RNG_BLOCK];
    double u1[RNG_BLOCK], u2[RNG_BLOCK], v[RNG_BLOCK], bound[RNG_BLOCK];
    for (size_t at = 0; at < n; at += RNG_BLOCK) {
        const int m = n - at < RNG_BLOCK ? (int)(n - at) : RNG_BLOCK;
        for (int i = 0; i < m; i++) {
            const uint64_t index = first + at + (size_t)i;
            a[i] = fsdp_rng_mix(key ^ (2 * index));
            b[i] = fsdp_rng_mix(key ^ (2 * index + 1));
            u1[i] = fsdp_rng_bm_u1(a[i]);
            u2[i] = fsdp_rng_bm_u2(b[i]);
        }
        if (avx2)
            block_avx2(u1, u2, v, bound, m);
        else
            block_base(u1, u2, v, bound, m);
        for (int i = 0; i < m; i++) {
            const float lo = (float)(v[i] - bound[i]), hi = (float)(v[i] + bound[i]);
            dst[at + (size_t)i] = scale * (lo == hi ? lo : fsdp_rng_box_muller_libm(a[i], b[i]));
        }
    }
}
