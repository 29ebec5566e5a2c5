/*
 * synth.c - the built-in synthetic task: multi-digit addition as bytes.
 *
 * A problem is two FSDP_SYNTH_DIGITS-digit operands, zero-padded, and their
 * sum written least significant digit first, padded to DIGITS+1 digits, in a
 * block that starts with a newline and ends with one:
 *
 *     "\n352+471=3280\n"      (352 + 471 = 823 -> "0823" reversed)
 *
 * Every block is exactly SYNTH_LEN (14) bytes, so the training stream
 * (blocks 0, 1, 2, ... concatenated) is random-access: byte p belongs to
 * block p / SYNTH_LEN. The newline comes first so that a row whose length
 * is a multiple of 14 starting at a multiple of 14 (data.c: row r of
 * micro-batch m starts at (m*B + r)*T) is whole problems, each at the same
 * positions in every row and exactly where the trainer's greedy evaluation
 * puts it ("\n" + prompt, then the answer). With T = 14 a small model can
 * locate the operand digits by absolute position alone.
 *
 * Why it is learnable in about a minute on 2 cores: reversed, fixed-width
 * answers make each answer digit depend only on two operand digits it has
 * already seen and one carry. But with uniform digits, (x + y) mod 10 says
 * nothing about x alone, so there is no first-order signal telling
 * attention which positions matter and training sits on a long plateau
 * (measured: hundreds of steps at the marginal-distribution loss). So the
 * training operands are skewed: each operand digit is independently
 * replaced by 0 with probability SYNTH_ZERO_NUM/256 (about 0.3); when one
 * digit is 0 the answer digit is a copy of the other, which teaches the
 * positions quickly, and every (x, y) digit pair still occurs often. The
 * held-out problems stay uniform over their pairs: the accuracy is measured
 * on ordinary random problems, not on the easier training mix.
 *
 * Problems come from the counter-based RNG (core/rng.h) keyed by (seed,
 * problem index), so any rank can generate any part of the stream. The
 * operand pairs are split in two by a keyed hash: a pair (a, b) is held out
 * when hash(seed, a, b) mod SYNTH_HELDOUT_DIV is 0. Training problems are
 * drawn only from the other pairs and fsdp_synth_problem() only from the
 * held-out ones, so for the same seed no held-out problem ever occurs in a
 * training batch, by construction.
 */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/rng.h"
#include "data/data_internal.h"

#define FSDP_SYNTH_DIGITS 3
#define SYNTH_RANGE 1000u            /* 10^DIGITS: operands are 0..RANGE-1 */
#define SYNTH_PROMPT_LEN (2 * FSDP_SYNTH_DIGITS + 2)        /* "352+471=" */
#define SYNTH_ANSWER_LEN (FSDP_SYNTH_DIGITS + 2)            /* "3280\n" */
#define SYNTH_LEN (1 + SYNTH_PROMPT_LEN + SYNTH_ANSWER_LEN) /* "\n352+471=3280\n" */
#define SYNTH_HELDOUT_DIV 16u        /* 1 pair in 16 is held out */
#define SYNTH_MAX_DRAWS 1024         /* redraws before falling back to a scan */
#define SYNTH_ZERO_NUM 77u           /* training digit -> 0 with probability 77/256 */

_Static_assert(SYNTH_RANGE == 1000u, "SYNTH_RANGE must be 10^FSDP_SYNTH_DIGITS");
_Static_assert(SYNTH_LEN == FSDP_SYNTH_ROW, "data.h's FSDP_SYNTH_ROW is one problem's block");
_Static_assert(SYNTH_PROMPT_LEN < 64 && SYNTH_ANSWER_LEN < 64,
               "fsdp_synth_problem's buffers are 64 bytes");
_Static_assert(2 * FSDP_SYNTH_DIGITS <= 8, "one byte of a 64-bit draw per zero flag");

/* RNG streams; distinct constants so the four never share keys (the
 * draw loops add at most SYNTH_MAX_DRAWS to a stream). */
#define STREAM_SPLIT 0x73706c6974ull   /* held-out predicate */
#define STREAM_TRAIN 0x747261696e000000ull
#define STREAM_HELD 0x68656c6400000000ull
#define STREAM_ZERO 0x7a65726f00000000ull /* training skew flags */

static bool pair_held_out(uint64_t seed, uint32_t a, uint32_t b)
{
    return fsdp_rng_u64(seed, STREAM_SPLIT, (uint64_t)a * SYNTH_RANGE + b) % SYNTH_HELDOUT_DIV == 0;
}

/* v with its decimal digit i set to 0 where byte i of flags is below
 * SYNTH_ZERO_NUM (the training skew; see the top of the file). */
static uint32_t zero_digits(uint32_t v, uint64_t flags)
{
    uint32_t place = 1;
    for (int i = 0; i < FSDP_SYNTH_DIGITS; i++, place *= 10) {
        if (((flags >> (8 * i)) & 0xffu) < SYNTH_ZERO_NUM)
            v -= (v / place % 10) * place;
    }
    return v;
}

/* Problem `index` of the stream `stream`, drawn from the pairs whose
 * held-out flag equals `held`, with the training skew when `skew`: up to
 * SYNTH_MAX_DRAWS independent draws, then (with probability below 1e-14
 * for the training side) a scan over all pairs from the last draw, which
 * keeps the result a pure function of the keys. */
static void draw_pair(uint64_t seed, uint64_t stream, uint64_t index, bool held, bool skew,
                      uint32_t *a, uint32_t *b)
{
    uint64_t x = 0;
    for (int k = 0; k < SYNTH_MAX_DRAWS; k++) {
        x = fsdp_rng_u64(seed, stream + (uint64_t)k, index);
        *a = (uint32_t)((x & 0xffffffffu) % SYNTH_RANGE);
        *b = (uint32_t)((x >> 32) % SYNTH_RANGE);
        if (skew) {
            uint64_t z = fsdp_rng_u64(seed, STREAM_ZERO + (uint64_t)k, index);
            *a = zero_digits(*a, z);
            *b = zero_digits(*b, z >> (8 * FSDP_SYNTH_DIGITS));
        }
        if (pair_held_out(seed, *a, *b) == held)
            return;
    }
    uint64_t id = (uint64_t)*a * SYNTH_RANGE + *b;
    for (uint64_t n = 0; n < (uint64_t)SYNTH_RANGE * SYNTH_RANGE; n++) {
        id = (id + 1) % ((uint64_t)SYNTH_RANGE * SYNTH_RANGE);
        *a = (uint32_t)(id / SYNTH_RANGE);
        *b = (uint32_t)(id % SYNTH_RANGE);
        if (pair_held_out(seed, *a, *b) == held)
            return;
    }
    FSDP_ASSERT(!"synthetic task: one side of the held-out split is empty");
}

/* Text of problem (a, b): prompt = SYNTH_PROMPT_LEN bytes, then the answer. */
static void format_problem(uint32_t a, uint32_t b, char *prompt, char *answer)
{
    snprintf(prompt, 64, "%0*u+%0*u=", FSDP_SYNTH_DIGITS, a, FSDP_SYNTH_DIGITS, b);
    uint32_t s = a + b;
    for (int i = 0; i <= FSDP_SYNTH_DIGITS; i++) {
        answer[i] = (char)('0' + s % 10);
        s /= 10;
    }
    answer[FSDP_SYNTH_DIGITS + 1] = '\n';
    answer[FSDP_SYNTH_DIGITS + 2] = '\0';
}

void fsdp_synth_problem(uint64_t seed, uint64_t index, char *prompt, char *answer)
{
    uint32_t a, b;
    draw_pair(seed, STREAM_HELD, index, true, false, &a, &b);
    format_problem(a, b, prompt, answer);
}

/* Training problem k as SYNTH_LEN bytes (no NUL) in out. */
static void train_problem(uint64_t seed, uint64_t k, char out[SYNTH_LEN])
{
    uint32_t a, b;
    char prompt[64], answer[64];
    draw_pair(seed, STREAM_TRAIN, k, false, true, &a, &b);
    format_problem(a, b, prompt, answer);
    out[0] = '\n';
    memcpy(out + 1, prompt, SYNTH_PROMPT_LEN);
    memcpy(out + 1 + SYNTH_PROMPT_LEN, answer, SYNTH_ANSWER_LEN);
}

void fsdp_synth_stream_read(uint64_t seed, uint64_t pos, size_t n, int *dst)
{
    char text[SYNTH_LEN];
    while (n > 0) {
        uint64_t k = pos / SYNTH_LEN;
        size_t c = (size_t)(pos % SYNTH_LEN);
        size_t run = SYNTH_LEN - c;
        if (run > n)
            run = n;
        train_problem(seed, k, text);
        for (size_t i = 0; i < run; i++)
            dst[i] = (unsigned char)text[c + i];
        dst += run;
        n -= run;
        pos += run; /* wraps modulo 2^64: still a pure function of pos */
    }
}

int fsdp_synth_stream_byte(uint64_t seed, uint64_t pos)
{
    int t;
    fsdp_synth_stream_read(seed, pos, 1, &t);
    return t;
}

int fsdp_synth_max_byte(void)
{
    static const char alphabet[] = "0123456789+=\n";
    int mx = 0;
    for (const char *p = alphabet; *p; p++)
        if ((unsigned char)*p > mx)
            mx = (unsigned char)*p;
    return mx;
}
