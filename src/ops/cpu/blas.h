/*
 * blas.h - the GEMM libraries behind the cpu backend, loaded once per
 * process, and the kernel each one runs.
 *
 * fp32 products of fsdp_cpu_gemm (alpha 1, K > 0: the linear layers) go
 * through oneDNN (dnnl.c) where it has AVX-512 brgemm kernels for fp32
 * (faster than OpenBLAS's on every such GEMM of the models,
 * tools/bench_gemm.c); elsewhere, and attention's products
 * (fsdp_cpu_blas_sgemm), through OpenBLAS. The choice depends on the
 * machine and FSDP_CPU_GEMM, never (K = 0 aside) on a product's sizes, the
 * thread count or the device count.
 *
 * OpenBLAS is loaded with dlopen before main (a constructor) so that its
 * kernel ("core") can be chosen: OpenBLAS picks a core from the CPU's
 * model number when it loads, and falls back to a slow one (Prescott,
 * SSE3) on models it does not know. When its pick uses a
 * narrower instruction set than the CPU's features allow, it is loaded
 * again with OPENBLAS_CORETYPE set to the core those features call for.
 * The choice never reads model numbers, only feature bits.
 *
 * bf16 products with fp32 accumulation go through oneDNN (dnnl.c) where
 * the CPU has bf16 dot-product instructions (AVX512_BF16, AMX); elsewhere
 * bf16 operands are widened and multiplied by OpenBLAS in fp32.
 *
 * Every call made through here runs on the calling thread only (the
 * libraries' own threads are off): the cpu backend partitions work itself
 * (gemm.c), so results do not depend on the thread count.
 *
 * FSDP_CPU_GEMM (read once, before main) pins the choice:
 *   auto (default)          the above;
 *   openblas                OpenBLAS for every product (bf16 widened), core as above;
 *   openblas:CORE           that OpenBLAS core (e.g. openblas:Haswell) for every
 *                           dtype: the same bits on every machine that runs it.
 */
#ifndef FSDP_OPS_CPU_BLAS_H
#define FSDP_OPS_CPU_BLAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "core/error.h"

/* Instruction-set levels of GEMM kernels, narrowest first. */
typedef enum fsdp_cpu_gemm_isa {
    FSDP_CPU_GEMM_ISA_UNKNOWN = -1, /* a core this table does not know */
    FSDP_CPU_GEMM_ISA_SSE = 0,
    FSDP_CPU_GEMM_ISA_AVX,
    FSDP_CPU_GEMM_ISA_AVX2,        /* AVX2 + FMA */
    FSDP_CPU_GEMM_ISA_AVX512,      /* AVX-512 F/CD/BW/DQ/VL */
    FSDP_CPU_GEMM_ISA_AVX512_BF16, /* ... and AVX512_BF16 */
} fsdp_cpu_gemm_isa;

/* The widest level the running CPU (and OS) supports. */
fsdp_cpu_gemm_isa fsdp_cpu_gemm_isa_of_cpu(void);

/* The level of an OpenBLAS core name (as openblas_get_corename() spells it,
 * any case), or UNKNOWN for names this table does not list. */
fsdp_cpu_gemm_isa fsdp_cpu_openblas_core_isa(const char *core);

/* The OpenBLAS core to force when OpenBLAS picked `picked` on a CPU of
 * level `cpu`: NULL to keep its pick (it is as wide as the CPU allows, or a
 * core this table does not know, presumably newer), else the core name for
 * `cpu` (e.g. "Cooperlake" for Prescott on an AVX512_BF16 CPU). */
const char *fsdp_cpu_openblas_override(const char *picked, fsdp_cpu_gemm_isa cpu);

/* Whether the GEMM libraries loaded; if not, the reason (with what to do)
 * is set as the calling thread's error message. */
fsdp_status fsdp_cpu_blas_status(void);

/* One line for run headers: library, version and kernel for fp32 and for
 * bf16 products, e.g. "fp32: oneDNN 2.6.3 avx512_core kernels (attention:
 * OpenBLAS 0.3.21 Cooperlake kernel (AVX-512 BF16)); bf16: oneDNN 2.6.3
 * brg:avx512_core_bf16", or "fp32: OpenBLAS 0.3.21 Haswell kernel (AVX2);
 * bf16: widened to fp32 (...)". */
const char *fsdp_cpu_blas_describe(void);

/* A warning for run headers, or NULL: the kernel in use is a slow fallback
 * (this CPU has nothing faster, OpenBLAS refused the core the CPU calls
 * for, or FSDP_CPU_GEMM pins one), or a pin could not be honoured. */
const char *fsdp_cpu_blas_warning(void);

/* The OpenBLAS core running the fp32 GEMMs ("Cooperlake"), or "" if none
 * loaded. */
const char *fsdp_cpu_blas_core(void);

/* Whether bf16 GEMMs use bf16 dot-product instructions (oneDNN), rather
 * than widening to fp32. */
bool fsdp_cpu_blas_bf16_dot(void);

/* Whether fsdp_cpu_gemm's fp32 products run in oneDNN rather than
 * OpenBLAS (fp32 brgemm kernels available, FSDP_CPU_GEMM not pinning
 * OpenBLAS). */
bool fsdp_cpu_blas_f32_dnnl(void);

/* fsdp_cpu_print_header (header.c) is declared in ops/ops.h: the trainer
 * prints it without reaching into the backend. */

/* Row-major single-threaded sgemm on the calling thread:
 * C (M, N) = alpha op(A) op(B) + beta C; op(A) is (M, K): A is (M, K) with
 * row stride lda, or (K, M) when ta; op(B) is (K, N): B is (K, N), or (N, K)
 * when tb. Requires fsdp_cpu_blas_status() == OK. */
void fsdp_cpu_blas_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif /* FSDP_OPS_CPU_BLAS_H */
