/*
 * bench_ops.c - times the cpu ops that dominate a step (matmul and
 * attention, forward + backward) and the LoRA branch beside a linear layer
 * (lora_fwd + lora_bwd at N=2048 C=4096 r=16 OC=4096, a Llama 8B projection
 * over one 2048-token sequence; then bench_model --lora's Llama: one layer's
 * grouped-query attention and its o, gate and down adapters over 512
 * tokens, the pieces of its LoRA step beside the GEMMs) on one cpu device with --threads threads,
 * to check that the GEMM kernels are used effectively (compare the GFLOP/s
 * with the machine's per-core peak: 32 fp32 FLOP/cycle with two 256-bit FMA
 * pipes, 64 with two 512-bit ones; bf16 dot products double it). The header
 * says which kernels ran. NF4 dequantization (nf4_dequant of a 4096 x 4096
 * weight into fp32 and bf16) is memory-bound: its GB/s (code and absmax
 * bytes read + output bytes written, per second) is printed next to a copy
 * of the output's size on the same threads (cast to the same dtype, the
 * team's memmove: read + written bytes per second), the bandwidth it can
 * hope for, and next to each instruction set's kernel on one thread. Not a
 * test: prints one line per op and dtype.
 *
 *   build/tools/bench_ops [--threads N] [--op matmul|attention|lora|nf4] [N C OC] [reps]
 *       (default 1 thread, every op; 256 768 3072, 5)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "core/clock.h"
#include "core/rng.h"
#include "device/cpu.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/nf4.h"
#include "ops/ops.h"
#include "ops/optim_kernels.h"

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

/* A cpu device and its op context for dt; exits on failure. */
static void open_ctx(fsdp_device *d, fsdp_op_ctx *ctx, fsdp_dtype dt)
{
    if (fsdp_device_init(d, FSDP_BACKEND_CPU, NULL, 0, 0, 0) != FSDP_STATUS_OK ||
        fsdp_ops_init(ctx, d, dt) != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_ops: %s\n", fsdp_error_msg());
        exit(1);
    }
}

/* The best forward and backward times of reps passes, after one untimed
 * pass that warms up (scratch, BLAS buffers); fwd and bwd run one op each
 * on args. */
static void best_times(int reps, void (*fwd)(void *), void (*bwd)(void *), void *args,
                       double *best_fwd, double *best_bwd)
{
    *best_fwd = *best_bwd = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = fsdp_now_s();
        fwd(args);
        double t1 = fsdp_now_s();
        bwd(args);
        double t2 = fsdp_now_s();
        if (r > 0) {
            *best_fwd = t1 - t0 < *best_fwd ? t1 - t0 : *best_fwd;
            *best_bwd = t2 - t1 < *best_bwd ? t2 - t1 : *best_bwd;
        }
    }
}

struct matmul_args {
    fsdp_op_ctx *ctx;
    void *inp, *w, *bias, *out;
    float *dout, *dinp, *dw, *db;
    int N, C, OC;
};

static void matmul_fwd(void *p)
{
    struct matmul_args *a = p;
    FSDP_OP(a->ctx, matmul_fwd, a->out, a->inp, a->w, a->bias, a->N, a->C, a->OC);
}

static void matmul_bwd(void *p)
{
    struct matmul_args *a = p;
    FSDP_OP(a->ctx, matmul_bwd, a->dinp, a->dw, a->db, a->dout, a->inp, a->w, a->N, a->C, a->OC);
}

static void bench_matmul(fsdp_dtype dt, int N, int C, int OC, int reps)
{
    fsdp_device d;
    fsdp_op_ctx ctx;
    open_ctx(&d, &ctx, dt);
    struct matmul_args a = {
        .ctx = &ctx, .N = N, .C = C, .OC = OC,
        .inp = rand_buf((size_t)N * C, dt, 1), .w = rand_buf((size_t)OC * C, dt, 2),
        .bias = rand_buf(OC, dt, 3), .out = rand_buf((size_t)N * OC, dt, 4),
        .dout = rand_buf((size_t)N * OC, FSDP_DTYPE_F32, 5), .dinp = calloc((size_t)N * C, 4),
        .dw = calloc((size_t)OC * C, 4), .db = calloc(OC, 4)};
    double fwd, bwd;
    best_times(reps, matmul_fwd, matmul_bwd, &a, &fwd, &bwd);
    double flop = 2.0 * N * C * OC;
    printf("matmul %-4s N=%d C=%d OC=%d: fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms (%.1f GFLOP/s), "
           "fwd+bwd %.2f ms\n",
           fsdp_dtype_name(dt), N, C, OC, fwd * 1e3, flop / fwd * 1e-9, bwd * 1e3,
           2 * flop / bwd * 1e-9, (fwd + bwd) * 1e3);
    free(a.inp), free(a.w), free(a.bias), free(a.out), free(a.dout), free(a.dinp), free(a.dw),
        free(a.db);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}

struct lora_args {
    fsdp_op_ctx *ctx;
    void *inp, *A, *B, *out, *u;
    float *dout, *dinp, *dA, *dB, *dv;
    int N, C, r, OC;
};

static void lora_fwd(void *p)
{
    struct lora_args *a = p;
    FSDP_OP(a->ctx, lora_fwd, a->out, a->OC, a->u, a->r, a->inp, a->A, a->B, 2.0f, a->N, a->C,
            a->r, a->OC);
}

static void lora_bwd(void *p)
{
    struct lora_args *a = p;
    FSDP_OP(a->ctx, lora_bwd, a->dinp, a->dA, a->dB, a->dv, a->r, a->dout, a->OC, a->inp, a->u,
            a->A, a->B, 2.0f, a->N, a->C, a->r, a->OC);
}

/* The LoRA branch alone (the base matmul of the same shape is bench_matmul's
 * with these arguments: r / min(C, OC) of its FLOPs and more). */
static void bench_lora(fsdp_dtype dt, int N, int C, int r, int OC, int reps)
{
    fsdp_device d;
    fsdp_op_ctx ctx;
    open_ctx(&d, &ctx, dt);
    struct lora_args a = {
        .ctx = &ctx, .N = N, .C = C, .r = r, .OC = OC,
        .inp = rand_buf((size_t)N * C, dt, 10), .A = rand_buf((size_t)r * C, dt, 11),
        .B = rand_buf((size_t)OC * r, dt, 12), .out = rand_buf((size_t)N * OC, dt, 13),
        .u = rand_buf((size_t)N * r, dt, 14), .dout = rand_buf((size_t)N * OC, FSDP_DTYPE_F32, 15),
        .dinp = calloc((size_t)N * C, 4), .dA = calloc((size_t)r * C, 4),
        .dB = calloc((size_t)OC * r, 4), .dv = calloc((size_t)N * r, 4)};
    double fwd, bwd;
    best_times(reps, lora_fwd, lora_bwd, &a, &fwd, &bwd);
    double flop = 2.0 * N * r * ((double)C + OC);
    printf("lora %-4s N=%d C=%d r=%d OC=%d: fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms "
           "(%.1f GFLOP/s), fwd+bwd %.2f ms\n",
           fsdp_dtype_name(dt), N, C, r, OC, fwd * 1e3, flop / fwd * 1e-9, bwd * 1e3,
           2 * flop / bwd * 1e-9, (fwd + bwd) * 1e3);
    free(a.inp), free(a.A), free(a.B), free(a.out), free(a.u), free(a.dout), free(a.dinp),
        free(a.dA), free(a.dB), free(a.dv);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}

struct attention_args {
    fsdp_op_ctx *ctx;
    void *qkv, *out, *att;
    float *dout, *datt, *dqkv;
    int B, T, NH, NKV, hd;
};

static void attention_fwd(void *p)
{
    struct attention_args *a = p;
    FSDP_OP(a->ctx, attention_gqa_fwd, a->out, a->att, a->qkv, NULL, a->B, a->T, a->NH, a->NKV,
            a->hd);
}

static void attention_bwd(void *p)
{
    struct attention_args *a = p;
    FSDP_OP(a->ctx, attention_gqa_bwd, a->dqkv, a->datt, a->dout, a->qkv, a->att, a->B, a->T,
            a->NH, a->NKV, a->hd);
}

/* NH query heads of hd channels, NKV kv heads (NKV == NH: GPT-2's attention, C = NH hd). */
static void bench_attention(fsdp_dtype dt, int B, int T, int NH, int NKV, int hd, int reps)
{
    fsdp_device d;
    fsdp_op_ctx ctx;
    open_ctx(&d, &ctx, dt);
    const int C = NH * hd;
    size_t nq = (size_t)B * T * (NH + 2 * NKV) * hd, no = (size_t)B * T * C,
           na = (size_t)B * NH * T * T;
    struct attention_args a = {
        .ctx = &ctx, .B = B, .T = T, .NH = NH, .NKV = NKV, .hd = hd,
        .qkv = rand_buf(nq, dt, 6), .out = rand_buf(no, dt, 7), .att = rand_buf(na, dt, 8),
        .dout = rand_buf(no, FSDP_DTYPE_F32, 9), .datt = calloc(na, 4), .dqkv = calloc(nq, 4)};
    double fwd, bwd;
    best_times(reps, attention_fwd, attention_bwd, &a, &fwd, &bwd);
    /* the rate of the products the causal blocks run (the full QK^T and
     * att@V would be 4 B T^2 C) */
    double flop = fsdp_cpu_attention_flops(B, T, NH, hd);
    printf("attention %-4s B=%d T=%d C=%d NH=%d NKV=%d: fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms "
           "(%.1f GFLOP/s)\n",
           fsdp_dtype_name(dt), B, T, C, NH, NKV, fwd * 1e3, flop / fwd * 1e-9, bwd * 1e3,
           2 * flop / bwd * 1e-9);
    free(a.qkv), free(a.out), free(a.att), free(a.dout), free(a.datt), free(a.dqkv);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}

struct nf4_args {
    fsdp_op_ctx *ctx;
    uint8_t *codes;
    float *absmax;
    void *out, *copy;
    size_t n;
    fsdp_cpu_isa isa; /* FSDP_CPU_ISA_COUNT: the op on the team */
};

static void nf4_run(void *p)
{
    struct nf4_args *a = p;
    if (a->isa == FSDP_CPU_ISA_COUNT)
        FSDP_OP(a->ctx, nf4_dequant, a->out, a->codes, a->absmax, a->n);
    else
        fsdp_cpu_nf4_dequant_isa(a->isa, a->out, a->ctx->dt, a->codes, a->absmax, a->n);
}

static void nf4_copy(void *p)
{
    struct nf4_args *a = p;
    FSDP_OP(a->ctx, cast, a->copy, a->ctx->dt, a->out, a->ctx->dt, a->n);
}

/* nf4_dequant of a rows x cols weight into dt against a copy of its output:
 * the op on the team, then each instruction set's kernel on this thread. */
static void bench_nf4(fsdp_dtype dt, int rows, int cols, int reps)
{
    fsdp_device d;
    fsdp_op_ctx ctx;
    open_ctx(&d, &ctx, dt);
    size_t n = (size_t)rows * cols, es = fsdp_dtype_size(dt);
    struct nf4_args a = {.ctx = &ctx, .n = n, .isa = FSDP_CPU_ISA_COUNT,
                         .codes = malloc(n / 2), .absmax = rand_buf(n / FSDP_NF4_BLOCK,
                                                                    FSDP_DTYPE_F32, 16),
                         .out = calloc(n, es), .copy = calloc(n, es)};
    if (!a.codes || !a.out || !a.copy) {
        fprintf(stderr, "bench_ops: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n / 2; i++)
        a.codes[i] = (uint8_t)fsdp_rng_u64(17, 0, i);
    double op, copy;
    best_times(reps, nf4_run, nf4_copy, &a, &op, &copy);
    double op_bytes = (double)n / 2 + (double)n / FSDP_NF4_BLOCK * 4 + (double)n * es;
    double copy_bytes = 2.0 * n * es;
    printf("nf4_dequant %-4s %dx%d: %.2f ms, %.1f GB/s (%s kernel); copy of the output "
           "%.2f ms, %.1f GB/s; %.0f%% of the copy's rate\n",
           fsdp_dtype_name(dt), rows, cols, op * 1e3, op_bytes / op * 1e-9,
           fsdp_cpu_isa_name(fsdp_cpu_isa_best()), copy * 1e3, copy_bytes / copy * 1e-9,
           100.0 * (op_bytes / op) / (copy_bytes / copy));
    for (int isa = 0; isa < FSDP_CPU_ISA_COUNT; isa++) {
        if (!fsdp_cpu_isa_supported((fsdp_cpu_isa)isa) || isa == FSDP_CPU_ISA_SSE41)
            continue; /* sse4.1 runs the scalar kernel */
        a.isa = (fsdp_cpu_isa)isa;
        double t, unused;
        best_times(reps, nf4_run, nf4_copy, &a, &t, &unused);
        printf("  %-7s kernel, 1 thread: %.2f ms, %.1f GB/s\n", fsdp_cpu_isa_name(a.isa),
               t * 1e3, op_bytes / t * 1e-9);
    }
    free(a.codes), free(a.absmax), free(a.out), free(a.copy);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&d);
}

int main(int argc, char **argv)
{
    int N = 256, C = 768, OC = 3072, reps = 5, threads = 1, a = 1;
    const char *only = NULL;
    for (;;) {
        if (argc - a >= 2 && !strcmp(argv[a], "--threads"))
            threads = atoi(argv[a + 1]);
        else if (argc - a >= 2 && !strcmp(argv[a], "--op"))
            only = argv[a + 1];
        else
            break;
        a += 2;
    }
    if (argc - a >= 3) {
        N = atoi(argv[a]), C = atoi(argv[a + 1]), OC = atoi(argv[a + 2]);
        if (argc - a >= 4)
            reps = atoi(argv[a + 3]);
    } else if (argc - a != 0) {
        N = 0;
    }
    bool known = !only || !strcmp(only, "matmul") || !strcmp(only, "attention") ||
                 !strcmp(only, "lora") || !strcmp(only, "nf4");
    if (N <= 0 || C <= 0 || OC <= 0 || reps <= 0 || threads <= 0 || !known) {
        fprintf(stderr, "usage: bench_ops [--threads N] [--op matmul|attention|lora|nf4] "
                        "[N C OC] [reps]\n");
        return 2;
    }
    if (fsdp_cpu_blas_status() != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_ops: %s\n", fsdp_error_msg());
        return 1;
    }
    fsdp_device_cpu_set_threads(threads);
    fsdp_cpu_print_header(stdout, 1, threads);
#define RUNS(name) (!only || !strcmp(only, name))
    if (RUNS("matmul")) {
        bench_matmul(FSDP_DTYPE_F32, N, C, OC, reps);
        bench_matmul(FSDP_DTYPE_BF16, N, C, OC, reps);
    }
    if (RUNS("attention")) {
        bench_attention(FSDP_DTYPE_F32, 4, 64, 12, 12, 64, reps);
        bench_attention(FSDP_DTYPE_BF16, 4, 64, 12, 12, 64, reps);
        /* a long sequence, where skipping the keys above the diagonal matters */
        bench_attention(FSDP_DTYPE_F32, 1, 1024, 12, 12, 64, reps);
        /* bench_model's Llama (grouped-query, B 2 T 256): one layer of its step */
        bench_attention(FSDP_DTYPE_F32, 2, 256, 12, 4, 64, reps);
    }
    if (RUNS("lora")) {
        bench_lora(FSDP_DTYPE_F32, 2048, 4096, 16, 4096, reps);
        bench_lora(FSDP_DTYPE_BF16, 2048, 4096, 16, 4096, reps);
        /* bench_model's Llama (512 tokens): o, gate and down adapters */
        bench_lora(FSDP_DTYPE_F32, 512, 768, 16, 768, reps);
        bench_lora(FSDP_DTYPE_F32, 512, 768, 16, 2048, reps);
        bench_lora(FSDP_DTYPE_F32, 512, 2048, 16, 768, reps);
    }
    if (RUNS("nf4")) { /* a Llama 8B projection's weight */
        bench_nf4(FSDP_DTYPE_F32, 4096, 4096, reps);
        bench_nf4(FSDP_DTYPE_BF16, 4096, 4096, reps);
    }
#undef RUNS
    return 0;
}
