/*
 * cuda_tens.h - a tensor held on both devices of a cuda_test.h pair, for
 * the suites that check every cuda op against the cpu backend
 * (test_cuda_ops, test_cuda_llama): creation from seeded normals or given
 * integers, poisoned outputs, read-back as fp32, the cuda-vs-cpu comparison
 * and the "same op twice, same bits" check.
 *
 * An op under test is a t_run_fn that runs it on one side of the pair; the
 * harness runs it on both, compares the outputs the test names, resets
 * them and runs the gpu side again for the determinism check. Every
 * assertion is Check's: call these from the forked test only.
 */
#ifndef FSDP_TESTS_CUDA_TENS_H
#define FSDP_TESTS_CUDA_TENS_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_test.h"

/* A tensor on both devices. init holds its fp32 values (representable in
 * dt; for t_ints, the int32 bits). A poisoned tensor (an output) starts,
 * and is reset by t_upload to, 0xFF bytes on the gpu (NaN in fp32 and
 * bf16), so an element an op fails to write fails every comparison; its
 * cpu copy holds init. */
typedef struct tens {
    void *c, *g;
    size_t n;
    fsdp_dtype dt;
    float *init;
    int poison;
} tens;

/* n values std * N(0, 1) from (P->seed, stream), rounded to dt; std 0:
 * zeros. */
tens t_new(pair *P, size_t n, fsdp_dtype dt, float std, uint64_t stream);
/* An output: poisoned on the gpu, init (cpu copy) all 0xFF bytes. */
tens t_out(pair *P, size_t n, fsdp_dtype dt);
/* An int32 array v (n) on both devices. */
tens t_ints(pair *P, const int *v, size_t n);
/* Both copies back to init (poisoned outputs re-poisoned on the gpu);
 * waits for the gpu. */
void t_upload(pair *P, tens *t);
/* Contents as fp32 (malloc'd): the cpu copy, or (gpu 1) the gpu copy. */
float *t_get(pair *P, const tens *t, int gpu);
void t_free(pair *P, tens *t);
/* Frees every tensor in a list: T_FREE_ALL(&P, &a, &b, ...). */
void t_free_n(pair *P, tens *const *all, size_t n);
#define T_FREE_ALL(P, ...)                                         \
    do {                                                           \
        tens *all_[] = {__VA_ARGS__};                              \
        t_free_n((P), all_, sizeof all_ / sizeof *all_);           \
    } while (0)

/* The side of t an op on side `gpu` (0 cpu, 1 gpu) reads or writes. */
static inline void *t_on(const tens *t, int gpu) { return gpu ? t->g : t->c; }
/* The op context of that side. */
static inline fsdp_op_ctx *pair_ops(pair *P, int gpu) { return gpu ? &P->og : &P->oc; }

/* bf16 tolerance 1e-2, else f32_tol. */
static inline double tol_for(fsdp_dtype dt, double f32_tol)
{
    return dt == FSDP_DTYPE_BF16 ? 1e-2 : f32_tol;
}

/* |got - want| <= rtol * (|want| + max|want|) everywhere (NaN fails); the
 * message names the first bad element, the count and the worst error. */
void expect_close(const char *what, const float *got, const float *want, size_t n, double rtol);
/* Tensor t, gpu copy against cpu copy at rtol (message adds P->dt);
 * *gpu_copy (if not NULL) receives the gpu values, else they are freed. */
void expect_pair(pair *P, const char *what, const tens *t, double rtol, float **gpu_copy);
/* The gpu contents of t equal prev bit for bit (frees prev). */
void expect_same_bits(pair *P, const char *what, const tens *t, float *prev);
/* The gpu and cpu copies of t agree bit for bit, element by element. */
void expect_bits_equal(pair *P, const char *what, const tens *t);
/* The last gpu op failed: stream_sync is OK, sync_error says INVALID_ARG
 * with a message holding needle (and needle2 unless NULL), then clears. */
void expect_sync_error(pair *P, const char *needle, const char *needle2);

/* ---- an op under test, run on both sides ------------------------------------ */

/* Runs the op(s) under test on side gpu through o (0: P->oc and the .c
 * copies, 1: P->og and the .g copies); arg is the test's own. */
typedef void (*t_run_fn)(fsdp_op_ctx *o, int gpu, const void *arg);

/* One output the op writes or accumulates into, compared at rtol. */
typedef struct t_check {
    const char *what;
    tens *t;
    double rtol;
} t_check;

/* Runs on the cpu and the gpu, waits (gpu_done), and compares each of
 * chk[0..n) with expect_pair; keep[k] receives the gpu values of chk[k]
 * (keep NULL: freed). */
void t_compare(pair *P, t_run_fn run, const void *arg, const t_check *chk, size_t n,
               float **keep);
/* Resets each of chk (t_upload: accumulators to init, outputs
 * poisoned), runs on the gpu again and expects keep[k]'s bits (freed). */
void t_rerun_same_bits(pair *P, t_run_fn run, const void *arg, const t_check *chk, size_t n,
                       float **keep);
/* t_compare, then t_rerun_same_bits: the whole check of an op whose test
 * looks at nothing in between. */
void t_check_op(pair *P, t_run_fn run, const void *arg, const t_check *chk, size_t n);

#endif /* FSDP_TESTS_CUDA_TENS_H */
