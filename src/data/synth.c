/*
 * synth.c - the built-in synthetic task: multi-digit addition as bytes.
 *
 * A problem is two FSDP_SYNTH_DIGITS-digit operands, zero-padded, and their
 * sum written least significant digit first, padded to DIGITS+1 digits:
 *
 *     "352+471=3280\n"      (352 + 471 = 823 -> "0823" reversed)
 *
 * Every problem is exactly SYNTH_LEN bytes, so the training stream (problems
 * 0, 1, 2, ... concatenated) is random-access: byte p belongs to problem
 * p / SYNTH_LEN. Reversed, fixed-width answers are what lets a small
 * byte-level transformer learn the task in minutes: each answer digit then
 * depends only on two operand digits it has already seen and one carry.
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
#include "data/source.h"

#define FSDP_SYNTH_DIGITS 3
#define SYNTH_RANGE 1000u            /* 10^DIGITS: operands are 0..RANGE-1 */
#define SYNTH_PROMPT_LEN (2 * FSDP_SYNTH_DIGITS + 2)   /* "352+471=" */
#define SYNTH_ANSWER_LEN (FSDP_SYNTH_DIGITS + 2)       /* "3280\n" */
#define SYNTH_LEN (SYNTH_PROMPT_LEN + SYNTH_ANSWER_LEN)
#define SYNTH_HELDOUT_DIV 16u        /* 1 pair in 16 is held out */
#define SYNTH_MAX_DRAWS 1024         /* redraws before falling back to a scan */

_Static_assert(SYNTH_RANGE == 1000u, "SYNTH_RANGE must be 10^FSDP_SYNTH_DIGITS");
_Static_assert(SYNTH_PROMPT_LEN < 64 && SYNTH_ANSWER_LEN < 64,
               "fsdp_synth_problem's buffers are 64 bytes");

/* RNG streams; distinct constants so the three never share keys. */
#define STREAM_SPLIT 0x73706c6974ull   /* held-out predicate */
#define STREAM_TRAIN 0x747261696e000000ull
#define STREAM_HELD 0x68656c6400000000ull

static bool pair_held_out(uint64_t seed, uint32_t a, uint32_t b)
{
    return fsdp_rng_u64(seed, STREAM_SPLIT, (uint64_t)a * SYNTH_RANGE + b) % SYNTH_HELDOUT_DIV == 0;
}

/* Problem `index` of the stream `stream`, drawn from the pairs whose
 * held-out flag equals `held`: up to SYNTH_MAX_DRAWS independent draws, then
 * (with probability below 1e-14 for the training side) a scan over all pairs
 * from the last draw, which keeps the result a pure function of the keys. */
static void draw_pair(uint64_t seed, uint64_t stream, uint64_t index, bool held, uint32_t *a,
                      uint32_t *b)
{
    uint64_t x = 0;
    for (int k = 0; k < SYNTH_MAX_DRAWS; k++) {
        x = fsdp_rng_u64(seed, stream + (uint64_t)k, index);
        *a = (uint32_t)((x & 0xffffffffu) % SYNTH_RANGE);
        *b = (uint32_t)((x >> 32) % SYNTH_RANGE);
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
    draw_pair(seed, STREAM_HELD, index, true, &a, &b);
    format_problem(a, b, prompt, answer);
}

/* Training problem k as SYNTH_LEN bytes (no NUL) in out. */
static void train_problem(uint64_t seed, uint64_t k, char out[SYNTH_LEN])
{
    uint32_t a, b;
    char prompt[64], answer[64];
    draw_pair(seed, STREAM_TRAIN, k, false, &a, &b);
    format_problem(a, b, prompt, answer);
    memcpy(out, prompt, SYNTH_PROMPT_LEN);
    memcpy(out + SYNTH_PROMPT_LEN, answer, SYNTH_ANSWER_LEN);
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
