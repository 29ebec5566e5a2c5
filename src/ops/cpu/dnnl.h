/*
 * dnnl.h - GEMMs through oneDNN's matmul primitive: bf16 x bf16 -> fp32 for
 * CPUs with bf16 dot-product instructions (AVX512_BF16, AMX), and fp32 x
 * fp32 -> fp32 where oneDNN has its brgemm kernels for the CPU (AVX-512).
 *
 * Built from dnnl.c when the Makefile finds oneDNN 2.x, else from
 * dnnl_none.c (the probes then say why; bf16 GEMMs are widened to fp32 and
 * every fp32 GEMM runs in OpenBLAS).
 * Each op context (rank) keeps its own primitives: a GEMM is prepared on the
 * rank's thread (creating or finding the primitive for its shape), then its
 * tiles may run concurrently on the rank's team, each worker with its own
 * stream and scratchpad. oneDNN runs single-threaded on every calling
 * thread; the team provides the parallelism.
 */
#ifndef FSDP_OPS_CPU_DNNL_H
#define FSDP_OPS_CPU_DNNL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/bf16.h"
#include "core/error.h"

/* Whether bf16 GEMMs can use the CPU's bf16 dot-product instructions
 * through oneDNN; desc receives the library, version and kernel ("oneDNN
 * 2.6.3 brg:avx512_core_bf16") or the reason it cannot. Called once, from
 * blas.c's loader. */
bool fsdp_cpu_dnnl_probe(char *desc, size_t cap);

/* Whether fp32 GEMMs can use oneDNN's brgemm kernels (avx512_core and
 * wider; measured faster than OpenBLAS's on this project's shapes,
 * tools/bench_gemm.c); desc receives "oneDNN 2.6.3 avx512_core kernels"
 * (a shape may run brgemm or oneDNN's jit sgemm, both for that ISA) or the
 * reason not (on AVX2 oneDNN has only its jit sgemm, not measured against
 * OpenBLAS's kernels). Called once, from blas.c. */
bool fsdp_cpu_dnnl_probe_f32(char *desc, size_t cap);

/* Per-context oneDNN state (primitives by shape, per-worker streams and
 * scratchpads); NULL until the first prepare. */
typedef struct fsdp_cpu_dnnl fsdp_cpu_dnnl;

/* One GEMM shape, row-major: C (M, N) fp32 = op(A) op(B) + beta C with A,
 * B bf16 (fp32 when f32); op(A) is (M, K) (A stored (K, M) when ta), op(B)
 * is (K, N) (B stored (N, K) when tb); beta is 0 or 1; K > 0. */
typedef struct fsdp_cpu_dnnl_shape {
    bool f32;
    bool ta, tb;
    int M, N, K, lda, ldb, ldc;
    float beta;
} fsdp_cpu_dnnl_shape;

typedef struct fsdp_cpu_dnnl_prim fsdp_cpu_dnnl_prim;

/* The primitive for `shape`, created on first use; n_workers: how many
 * threads may run it at once. Each context keeps the 64 primitives used
 * most recently, so one stays valid at least until 63 other shapes have
 * been prepared (or fsdp_cpu_dnnl_free).
 * Call on the context's own thread, never concurrently for one *state.
 * Failure (oneDNN refused the shape, out of memory) returns the status
 * with a message. */
fsdp_status fsdp_cpu_dnnl_prepare(fsdp_cpu_dnnl **state, const fsdp_cpu_dnnl_shape *shape,
                                  int n_workers, fsdp_cpu_dnnl_prim **out);

/* Run a prepared primitive as worker `worker` (0 <= worker < n_workers of
 * the prepare): thread safe across distinct workers. A and B are bf16, or
 * fp32 for a shape with f32. */
fsdp_status fsdp_cpu_dnnl_run(fsdp_cpu_dnnl *state, const fsdp_cpu_dnnl_prim *prim, int worker,
                              const void *A, const void *B, float *C);

/* oneDNN's name for the kernel a prepared primitive runs ("brg:avx512_core"). */
const char *fsdp_cpu_dnnl_impl(const fsdp_cpu_dnnl_prim *prim);

void fsdp_cpu_dnnl_free(fsdp_cpu_dnnl *state);

#endif /* FSDP_OPS_CPU_DNNL_H */
