/*
 * bench_gemm.c - OpenBLAS against oneDNN on the fp32 GEMMs of one training
 * step of bench_model's models, on one thread (--threads N: a team of N).
 *
 * Why: the fp32 step on the cpu backend is GEMM-bound, and the two libraries
 * the backend loads (blas.h) both have AVX-512 fp32 kernels; which one to
 * run is a measurement, made here on the step's own products. For every
 * linear layer of a model (its three GEMMs: y = x w^T with beta 0, dx += dy
 * w and dw += dy^T x with beta 1) the product runs through the backend's
 * own GEMM (fsdp_cpu_gemm_lib on a one-thread cpu device: gemm.c's tiles,
 * each one call of the library named: OpenBLAS cblas_sgemm, or a oneDNN
 * matmul primitive created once per tile shape). Each line: the best time of each
 * library (alternating, at least --min-ms of each), the GFLOP/s, and the
 * largest difference between their results relative to the largest
 * element. The totals weigh each GEMM by how often a step runs it (once
 * per layer; the head once).
 *
 *   build/tools/bench_gemm [--only small|gpt2|llama] [--tokens N] [--min-ms MS]
 *                          [--tiles MIN:MAX] [--threads N] [--lora R]
 *
 * --tokens replaces the model's B*T (the M of the products). The header
 * says which kernels the backend runs by default (FSDP_CPU_GEMM chooses).
 * --tiles MIN:MAX also runs each product in oneDNN under another tiling rule
 * (tiles at least MIN wide, at most MAX of them; cpu_ops.h), alternating
 * with the backend's rule, and prints its GFLOP/s and the step's total:
 * how the backend's tile sizes were chosen (gemm.c).
 * --lora R times the products of bench_model --lora R's step instead (the
 * Llama's; no weight gradients, the base being frozen) and prints the
 * step's floor (lora_floor): the fastest any fp32 LoRA step of that shape
 * can run on this core, what bounds bench_model's ratio against its peer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/clock.h"
#include "core/rng.h"
#include "device/cpu.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/registry.h"
#include "ops/cpu/blas.h"
#include "ops/ops.h"
#include "ops/cpu/cpu_ops.h"
#include "bench_cases.h"

/* A linear layer: inp (tokens, C) @ w (OC, C)^T, run n times a step. */
typedef struct linear {
    const char *name;
    int C, OC, n;
} linear;

/* The linear layers of model m (as models/gpt2.c and models/llama.c call
 * matmul_fwd/bwd); their count, at most 8. */
static int model_linears(const fsdp_model *m, linear *out)
{
    const fsdp_gpt2_config *g = fsdp_gpt2_config_of(m);
    const fsdp_llama_config *l = fsdp_llama_config_of(m);
    if (g) {
        int C = g->n_embd, L = g->n_layer;
        out[0] = (linear){"qkv", C, 3 * C, L};
        out[1] = (linear){"attn.proj", C, C, L};
        out[2] = (linear){"fc", C, 4 * C, L};
        out[3] = (linear){"fc.proj", 4 * C, C, L};
        out[4] = (linear){"head", C, g->padded_vocab_size, 1};
        return 5;
    }
    if (l) {
        int C = l->n_embd, L = l->n_layer, hd = l->head_dim;
        out[0] = (linear){"qkv", C, (l->n_head + 2 * l->n_kv_head) * hd, L};
        out[1] = (linear){"o", l->n_head * hd, C, L};
        out[2] = (linear){"gate_up", C, 2 * l->n_inter, L};
        out[3] = (linear){"down", l->n_inter, C, L};
        out[4] = (linear){"head", C, l->padded_vocab_size, 1};
        return 5;
    }
    return 0;
}

/* One product: C (M, N) = op(A) op(B) + beta C, as the matmul ops call
 * fsdp_cpu_gemm. */
typedef struct product {
    bool ta, tb;
    int M, N, K, lda, ldb, ldc;
    float beta;
} product;

/* p through the backend's GEMM on ctx (its team) in library lib, tiled
 * by rule (NULL: the backend's); its failure, if any. kernel: as
 * fsdp_cpu_gemm_lib. */
static fsdp_status run_tiled(fsdp_op_ctx *ctx, fsdp_cpu_gemm_library lib,
                             const fsdp_cpu_gemm_tiling *rule, const product *p, const float *A,
                             const float *B, float *C, const char **kernel)
{
    fsdp_cpu_gemm_lib(ctx, lib, kernel, rule, p->ta, p->tb, p->M, p->N, p->K, 1.0f, A, p->lda, B,
                      p->ldb, p->beta, C, p->ldc);
    return fsdp_cpu_ops_sync_error(ctx);
}

static fsdp_status run(fsdp_op_ctx *ctx, fsdp_cpu_gemm_library lib, const product *p,
                       const float *A, const float *B, float *C, const char **kernel)
{
    return run_tiled(ctx, lib, NULL, p, A, B, C, kernel);
}

/* run, exiting on a failure. */
static void run_ok(fsdp_op_ctx *ctx, fsdp_cpu_gemm_library lib, const product *p,
                   const float *A, const float *B, float *C)
{
    if (run(ctx, lib, p, A, B, C, NULL) != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_gemm: %s\n", fsdp_error_msg());
        exit(1);
    }
}

static float *rand_floats(size_t n, uint64_t seed)
{
    float *p = malloc(n * sizeof *p);
    if (!p) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = 2.0f * fsdp_rng_uniform(seed, 0, i) - 1.0f;
    return p;
}

/* "6x128N": how rule (NULL: the backend's) tiles p. */
static void tiles_text(const product *p, const fsdp_cpu_gemm_tiling *rule, char *out, size_t n)
{
    bool along_m;
    int tile, n_tiles;
    fsdp_cpu_gemm_tiles(p->M, p->N, p->K, rule, &along_m, &tile, &n_tiles);
    snprintf(out, n, "%dx%d%s", n_tiles, tile, along_m ? "M" : "N");
}

typedef struct totals {
    double openblas_s, onednn_s, best_s, other_s, flop;
    double top_rate; /* the fastest GFLOP/s of any product, either library */
} totals;

/* --tiles: the rule compared with the backend's (min_tile 0: none). */
static fsdp_cpu_gemm_tiling other_rule;
/* --lora R: the LoRA step's products (0: the full step's). */
static int lora_r;

/* Time product p (run n_per_step times a step) with both libraries; one
 * line; adds to t. */
static void bench_product(fsdp_op_ctx *ctx, const char *label, product p, int n_per_step,
                          double min_s, totals *t)
{
    size_t na = (size_t)p.M * p.K, nb = (size_t)p.K * p.N, nc = (size_t)p.M * p.N;
    float *A = rand_floats(na, 1), *B = rand_floats(nb, 2), *C0 = rand_floats(nc, 3);
    float *C1 = malloc(nc * sizeof *C1), *C2 = malloc(nc * sizeof *C2);
    if (!C1 || !C2) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        exit(1);
    }
    /* the two results from the same C; oneDNN where this build and CPU have it */
    memcpy(C1, C0, nc * sizeof *C1);
    memcpy(C2, C0, nc * sizeof *C2);
    run_ok(ctx, FSDP_CPU_GEMM_LIB_OPENBLAS, &p, A, B, C1);
    const char *kernel = NULL;
    char impl[48] = "";
    bool have_dnnl = run(ctx, FSDP_CPU_GEMM_LIB_ONEDNN, &p, A, B, C2, &kernel) == FSDP_STATUS_OK;
    double diff = 0, top = 0;
    if (have_dnnl) {
        snprintf(impl, sizeof impl, "%s", kernel);
        for (size_t i = 0; i < nc; i++) {
            diff = fmax(diff, fabs((double)C1[i] - C2[i]));
            top = fmax(top, fabs((double)C1[i]));
        }
    }
    fsdp_error_clear();
    bool other = have_dnnl && other_rule.min_tile > 0;
    double best_o = 1e30, best_d = 1e30, best_x = 1e30, spent_o = 0, spent_d = 0, spent_x = 0;
    for (int r = 0; r < 3 || spent_o < min_s || (have_dnnl && spent_d < min_s) ||
                    (other && spent_x < min_s);
         r++) {
        double t0 = fsdp_now_s();
        run_ok(ctx, FSDP_CPU_GEMM_LIB_OPENBLAS, &p, A, B, C1);
        double t1 = fsdp_now_s();
        if (have_dnnl)
            run_ok(ctx, FSDP_CPU_GEMM_LIB_ONEDNN, &p, A, B, C2);
        double t2 = fsdp_now_s();
        if (other && run_tiled(ctx, FSDP_CPU_GEMM_LIB_ONEDNN, &other_rule, &p, A, B, C2,
                               NULL) != FSDP_STATUS_OK) {
            fprintf(stderr, "bench_gemm: %s\n", fsdp_error_msg());
            exit(1);
        }
        double t3 = fsdp_now_s();
        spent_o += t1 - t0;
        spent_d += t2 - t1;
        spent_x += t3 - t2;
        best_o = fmin(best_o, t1 - t0);
        best_d = fmin(best_d, t2 - t1);
        best_x = fmin(best_x, t3 - t2);
    }
    double flop = 2.0 * p.M * p.N * p.K;
    char tiles[32], other_tiles[32] = "";
    tiles_text(&p, NULL, tiles, sizeof tiles);
    if (other) /* (a rule of min_tile 0 would divide by zero) */
        tiles_text(&p, &other_rule, other_tiles, sizeof other_tiles);
    printf("  %-17s %c%c %5d %5d %5d %4.0f %3d %-9s | %7.1f | ", label, p.ta ? 'T' : 'N',
           p.tb ? 'T' : 'N', p.M, p.N, p.K, p.beta, n_per_step, tiles, flop / best_o * 1e-9);
    if (have_dnnl)
        printf("%7.1f %-18s | %+6.1f%% | %.1e", flop / best_d * 1e-9,
               impl, 100.0 * (best_o / best_d - 1.0),
               top > 0 ? diff / top : diff);
    else
        printf("%7s %-18s |", "n/a", "");
    if (other)
        printf(" | %-9s %7.1f %+6.1f%%", other_tiles, flop / best_x * 1e-9,
               100.0 * (best_x / best_d - 1.0));
    printf("\n");
    fflush(stdout);
    t->openblas_s += n_per_step * best_o;
    t->onednn_s += n_per_step * (have_dnnl ? best_d : best_o);
    t->other_s += n_per_step * (other ? best_x : 0);
    t->best_s += n_per_step * (have_dnnl ? fmin(best_o, best_d) : best_o);
    t->flop += n_per_step * flop;
    t->top_rate = fmax(t->top_rate, flop / fmin(best_o, have_dnnl ? best_d : best_o) * 1e-9);
    free(A), free(B), free(C0), free(C1), free(C2);
}

/* The LoRA step's floor: its base products at their measured times (the
 * faster library each) plus the products beside them at the fastest rate
 * any product reached: the adapters' (2 FLOPs per adapter parameter and
 * token forward, 2 for their gradients and 2 for their input gradient; the
 * first block's counted at 4, though only its q|k|v skip the input
 * gradient, so the count stays below the work) and attention's (its causal
 * blocks, forward and backward). Everything else in the step (norms,
 * SwiGLU, rope, softmax, cross-entropy, copies) counted as free: no step
 * of this shape on this core can run faster. */
static void lora_floor(const fsdp_model *m, const fsdp_llama_config *c, const bench_case *bc,
                       const totals *t)
{
    const double tokens = (double)bc->B * bc->T;
    double adapters = 0.0;
    for (int u = 1; u < m->n_units; u++)
        adapters += (u == 1 ? 4.0 : 6.0) * (double)m->units[u].train_numel * tokens;
    const double attention =
        3.0 * c->n_layer * fsdp_cpu_attention_flops(bc->B, bc->T, c->n_head, c->head_dim);
    const double rest_s = (adapters + attention) / (t->top_rate * 1e9);
    const double floor_s = t->best_s + rest_s;
    printf("  LoRA r%d step floor: base products %.1f ms + adapters' %.2f and attention's %.2f "
           "GFLOP at the fastest rate above (%.1f GFLOP/s) %.1f ms = %.1f ms, at most %.0f "
           "tok/s\n", lora_r, t->best_s * 1e3, adapters * 1e-9, attention * 1e-9, t->top_rate,
           rest_s * 1e3, floor_s * 1e3, tokens / floor_s);
}

static void bench_model_gemms(fsdp_op_ctx *ctx, const bench_case *bc, int tokens,
                              double min_s)
{
    fsdp_model m;
    if (fsdp_model_from_spec(bc->model, &m) != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_gemm: %s: %s\n", bc->model, fsdp_error_msg());
        exit(1);
    }
    const fsdp_llama_config *lc = fsdp_llama_config_of(&m);
    if (lora_r) {
        fsdp_lora_config c = bench_lora_config(lora_r);
        if (!lc) { /* the families with LoRA, as bench_model */
            fsdp_model_free(&m);
            return;
        }
        if (fsdp_model_add_lora(&m, &c) != FSDP_STATUS_OK) {
            fprintf(stderr, "bench_gemm: LoRA: %s\n", fsdp_error_msg());
            exit(1);
        }
    }
    linear lin[8];
    int n_lin = model_linears(&m, lin);
    int T = tokens > 0 ? tokens : bc->B * bc->T;
    printf("\n%s, %d tokens%s\n", bc->label, T,
           lora_r ? "; a LoRA step: the base frozen, so no dw, and no input gradient for the "
                    "first block's q|k|v (it feeds only the frozen embeddings)" : "");
    printf("  %-17s %2s %5s %5s %5s %4s %3s %-9s | %7s | %7s %-18s | %7s | %-7s", "gemm", "op",
           "M", "N", "K", "beta", "n", "tiles", "OpenBLAS", "oneDNN", "(kernel)", "oneDNN",
           "max diff");
    if (other_rule.min_tile > 0)
        printf(" | tiles %d:%d: oneDNN, time", other_rule.min_tile, other_rule.max_tiles);
    printf("\n");
    totals t = {0};
    for (int i = 0; i < n_lin; i++) {
        const linear *l = &lin[i];
        char label[64];
        snprintf(label, sizeof label, "%s fwd", l->name); /* y = x w^T */
        bench_product(ctx, label, (product){.tb = true, .M = T, .N = l->OC, .K = l->C, .lda = l->C,
                                       .ldb = l->C, .ldc = l->OC},
                      l->n, min_s, &t);
        snprintf(label, sizeof label, "%s dx", l->name); /* dx += dy w */
        bench_product(ctx, label, (product){.M = T, .N = l->C, .K = l->OC, .lda = l->OC,
                                       .ldb = l->C, .ldc = l->C, .beta = 1.0f},
                      lora_r && i == 0 ? l->n - 1 : l->n, min_s, &t);
        if (lora_r)
            continue;
        snprintf(label, sizeof label, "%s dw", l->name); /* dw += dy^T x */
        bench_product(ctx, label, (product){.ta = true, .M = l->OC, .N = l->C, .K = T, .lda = l->OC,
                                       .ldb = l->C, .ldc = l->C, .beta = 1.0f},
                      l->n, min_s, &t);
    }
    printf("  step's GEMMs (%.1f GFLOP): OpenBLAS %.1f ms (%.1f GFLOP/s), oneDNN %.1f ms "
           "(%.1f GFLOP/s): oneDNN %+.1f%%; the faster of the two per GEMM %.1f ms\n",
           t.flop * 1e-9, t.openblas_s * 1e3, t.flop / t.openblas_s * 1e-9, t.onednn_s * 1e3,
           t.flop / t.onednn_s * 1e-9, 100.0 * (t.openblas_s / t.onednn_s - 1.0),
           t.best_s * 1e3);
    if (t.other_s > 0)
        printf("  oneDNN in tiles of the backend's rule (%d:%d) %.1f ms, of %d:%d %.1f ms: "
               "%+.1f%%\n", FSDP_CPU_GEMM_TILING.min_tile, FSDP_CPU_GEMM_TILING.max_tiles,
               t.onednn_s * 1e3, other_rule.min_tile, other_rule.max_tiles, t.other_s * 1e3,
               100.0 * (t.other_s / t.onednn_s - 1.0));
    if (lora_r && tokens <= 0)
        lora_floor(&m, lc, bc, &t);
    fsdp_model_free(&m);
}

int main(int argc, char **argv)
{
    const char *only = NULL;
    int tokens = 0, threads = 1;
    double min_ms = 300;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--only") && i + 1 < argc)
            only = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-ms") && i + 1 < argc)
            min_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc && (threads = atoi(argv[++i])) > 0)
            continue;
        else if (!strcmp(argv[i], "--lora") && i + 1 < argc && (lora_r = atoi(argv[++i])) > 0)
            continue;
        else if (!strcmp(argv[i], "--tiles") && i + 1 < argc &&
                 sscanf(argv[++i], "%d:%d", &other_rule.min_tile, &other_rule.max_tiles) == 2 &&
                 other_rule.min_tile > 0 && other_rule.max_tiles > 0)
            continue;
        else
            tokens = -1; /* usage below */
    }
    if (tokens < 0 || min_ms < 0) {
        fprintf(stderr, "usage: %s [--only small|gpt2|llama] [--tokens N] [--min-ms MS] "
                "[--tiles MIN:MAX] [--threads N] [--lora R]\n", argv[0]);
        return 2;
    }
    if (fsdp_cpu_blas_status() != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_gemm: %s\n", fsdp_error_msg());
        return 1;
    }
    fsdp_device_cpu_set_threads(threads);
    printf("fp32 GEMMs of a training step, %d thread(s), tiled as the cpu backend tiles them; "
           "GFLOP/s, best of >= %.0f ms each\n", threads, min_ms);
    fsdp_cpu_print_header(stdout, 1, threads);
    printf("OpenBLAS core: %s; oneDNN: each line's kernel; op: NT = x w^T, NN = dy w, "
           "TN = dy^T x; n: runs per step\n", fsdp_cpu_blas_core());
    fsdp_device dev;
    fsdp_op_ctx ctx;
    if (fsdp_device_init(&dev, FSDP_BACKEND_CPU, NULL, 0, 0, 0) != FSDP_STATUS_OK ||
        fsdp_ops_init(&ctx, &dev, FSDP_DTYPE_F32) != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_gemm: %s\n", fsdp_error_msg());
        return 1;
    }
    for (int i = 0; i < BENCH_N_CASES; i++)
        if (!only || !strncmp(only, bench_cases[i].model, strlen(only)))
            bench_model_gemms(&ctx, &bench_cases[i], tokens, min_ms * 1e-3);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&dev);
    return 0;
}
