/*
 * bench_model.c - forward+backward throughput of the GPT-2 and Llama models
 * on one cpu rank, against the same models in PyTorch on the CPU with one
 * thread.
 *
 * Why: the cpu backend is what `fsdp train` runs without a GPU, so its
 * per-rank speed sets how long the demo and the tests take; PyTorch on the
 * same number of threads is the yardstick (issue 14's goal: >= 1.5x at one
 * thread, fp32). The C side runs the model through its fsdp_model_i table
 * exactly as the engine does (embeddings, blocks, head with loss, blocks'
 * backward, embeddings' backward) on one cpu device with --threads threads;
 * the header says which GEMM kernels ran. The PyTorch side is
 * tools/bench_model_torch.py, run in the same invocation (same shapes,
 * padded vocabulary included, torch.set_num_threads(--threads); bf16 under
 * torch.autocast).
 *
 * Llama's goal is >= 1.2x PyTorch eager (issue 12).
 *
 * --lora R (Llama cases, fp32): the LoRA step of issue 26. The C model gets adapters of rank R
 * on every linear layer but the head (alpha 2R) on a frozen base, as `fsdp train --lora R
 * --lora-targets all-linear` runs it (gradients only for the adapters, no weight-gradient
 * GEMM of the base); each case prints the full model's step too and the LoRA step's time
 * over it (goal <= 0.75), and the peer is tools/bench_lora_torch.py: transformers'
 * LlamaForCausalLM with PEFT's LoRA of the same rank and targets (goal >= 1.3x).
 * --cpu-time (with --lora, one thread): both sides time the stepping thread's CPU time
 * instead of the wall clock, for a machine whose other load would skew either side.
 *
 * On a shared machine (a VM whose host runs other tenants) single iterations
 * slow down at random, by 10-20%, on either side. --rounds K runs each
 * case's C side and PyTorch side K times, alternating, so a slow spell
 * does not fall on one side only; --best reports each side's fastest
 * iteration over all rounds (the step's cost without interference) instead
 * of the mean.
 *
 * Usage: bench_model [--iters N] [--threads N] [--precision fp32|bf16] [--no-torch]
 *                    [--python PATH] [--only small|gpt2|llama] [--lora R [--cpu-time]]
 *                    [--rounds K] [--best]
 * The PyTorch interpreter is --python, else $FSDP_PYTHON, else the first of
 * python3 on PATH and /usr/bin/python3 that imports torch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "device/cpu.h"
#include "models/gpt2.h"
#include "models/llama.h"
#include "models/lora.h"
#include "models/registry.h"
#include "ops/cpu/blas.h"
#include "ops/ops.h"
#include "bench_args.h"
#include "bench_cases.h"
#include "bench_torch.h"

typedef struct bench_result {
    double tok_s, fwd_ms, bwd_ms;
    int ok;
} bench_result;

static void die(fsdp_status st, const char *what)
{
    fprintf(stderr, "bench_model: %s: %s: %s\n", what, fsdp_status_name(st), fsdp_error_msg());
    exit(1);
}

#define BENCH_TRY(expr, what)                 \
    do {                                      \
        fsdp_status bst_ = (expr);            \
        if (bst_ != FSDP_STATUS_OK)           \
            die(bst_, what);                  \
    } while (0)

/* --cpu-time: the calling thread's CPU time, which does every op at one thread. */
static bool cpu_clock;
/* --best: a run's fastest iteration, not the mean of its iterations. */
static bool best_of;

/* Round k's result r folded into acc (rounds 0..k-1): the faster of the two
 * under --best, else the mean over rounds (each round runs as many
 * iterations). */
static bench_result bench_fold(bench_result acc, bench_result r, int k, int tokens)
{
    if (k == 0 || !acc.ok)
        return r;
    if (!r.ok)
        return acc;
    if (best_of)
        return r.tok_s > acc.tok_s ? r : acc;
    acc.fwd_ms = (acc.fwd_ms * k + r.fwd_ms) / (k + 1);
    acc.bwd_ms = (acc.bwd_ms * k + r.bwd_ms) / (k + 1);
    acc.tok_s = 1e3 * tokens / (acc.fwd_ms + acc.bwd_ms);
    return acc;
}

static double bench_now_s(void)
{
    struct timespec ts;
    if (cpu_clock && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0)
        return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    return fsdp_now_s();
}

static bench_result bench_c(const bench_case *bc, int iters, fsdp_dtype dt, int lora_r)
{
    fsdp_device dev;
    fsdp_op_ctx ctx;
    fsdp_model m;
    BENCH_TRY(fsdp_device_init(&dev, FSDP_BACKEND_CPU, NULL, 0, 0, 0), "device");
    BENCH_TRY(fsdp_ops_init(&ctx, &dev, dt), "ops");
    BENCH_TRY(fsdp_model_from_spec(bc->model, &m), "model");
    if (lora_r) {
        fsdp_lora_config lc = bench_lora_config(lora_r);
        BENCH_TRY(fsdp_model_add_lora(&m, &lc), "LoRA");
    }
    const struct fsdp_model_i *mi = m.iface;
    void **params = calloc((size_t)m.n_units, sizeof *params);
    float **grads = calloc((size_t)m.n_units, sizeof *grads);
    for (int u = 0; u < m.n_units; u++) {
        size_t n = m.units[u].numel;
        BENCH_TRY(fsdp_device_alloc(&dev, n * fsdp_dtype_size(dt), FSDP_MEM_GATHER, "params",
                                    &params[u]),
                  "params");
        /* the trainable parameters' gradients only, as the engine hands them (a unit that
         * trains nothing still gets a buffer: NULL would mean forward only) */
        BENCH_TRY(fsdp_device_alloc(&dev, (m.units[u].train_numel + 1) * sizeof(float),
                                    FSDP_MEM_GRAD, "grads", (void **)&grads[u]),
                  "grads");
        float *p32 = malloc(n * sizeof(float));
        if (!p32)
            die(FSDP_STATUS_OOM, "params");
        fsdp_model_init_range(&m, u, 0, n, 1234, p32);
        FSDP_OP(&ctx, cast, params[u], dt, p32, FSDP_DTYPE_F32, n);
        free(p32);
    }
    void *state = NULL;
    BENCH_TRY(mi->state_init(&m, &ctx, bc->B, bc->T, true, &state), "state");
    int *tok = mi->state_tokens(state), *tgt = mi->state_targets(state);
    for (int i = 0; i < bc->B * bc->T; i++) { /* cpu device memory is host memory */
        tok[i] = (int)((i * 2654435761u) % (unsigned)m.vocab_size);
        tgt[i] = (int)((i * 40503u + 7) % (unsigned)m.vocab_size);
    }

    double fwd = 0, bwd = 0, best_fwd = 0, best_bwd = 0;
    float loss = 0;
    for (int it = -1; it < iters; it++) { /* iteration -1 warms up */
        for (int u = 0; u < m.n_units; u++)
            memset(grads[u], 0, m.units[u].train_numel * sizeof(float));
        double t0 = bench_now_s();
        BENCH_TRY(mi->root_forward(&m, &ctx, state, params[0]), "forward");
        for (int u = 1; u < m.n_units; u++)
            BENCH_TRY(mi->unit_forward(&m, &ctx, state, u, params[u]), "forward");
        double t1 = bench_now_s();
        BENCH_TRY(mi->head_forward_backward(&m, &ctx, state, params[0], grads[0], 1.0f, &loss),
                  "head");
        for (int u = m.n_units - 1; u >= 1; u--)
            BENCH_TRY(mi->unit_backward(&m, &ctx, state, u, params[u], grads[u]), "backward");
        BENCH_TRY(mi->root_backward(&m, &ctx, state, params[0], grads[0]), "backward");
        double t2 = bench_now_s();
        if (it >= 0) {
            fwd += t1 - t0;
            bwd += t2 - t1; /* the head's forward counts here: it is fused with its backward */
            if (it == 0 || t2 - t0 < best_fwd + best_bwd) {
                best_fwd = t1 - t0;
                best_bwd = t2 - t1;
            }
        }
    }
    if (best_of) {
        fwd = best_fwd;
        bwd = best_bwd;
        iters = 1;
    }
    bench_result r = {
        .tok_s = (double)bc->B * bc->T * iters / (fwd + bwd),
        .fwd_ms = 1e3 * fwd / iters,
        .bwd_ms = 1e3 * bwd / iters,
        .ok = loss > 0,
    };
    BENCH_TRY(ctx.iface->sync_error(&ctx), "ops");
    mi->state_free(&m, &ctx, state);
    for (int u = 0; u < m.n_units; u++) {
        fsdp_device_free(&dev, params[u]);
        fsdp_device_free(&dev, grads[u]);
    }
    free(params);
    free(grads);
    fsdp_model_free(&m);
    fsdp_ops_fini(&ctx);
    fsdp_device_fini(&dev);
    return r;
}


/* The PyTorch script's model arguments for the Llama model m (its own
 * function, apart from GPT-2's). */
static void llama_torch_args(const fsdp_model *m, char *buf, size_t n)
{
    const fsdp_llama_config *c = fsdp_llama_config_of(m);
    snprintf(buf, n,
             "--family llama --layers %d --heads %d --kv-heads %d --channels %d "
             "--intermediate %d --head-dim %d --vocab %d --padded-vocab %d --context %d "
             "--rope-theta %.17g --eps %.17g%s",
             c->n_layer, c->n_head, c->n_kv_head, c->n_embd, c->n_inter, c->head_dim,
             c->vocab_size, c->padded_vocab_size, c->max_seq_len, c->rope.theta, c->norm_eps,
             c->tied ? " --tied" : "");
}

static bench_result bench_torch(const bench_case *bc, int iters, const char *python,
                                int threads, fsdp_dtype dt, int lora_r)
{
    bench_result r = {0};
    fsdp_model m;
    BENCH_TRY(fsdp_model_from_spec(bc->model, &m), "config");
    char args[560];
    if (lora_r && !fsdp_llama_config_of(&m))
        die(fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--lora: %s is not a Llama", bc->model),
            "the PyTorch + PEFT reference");
    if (fsdp_llama_config_of(&m)) {
        if (fsdp_llama_config_of(&m)->qkv_bias || fsdp_llama_config_of(&m)->rope.type)
            die(fsdp_error_set(FSDP_STATUS_INVALID_ARG, "the PyTorch Llama has no biases and "
                               "default rope: %s", bc->model), "the PyTorch reference");
        llama_torch_args(&m, args, sizeof args - 32);
        if (lora_r)
            snprintf(args + strlen(args), 32, " --lora %d", lora_r);
    } else if (fsdp_gpt2_config_of(&m)) {
        fsdp_gpt2_config cfg = *fsdp_gpt2_config_of(&m);
        snprintf(args, sizeof args,
                 "--layers %d --heads %d --channels %d --vocab %d --padded-vocab %d --context %d",
                 cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.padded_vocab_size,
                 cfg.max_seq_len);
    } else {
        die(fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s has no PyTorch reference", bc->model),
            "the PyTorch reference");
    }
    fsdp_model_free(&m);
    char script[PATH_MAX], cmd[1024 + PATH_MAX];
    bench_torch_script(lora_r ? "bench_lora_torch.py" : "bench_model_torch.py", script,
                       sizeof script); /* if missing, python says so */
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=%d MKL_NUM_THREADS=%d '%s' '%s' %s --batch %d --seq %d "
             "--iters %d --warmup 1 --threads %d --dtype %s%s%s 2>&1",
             threads, threads, python, script, args, bc->B, bc->T, iters, threads,
             fsdp_dtype_name(dt), cpu_clock ? " --clock cpu" : "", best_of ? " --stat best" : "");
    FILE *p = popen(cmd, "r");
    if (!p)
        return r;
    char line[512];
    while (fgets(line, sizeof line, p)) {
        if (sscanf(line, "tokens_per_s %lf fwd_ms %lf bwd_ms %lf", &r.tok_s, &r.fwd_ms,
                   &r.bwd_ms) == 3)
            r.ok = 1;
        else
            fprintf(stderr, "  torch: %s", line);
    }
    if (pclose(p) != 0)
        r.ok = 0;
    return r;
}


int main(int argc, char **argv)
{
    int iters = 0, threads = 1, lora_r = 0, rounds = 1;
    bool no_torch = false;
    const char *python_arg = NULL, *only = NULL, *precision = "fp32";
    const bench_arg args[] = {
        BENCH_INT("--iters", &iters),       BENCH_INT("--threads", &threads),
        BENCH_STR("--precision", &precision), BENCH_FLAG("--no-torch", &no_torch),
        BENCH_STR("--python", &python_arg), BENCH_STR("--only", &only),
        BENCH_INT("--lora", &lora_r),       BENCH_FLAG("--cpu-time", &cpu_clock),
        BENCH_INT("--rounds", &rounds),     BENCH_FLAG("--best", &best_of),
    };
    if (!BENCH_ARGS_PARSE(argc, argv, args))
        threads = 0; /* usage below */
    fsdp_dtype dt = !strcmp(precision, "bf16") ? FSDP_DTYPE_BF16 : FSDP_DTYPE_F32;
    if (threads < 1 || (dt == FSDP_DTYPE_F32 && strcmp(precision, "fp32")) || lora_r < 0 ||
        (lora_r && dt != FSDP_DTYPE_F32) || (cpu_clock && (!lora_r || threads != 1)) ||
        rounds < 1) {
        fprintf(stderr,
                "usage: %s [--iters N] [--threads N] [--precision fp32|bf16] [--no-torch]\n"
                "       [--python PATH] [--only small|gpt2|llama] [--lora R (fp32)]\n"
                "       [--cpu-time (with --lora, --threads 1)] [--rounds K] [--best]\n",
                argv[0]);
        return 2;
    }
    if (fsdp_cpu_blas_status() != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_model: %s\n", fsdp_error_msg());
        return 1;
    }
    const char *python = no_torch ? "skipped" : bench_torch_python(python_arg);
    fsdp_device_cpu_set_threads(threads);
    printf("forward+backward, one cpu rank, %s, %d thread(s) (torch: %s)%s%s; %s\n",
           fsdp_dtype_name(dt), threads, python,
           lora_r ? "; LoRA on every linear layer but the head (torch: + PEFT)" : "",
           cpu_clock ? "; thread CPU time, not wall" : "",
           best_of ? "each side's fastest iteration" : "means over iterations");
    if (rounds > 1)
        printf("%d rounds per case, C and PyTorch alternating\n", rounds);
    fsdp_cpu_print_header(stdout, 1, threads);
    printf("%-26s %4s %5s | %12s %9s %9s | %12s %9s %9s | %6s\n", "model", "B", "T", "C tok/s",
           "fwd ms", "bwd ms", "torch tok/s", "fwd ms", "bwd ms", "ratio");
    for (int i = 0; i < BENCH_N_CASES; i++) {
        const bench_case *bc = &bench_cases[i];
        if (only && strncmp(only, bc->model, strlen(only)) != 0)
            continue;
        if (lora_r && strncmp(bc->model, "llama", 5))
            continue; /* the families with LoRA */
        int it = iters > 0 ? iters : bc->iters, tokens = bc->B * bc->T;
        bench_result full = {0}, c = {0}, t = {0};
        for (int k = 0; k < rounds; k++) {
            if (lora_r)
                full = bench_fold(full, bench_c(bc, it, dt, 0), k, tokens);
            c = bench_fold(c, bench_c(bc, it, dt, lora_r), k, tokens);
            if (!no_torch)
                t = bench_fold(t, bench_torch(bc, it, python, threads, dt, lora_r), k, tokens);
        }
        if (lora_r)
            printf("%-26s %4d %5d | %12.0f %9.1f %9.1f | (the full model's step)\n", bc->label,
                   bc->B, bc->T, full.tok_s, full.fwd_ms, full.bwd_ms);
        char label[64];
        snprintf(label, sizeof label, lora_r ? "%.19s + LoRA r%d" : "%s", bc->label, lora_r);
        printf("%-26s %4d %5d | %12.0f %9.1f %9.1f | ", label, bc->B, bc->T, c.tok_s,
               c.fwd_ms, c.bwd_ms);
        if (t.ok)
            printf("%12.0f %9.1f %9.1f | %5.2fx\n", t.tok_s, t.fwd_ms, t.bwd_ms,
                   c.tok_s / t.tok_s);
        else
            printf("%12s %9s %9s | %6s\n", "n/a", "", "", "");
        if (lora_r)
            printf("  LoRA step / full step: %.2f of the time\n", full.tok_s / c.tok_s);
        fflush(stdout);
    }
    return 0;
}
