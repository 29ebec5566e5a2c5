/*
 * nf4.c - bitsandbytes' NF4 with double quantization on the host (nf4.h).
 *
 * Every step follows what bitsandbytes' CPU path computes, so codes,
 * absmax codes and dequantized values are bit-identical to it (checked by
 * tests/test_bnb4.c against tools/gen_bnb4_fixture.py's golden files):
 *
 * - quantize_4bit (torch code, backends/default): absmax = max |x| over the
 *   block; scaled = clamp(x * (1 / max(absmax, 1e-38)), -1, 1) in fp32 (a
 *   short last block divides instead: x / max(absmax, 1e-38)); the code is
 *   torch.bucketize against the midpoints (code[i] + code[i+1]) / 2, i.e.
 *   the number of midpoints strictly below scaled: a tie goes to the lower
 *   code. An odd tensor's missing element is a scaled 0, code 7.
 * - double quantization: offset = absmax.mean(), torch's fp32 cascade sum
 *   (SumKernel.cpp) over 8-float vectors, divided by the count. Torch's sum
 *   runs on one thread up to 32768 values (tensors of up to 2M elements);
 *   past that it splits over its threads and may round otherwise: larger
 *   tensors match torch.set_num_threads(1);
 *   (absmax - offset) is quantized by bitsandbytes' C quantize_blockwise in
 *   blocks of 256: nested absmax = max |v|, then v * (1 / nested) looked up
 *   in a 65536-bin table of the nearest dynamic-map entries (not the exact
 *   nearest entry: a value near a midpoint may take the farther one).
 * - dequantization: dynamic_map[q] * nested, then + offset, then
 *   nf4_code[c] * absmax, each rounded to fp32 (no fused multiply-add: the
 *   Makefile builds with -ffp-contract=off).
 *
 * The tables are literal constants printed by tools/gen_bnb4_fixture.py
 * --tables; test_bnb4 checks them against bitsandbytes' own.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "ops/nf4.h"

const float fsdp_nf4_code[16] = {
    -1.0f, -0.696192801f, -0.525073051f, -0.394917488f,
    -0.284441382f, -0.18477343f, -0.0910500363f, 0.0f,
    0.0795802996f, 0.160930201f, 0.246112302f, 0.337915242f,
    0.440709829f, 0.562617004f, 0.722956836f, 1.0f,
};

const float fsdp_nf4_dynamic_map[256] = {
    -0.992968738f, -0.978906274f, -0.96484375f, -0.950781226f,
    -0.936718762f, -0.922656238f, -0.908593774f, -0.89453125f,
    -0.880468726f, -0.866406262f, -0.852343738f, -0.838281274f,
    -0.82421875f, -0.810156226f, -0.796093762f, -0.782031238f,
    -0.767968774f, -0.75390625f, -0.739843726f, -0.725781262f,
    -0.711718798f, -0.697656274f, -0.68359375f, -0.669531226f,
    -0.655468762f, -0.641406298f, -0.627343774f, -0.61328125f,
    -0.599218726f, -0.585156262f, -0.571093798f, -0.557031274f,
    -0.54296875f, -0.528906226f, -0.514843702f, -0.500781238f,
    -0.486718714f, -0.47265625f, -0.458593726f, -0.444531262f,
    -0.430468738f, -0.416406244f, -0.40234375f, -0.388281226f,
    -0.374218762f, -0.360156238f, -0.346093744f, -0.33203125f,
    -0.317968726f, -0.303906262f, -0.289843738f, -0.275781274f,
    -0.26171875f, -0.247656241f, -0.233593747f, -0.219531253f,
    -0.205468744f, -0.19140625f, -0.177343756f, -0.163281247f,
    -0.149218753f, -0.135156244f, -0.12109375f, -0.107031256f,
    -0.0985937491f, -0.0957812592f, -0.0929687545f, -0.0901562497f,
    -0.0873437524f, -0.0845312476f, -0.0817187577f, -0.078906253f,
    -0.0760937482f, -0.0732812509f, -0.0704687461f, -0.0676562563f,
    -0.0648437515f, -0.0620312504f, -0.0592187531f, -0.0564062484f,
    -0.053593751f, -0.05078125f, -0.047968749f, -0.0451562516f,
    -0.0423437469f, -0.0395312496f, -0.0367187522f, -0.0339062512f,
    -0.0310937501f, -0.028281251f, -0.0254687499f, -0.0226562507f,
    -0.0198437516f, -0.0170312505f, -0.0142187504f, -0.0114062503f,
    -0.00971874967f, -0.00915624946f, -0.00859375019f, -0.00803124998f,
    -0.00746874977f, -0.00690625003f, -0.00634374982f, -0.00578125007f,
    -0.00521875033f, -0.00465624966f, -0.00409374991f, -0.00353124971f,
    -0.00296874996f, -0.00240624999f, -0.00184375001f, -0.00128124992f,
    -0.000943750085f, -0.000831249985f, -0.00071875006f, -0.000606250076f,
    -0.000493750034f, -0.000381250022f, -0.000268750038f, -0.000156250011f,
    -8.87499991e-05f, -6.62500024e-05f, -4.37499984e-05f, -2.12499981e-05f,
    -7.7499999e-06f, -3.25000019e-06f, -5.50000038e-07f, 0.0f,
    5.50000038e-07f, 3.25000019e-06f, 7.7499999e-06f, 2.12499981e-05f,
    4.37499984e-05f, 6.62500024e-05f, 8.87499991e-05f, 0.000156250011f,
    0.000268750038f, 0.000381250022f, 0.000493750034f, 0.000606250076f,
    0.00071875006f, 0.000831249985f, 0.000943750085f, 0.00128124992f,
    0.00184375001f, 0.00240624999f, 0.00296874996f, 0.00353124971f,
    0.00409374991f, 0.00465624966f, 0.00521875033f, 0.00578125007f,
    0.00634374982f, 0.00690625003f, 0.00746874977f, 0.00803124998f,
    0.00859375019f, 0.00915624946f, 0.00971874967f, 0.0114062503f,
    0.0142187504f, 0.0170312505f, 0.0198437516f, 0.0226562507f,
    0.0254687499f, 0.028281251f, 0.0310937501f, 0.0339062512f,
    0.0367187522f, 0.0395312496f, 0.0423437469f, 0.0451562516f,
    0.047968749f, 0.05078125f, 0.053593751f, 0.0564062484f,
    0.0592187531f, 0.0620312504f, 0.0648437515f, 0.0676562563f,
    0.0704687461f, 0.0732812509f, 0.0760937482f, 0.078906253f,
    0.0817187577f, 0.0845312476f, 0.0873437524f, 0.0901562497f,
    0.0929687545f, 0.0957812592f, 0.0985937491f, 0.107031256f,
    0.12109375f, 0.135156244f, 0.149218753f, 0.163281247f,
    0.177343756f, 0.19140625f, 0.205468744f, 0.219531253f,
    0.233593747f, 0.247656241f, 0.26171875f, 0.275781274f,
    0.289843738f, 0.303906262f, 0.317968726f, 0.33203125f,
    0.346093744f, 0.360156238f, 0.374218762f, 0.388281226f,
    0.40234375f, 0.416406244f, 0.430468738f, 0.444531262f,
    0.458593726f, 0.47265625f, 0.486718714f, 0.500781238f,
    0.514843702f, 0.528906226f, 0.54296875f, 0.557031274f,
    0.571093798f, 0.585156262f, 0.599218726f, 0.61328125f,
    0.627343774f, 0.641406298f, 0.655468762f, 0.669531226f,
    0.68359375f, 0.697656274f, 0.711718798f, 0.725781262f,
    0.739843726f, 0.75390625f, 0.767968774f, 0.782031238f,
    0.796093762f, 0.810156226f, 0.82421875f, 0.838281274f,
    0.852343738f, 0.866406262f, 0.880468726f, 0.89453125f,
    0.908593774f, 0.922656238f, 0.936718762f, 0.950781226f,
    0.96484375f, 0.978906274f, 0.992968738f, 1.0f,
};

/* torch clamps a block's absmax to this before it divides by it. */
#define NF4_ABSMAX_FLOOR 1e-38f
/* torch's Vectorized<float> width for sum (AVX2), and its cascade sum's shape. */
#define SUM_LANES 8
#define SUM_ILP 4
#define SUM_LEVELS 4

/* The code of one scaled value: how many NF4 midpoints lie strictly below it. */
static uint8_t nf4_code_of(float s)
{
    uint8_t q = 0;
    for (int i = 0; i < 15; i++) {
        float mid = (fsdp_nf4_code[i] + fsdp_nf4_code[i + 1]) / 2.0f;
        q += mid < s;
    }
    return q;
}

static float clamp_unit(float s)
{
    return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
}

void fsdp_nf4_quantize(const float *x, size_t n, uint8_t *codes, float *absmax)
{
    size_t full = n - n % FSDP_NF4_BLOCK;
    for (size_t b0 = 0; b0 < n; b0 += FSDP_NF4_BLOCK) {
        size_t len = n - b0 < FSDP_NF4_BLOCK ? n - b0 : FSDP_NF4_BLOCK;
        float am = 0.0f;
        for (size_t i = 0; i < len; i++) {
            float a = fabsf(x[b0 + i]);
            am = a > am ? a : am;
        }
        absmax[b0 / FSDP_NF4_BLOCK] = am;
        float den = am < NF4_ABSMAX_FLOOR ? NF4_ABSMAX_FLOOR : am;
        float inv = 1.0f / den;
        for (size_t i = 0; i < len; i++) {
            size_t k = b0 + i;
            float s = clamp_unit(k < full ? x[k] * inv : x[k] / den);
            uint8_t q = nf4_code_of(s);
            if (k % 2 == 0)
                codes[k / 2] = (uint8_t)(q << 4);
            else
                codes[k / 2] |= q;
        }
    }
    if (n % 2)
        codes[n / 2] |= nf4_code_of(0.0f);
}

/* ceil(log2(v)) for v >= 1, 0 for v <= 1 (c10::utils::CeilLog2). */
static int ceil_log2(size_t v)
{
    int l = 0;
    while (v > 1 && ((size_t)1 << l) < v)
        l++;
    return l;
}

/* torch's multi_row_sum over rows of SUM_ILP vectors of SUM_LANES floats:
 * acc[k] (SUM_ILP x SUM_LANES) = the cascaded sums of column k of rows
 * [0, nrows) of x (row r at x + r * SUM_ILP * SUM_LANES). */
static void cascade_rows(const float *x, size_t nrows, float acc[SUM_ILP][SUM_LANES])
{
    float level[SUM_LEVELS][SUM_ILP][SUM_LANES] = {{{0}}};
    int power = ceil_log2(nrows) / SUM_LEVELS;
    if (power < 4)
        power = 4;
    size_t step = (size_t)1 << power, mask = step - 1;
    size_t i = 0;
    const size_t row = SUM_ILP * SUM_LANES;
    while (i + step <= nrows) {
        for (size_t j = 0; j < step; j++, i++)
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < SUM_LANES; l++)
                    level[0][k][l] += x[i * row + k * SUM_LANES + l];
        for (int j = 1; j < SUM_LEVELS; j++) {
            for (int k = 0; k < SUM_ILP; k++)
                for (int l = 0; l < SUM_LANES; l++) {
                    level[j][k][l] += level[j - 1][k][l];
                    level[j - 1][k][l] = 0.0f;
                }
            if ((i & (mask << (j * power))) != 0)
                break;
        }
    }
    for (; i < nrows; i++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < SUM_LANES; l++)
                level[0][k][l] += x[i * row + k * SUM_LANES + l];
    for (int j = 1; j < SUM_LEVELS; j++)
        for (int k = 0; k < SUM_ILP; k++)
            for (int l = 0; l < SUM_LANES; l++)
                level[0][k][l] += level[j][k][l];
    for (int k = 0; k < SUM_ILP; k++)
        for (int l = 0; l < SUM_LANES; l++)
            acc[k][l] = level[0][k][l];
}

/* torch's fp32 sum of a contiguous tensor on one thread (vectorized_inner_sum). */
static float torch_sum(const float *x, size_t n)
{
    if (n < SUM_LANES) {
        /* scalar_inner_sum: the same cascade, one float per column. */
        float acc[SUM_ILP] = {0};
        size_t rows = n / SUM_ILP;
        for (size_t r = 0; r < rows; r++)
            for (int k = 0; k < SUM_ILP; k++)
                acc[k] += x[r * SUM_ILP + k];
        for (size_t i = rows * SUM_ILP; i < n; i++)
            acc[0] += x[i];
        for (int k = 1; k < SUM_ILP; k++)
            acc[0] += acc[k];
        return acc[0];
    }
    size_t nvec = n / SUM_LANES, rows = nvec / SUM_ILP;
    float acc[SUM_ILP][SUM_LANES];
    cascade_rows(x, rows, acc);
    for (size_t v = rows * SUM_ILP; v < nvec; v++)
        for (int l = 0; l < SUM_LANES; l++)
            acc[0][l] += x[v * SUM_LANES + l];
    for (int k = 1; k < SUM_ILP; k++)
        for (int l = 0; l < SUM_LANES; l++)
            acc[0][l] += acc[k][l];
    float total = 0.0f;
    for (size_t i = nvec * SUM_LANES; i < n; i++)
        total += x[i];
    for (int l = 0; l < SUM_LANES; l++)
        total += acc[0][l];
    return total;
}

/* bitsandbytes' C quantize_blockwise maps a value in [-1, 1] to one of
 * DQ_LUT_SIZE evenly spaced bins, and each bin to the dynamic-map entry
 * nearest to its centre: lut[i] = the number of midpoints between map entries
 * strictly below -1 + 2i / (DQ_LUT_SIZE - 1). Built once, read-only after. */
#define DQ_LUT_SIZE 65536
static uint8_t dq_lut[DQ_LUT_SIZE];
static pthread_once_t dq_lut_once = PTHREAD_ONCE_INIT;

static void dq_lut_build(void)
{
    float mid[255];
    for (int i = 0; i < 255; i++)
        mid[i] = 0.5f * (fsdp_nf4_dynamic_map[i] + fsdp_nf4_dynamic_map[i + 1]);
    int q = 0;
    for (int i = 0; i < DQ_LUT_SIZE; i++) {
        float v = -1.0f + (2.0f * (float)i) / (float)(DQ_LUT_SIZE - 1);
        while (q < 255 && mid[q] < v)
            q++;
        dq_lut[i] = (uint8_t)q;
    }
}

/* One value's absmax code: v * (1 / nested absmax), clamped, binned. */
static uint8_t dynamic_code_of(float v, float inv)
{
    float s = clamp_unit(v * inv);
    float t = (s + 1.0f) * 0.5f;
    t = t * (float)(DQ_LUT_SIZE - 1);
    t = t + 0.5f;
    return dq_lut[(uint16_t)t];
}

void fsdp_nf4_double_quant(const float *absmax, size_t nblocks, uint8_t *qabsmax, float *nested,
                           float *offset)
{
    pthread_once(&dq_lut_once, dq_lut_build);
    float off = nblocks ? torch_sum(absmax, nblocks) / (float)nblocks : 0.0f;
    *offset = off;
    for (size_t b0 = 0; b0 < nblocks; b0 += FSDP_NF4_NESTED) {
        size_t len = nblocks - b0 < FSDP_NF4_NESTED ? nblocks - b0 : FSDP_NF4_NESTED;
        float am = 0.0f;
        for (size_t i = 0; i < len; i++) {
            float a = fabsf(absmax[b0 + i] - off);
            am = a > am ? a : am;
        }
        nested[b0 / FSDP_NF4_NESTED] = am;
        float inv = 1.0f / am;
        for (size_t i = 0; i < len; i++)
            qabsmax[b0 + i] = am == 0.0f ? 0 : dynamic_code_of(absmax[b0 + i] - off, inv);
    }
}

void fsdp_nf4_absmax(const uint8_t *qabsmax, const float *nested, float offset, size_t first,
                     size_t count, float *absmax)
{
    for (size_t b = first; b < first + count; b++) {
        float v = fsdp_nf4_dynamic_map[qabsmax[b]] * nested[b / FSDP_NF4_NESTED];
        absmax[b - first] = v + offset;
    }
}

bool fsdp_nf4_quantize_tensor(const float *x, size_t n, uint8_t *codes, float *absmax)
{
    size_t nb = fsdp_nf4_blocks(n);
    uint8_t *qabsmax = malloc(nb + 1);
    float *nested = malloc(fsdp_nf4_nested_blocks(nb) * sizeof *nested + 1);
    bool ok = qabsmax && nested;
    if (ok) {
        float offset;
        fsdp_nf4_quantize(x, n, codes, absmax);
        fsdp_nf4_double_quant(absmax, nb, qabsmax, nested, &offset);
        fsdp_nf4_absmax(qabsmax, nested, offset, 0, nb, absmax);
    }
    free(qabsmax);
    free(nested);
    return ok;
}

void fsdp_nf4_dequant_ref(const uint8_t *codes, const float *absmax, size_t n, float *x)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t byte = codes[i / 2];
        uint8_t q = i % 2 ? byte & 0x0f : byte >> 4;
        x[i] = fsdp_nf4_code[q] * absmax[i / FSDP_NF4_BLOCK];
    }
}
