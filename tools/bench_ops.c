/*
 * bench_ops.c - times the cpu ops that dominate a step (matmul and
 * attention, forward + backward) on one cpu device with --threads threads,
 * to check that the GEMM kernels are used effectively (compare the GFLOP/s
 * with the machine's per-core peak: 32 fp32 FLOP/cycle with two 256-bit FMA
 * pipes, 64 with two 512-bit ones; bf16 dot products double it). The header
 * says which kernels ran. Not a test: prints one line per op and dtype.
 *
 *   build/tools/bench_ops [--threads N] [N C OC] [reps]    (default 1; 256 768 3072, 5)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "core/rng.h"
#include "device/cpu.h"
#include "ops/cpu/blas.h"
#include "ops/ops.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* n random elements in dtype dt (uniform in [-1, 1)). */
static void *rand_buf(size_t n, fsdp_dtype dt, uint64_t seed)
{
    void *p = malloc(n * fsdp_dtype_size(dt));
    if (!p) {
        fprintf(stderr, "bench_ops: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        float x = 2.0f * fsdp_rng_uniform(seed, 0, i) - 1.0f;
        if (dt == FSDP_DTYPE_BF16)
            ((fsdp_bf16 *)p)[i] = fsdp_f32_to_bf16(x);
        else
            ((float *)p)[i] = x;
    }
    return p;
}

static void bench_matmul(fsdp_dtype dt, int N, int C, int OC, int reps)
{
    fsdp_device d;
    fsdp_op_ctx ctx;
    if (fsdp_device_init(&d, FSDP_BACKEND_CPU, NULL, 0, 0, 0) != FSDP_STATUS_OK ||
        fsdp_ops_init(&ctx, &d, dt) != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_ops: %s\n", fsdp_error_msg());
        exit(1);
    }
    void *inp = rand_buf((size_t)N * C, dt, 1), *w = rand_buf((size_t)OC * C, dt, 2);
    void *bias = rand_buf(OC, dt, 3), *out = rand_buf((size_t)N * OC, dt, 4);
    float *dout = rand_buf((size_t)N * OC, FSDP_DTYPE_F32, 5);
    float *dinp = calloc((size_t)N * C, 4), *dw = calloc((size_t)OC * C, 4), *db = calloc(OC, 4);
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* first rep warms up (scratch, BLAS buffers) */
        double t0 = now_s();
        FSDP_OP(&ctx, matmul_fwd, out, inp, w, bias, N, C, OC);
        double t1 = now_s();
        FSDP_OP(&ctx, matmul_bwd, dinp, dw, db, dout, inp, w, N, C, OC);
        double t2 = now_s();
        if (r > 0) {
            fwd = t1 - t0 < fwd ? t1 - t0 : fwd;
            bwd = t2 - t1 < bwd ? t2 - t1 : bwd;
        }
    }
    double flop = 2.0 * N * C * OC;
    printf("matmul %-4s N=%d C=%d OC=%d: fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms (%.1f GFLOP/s), "
           "fwd+bwd %.2f ms\n",
           fsdp_dtype_name(dt), N, C, OC, fwd * 1e3, flop / fwd * 1e-9, bwd * 1e3,
           2 * flop / bwd * 1e-9, (fwd + bwd) * 1e3);
    free(inp), free(w), free(bias), free(out), free(dout), free(dinp), free(dw), free(db);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}

static void bench_attention(fsdp_dtype dt, int B, int T, int C, int NH, int reps)
{
    fsdp_device d;
    fsdp_op_ctx ctx;
    if (fsdp_device_init(&d, FSDP_BACKEND_CPU, NULL, 0, 0, 0) != FSDP_STATUS_OK ||
        fsdp_ops_init(&ctx, &d, dt) != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_ops: %s\n", fsdp_error_msg());
        exit(1);
    }
    size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    void *qkv = rand_buf(nq, dt, 6), *out = rand_buf(no, dt, 7), *att = rand_buf(na, dt, 8);
    float *dout = rand_buf(no, FSDP_DTYPE_F32, 9), *datt = calloc(na, 4), *dqkv = calloc(nq, 4);
    double fwd = 1e30, bwd = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now_s();
        FSDP_OP(&ctx, attention_fwd, out, att, qkv, B, T, C, NH);
        double t1 = now_s();
        FSDP_OP(&ctx, attention_bwd, dqkv, datt, dout, qkv, att, B, T, C, NH);
        double t2 = now_s();
        if (r > 0) {
            fwd = t1 - t0 < fwd ? t1 - t0 : fwd;
            bwd = t2 - t1 < bwd ? t2 - t1 : bwd;
        }
    }
    double flop = 4.0 * B * T * T * C; /* QK^T and att@V, full (unmasked) products */
    printf("attention %-4s B=%d T=%d C=%d NH=%d: fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms "
           "(%.1f GFLOP/s)\n",
           fsdp_dtype_name(dt), B, T, C, NH, fwd * 1e3, flop / fwd * 1e-9, bwd * 1e3,
           2 * flop / bwd * 1e-9);
    free(qkv), free(out), free(att), free(dout), free(datt), free(dqkv);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}

int main(int argc, char **argv)
{
    int N = 256, C = 768, OC = 3072, reps = 5, threads = 1, a = 1;
    if (argc > 2 && !strcmp(argv[1], "--threads")) {
        threads = atoi(argv[2]);
        a = 3;
    }
    if (argc - a >= 3) {
        N = atoi(argv[a]), C = atoi(argv[a + 1]), OC = atoi(argv[a + 2]);
        if (argc - a >= 4)
            reps = atoi(argv[a + 3]);
    } else if (argc - a != 0) {
        N = 0;
    }
    if (N <= 0 || C <= 0 || OC <= 0 || reps <= 0 || threads <= 0) {
        fprintf(stderr, "usage: bench_ops [--threads N] [N C OC] [reps]\n");
        return 2;
    }
    if (fsdp_cpu_blas_status() != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_ops: %s\n", fsdp_error_msg());
        return 1;
    }
    fsdp_device_cpu_set_threads(threads);
    fsdp_cpu_print_header(stdout, 1, threads);
    bench_matmul(FSDP_DTYPE_F32, N, C, OC, reps);
    bench_matmul(FSDP_DTYPE_BF16, N, C, OC, reps);
    bench_attention(FSDP_DTYPE_F32, 4, 64, 768, 12, reps);
    bench_attention(FSDP_DTYPE_BF16, 4, 64, 768, 12, reps);
    return 0;
}
