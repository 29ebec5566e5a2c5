/*
 * bench_train.c - training throughput and per-device peak memory of the
 * trainer on 1, 2, 4 and 8 simulated cpu devices at the same global batch,
 * against the same training step in plain PyTorch on the CPU.
 *
 * Why: `fsdp train` without a GPU runs every rank as a thread of one
 * process on the host's cores, so adding simulated devices adds sharding
 * and collective overhead but no compute; this table shows what that
 * overhead costs and how the per-device memory falls as the shards shrink.
 * The C side is the real trainer (fsdp_train_run, as `fsdp train` calls
 * it: FULL_SHARD, fp32, prefetch on, no evaluation, no output); the global
 * batch G sequences of T tokens is split G/N per device, one micro-step.
 * The PyTorch side, tools/bench_train_torch.py, runs the same model shape,
 * batch and optimizer step (clip, AdamW) in one process, once per entry of
 * --threads (default 1,2: one core, and the 2 cores the demo is sized
 * for). Both are shown because on a busy machine torch's OpenMP threads
 * spin at their barriers and 2 threads can be 10x slower than 1 (measured
 * at load average 6 on 2 cores); the last column compares with the faster.
 *
 * tokens/s is the global batch's tokens over the median step time of the
 * steps after the first (the first faults in every buffer), read from the
 * trainer's metrics log; the median keeps one descheduled step on a shared
 * machine from moving the figure. PyTorch's figure is taken the same way.
 * peak is the largest device high-water mark over the ranks (params, grads,
 * optimizer shards, gathered units, activations, collective scratch).
 *
 * Each cpu device computes with --threads-per-device threads (default 1,
 * capped at the cores as in `fsdp train`); the header says which GEMM
 * kernels ran. --cpu-streams inline,async runs each device count with the
 * device's streams inline (the default) and on their own threads
 * (device/cpu_stream.c), one row each, the async row against the inline
 * one in "vs inline". --offload puts the optimizer's state and the
 * gradients in pinned host memory (--offload optimizer); --grad-accum A
 * splits each device's share of the batch into A micro-steps. For PyTorch FSDP2 itself (fully_shard, one process per rank)
 * against `fsdp train`, see tools/bench_fsdp2_torch.py.
 *
 * Usage: bench_train [--steps N] [--batch G] [--seq T] [--model NAME]
 *                    [--devices 1,2,4,8] [--threads-per-device N] [--threads 1,2]
 *                    [--cpu-streams inline,async] [--offload] [--grad-accum A]
 *                    [--no-torch] [--python PATH]
 * The PyTorch interpreter is --python, else $FSDP_PYTHON, else the first of
 * python3 on PATH and /usr/bin/python3 that imports torch.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "device/cpu.h"
#include "models/gpt2.h"
#include "models/registry.h"
#include "ops/cpu/blas.h"
#include "train/train.h"
#include "bench_args.h"
#include "bench_run.h"
#include "bench_torch.h"

#define BENCH_MAX_LIST 16

/* Median step_ms over the steps after the first in a metrics JSONL file,
 * or 0 if it has fewer than two steps. */
static double median_step_ms(const char *path, int steps)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    double *ms = calloc((size_t)steps, sizeof *ms);
    int n = 0, line_no = 0;
    char line[4096];
    while (ms && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"step_ms\":");
        if (p && line_no++ > 0 && n < steps)
            ms[n++] = strtod(p + 10, NULL);
    }
    fclose(f);
    double med = ms ? bench_median(ms, n) : 0;
    free(ms);
    return med;
}

typedef struct bench_row {
    int devices;
    double tok_s;
    size_t peak_bytes;      /* max over ranks */
    size_t comm_bytes;      /* received per device in the last step, max over ranks */
    float last_loss;
    int ok;
} bench_row;

/* One trainer run on n cpu devices; exits with the library's message on
 * failure (a tool, not library code). */
/* What every trainer run of the table shares beyond the model and shape. */
typedef struct bench_opts {
    int threads;               /* per device */
    bool offload;
    int accum;                 /* micro-steps per step */
} bench_opts;

static bench_row bench_c(const char *model, int n, int global_batch, int seq, int steps,
                         const bench_opts *o, fsdp_cpu_streams streams)
{
    fsdp_train_config cfg;
    bench_train_config(&cfg, model, steps);
    cfg.eng.comm = FSDP_COMM_AUTO;
    cfg.eng.n_ranks = n;
    cfg.eng.batch = global_batch / (n * o->accum);
    cfg.eng.seq = seq;
    cfg.eng.grad_accum = o->accum;
    cfg.eng.offload = o->offload;
    cfg.eng.threads_per_device = o->threads;
    cfg.eng.cpu_streams = streams;
    char log_path[] = "/tmp/fsdp_bench_train_XXXXXX";
    bench_log_tmp("bench_train", log_path);
    cfg.log_path = log_path;
    fsdp_train_result res;
    fsdp_status st = fsdp_train_run(&cfg, &res);
    double ms = median_step_ms(log_path, steps);
    unlink(log_path);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "bench_train: %d device(s): %s: %s\n", n, fsdp_status_name(st),
                fsdp_error_msg());
        exit(1);
    }
    bench_row r = {.devices = n, .ok = ms > 0};
    r.tok_s = ms > 0 ? (double)global_batch * seq / (ms / 1e3) : 0;
    for (int k = 0; k < res.n_ranks; k++) {
        if (res.stats[k].peak_bytes > r.peak_bytes)
            r.peak_bytes = res.stats[k].peak_bytes;
        if (res.stats[k].comm_recv_bytes > r.comm_bytes)
            r.comm_bytes = res.stats[k].comm_recv_bytes;
    }
    r.last_loss = res.steps > 0 ? res.losses[res.steps - 1] : NAN;
    if (!isfinite(r.last_loss)) {
        fprintf(stderr, "bench_train: %d device(s): the loss is not finite\n", n);
        r.ok = 0;
    }
    fsdp_train_result_free(&res);
    return r;
}



/* PyTorch tokens/s for the same step, or 0 when torch is unavailable (its
 * output is passed through to stderr so the reason is visible). */
static double bench_torch(const char *python, const fsdp_gpt2_config *gc, int global_batch,
                          int seq, int steps, int threads, const fsdp_train_config *def)
{
    char script[PATH_MAX], cmd[1024 + PATH_MAX];
    bench_torch_script("bench_train_torch.py", script, sizeof script); /* if missing, python says so */
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=%d MKL_NUM_THREADS=%d '%s' '%s' --layers %d --heads %d "
             "--channels %d --vocab %d --padded-vocab %d --context %d --batch %d --seq %d "
             "--threads %d --steps %d --lr %g --wd %g --clip %g 2>&1",
             threads, threads, python, script, gc->n_layer, gc->n_head, gc->n_embd,
             gc->vocab_size, gc->padded_vocab_size, gc->max_seq_len, global_batch, seq, threads,
             steps, (double)def->lr, (double)def->eng.optim_hp.weight_decay, (double)def->eng.clip);
    FILE *p = popen(cmd, "r");
    if (!p)
        return 0;
    double tok_s = 0, ms, loss;
    char line[512];
    while (fgets(line, sizeof line, p)) {
        if (sscanf(line, "tokens_per_s %lf step_ms %lf loss %lf", &tok_s, &ms, &loss) != 3)
            fprintf(stderr, "  torch: %s", line);
    }
    if (pclose(p) != 0)
        return 0;
    return tok_s;
}

/* Parse "1,2,4,8" into out[] (values 1..1024); returns the count, or -1. */
static int parse_list(const char *s, int *out)
{
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1024 || n == BENCH_MAX_LIST || (*end && *end != ','))
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n > 0 ? n : -1;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--steps N] [--batch G] [--seq T] [--model NAME] [--devices 1,2,4,8]\n"
            "       [--threads-per-device N] [--threads 1,2] [--cpu-streams inline,async]\n"
            "       [--offload] [--grad-accum A] [--no-torch] [--python PATH]\n"
            "  G is the global batch in sequences, split G/N over N devices (default: the demo's, 64)\n",
            argv0);
}

int main(int argc, char **argv)
{
    fsdp_train_config def;
    fsdp_train_config_default(&def);
    /* the default demo's global batch: per-device batch x 4 simulated devices */
    int steps = 20, global_batch = def.eng.batch * 4, seq = def.eng.seq, tpd = 1;
    bool no_torch = false;
    const char *model = def.model, *python_arg = NULL, *devices = "1,2,4,8", *threads = "1,2";
    const char *streams_arg = "inline";
    bench_opts opts = {.accum = 1};
    const bench_arg args[] = {
        BENCH_FLAG("--no-torch", &no_torch),      BENCH_FLAG("--offload", &opts.offload),
        BENCH_INT("--steps", &steps),             BENCH_INT("--batch", &global_batch),
        BENCH_INT("--seq", &seq),                 BENCH_STR("--model", &model),
        BENCH_STR("--devices", &devices),         BENCH_STR("--threads", &threads),
        BENCH_INT("--threads-per-device", &tpd),  BENCH_STR("--python", &python_arg),
        BENCH_STR("--cpu-streams", &streams_arg), BENCH_INT("--grad-accum", &opts.accum),
    };
    if (!BENCH_ARGS_PARSE(argc, argv, args)) {
        usage(argv[0]);
        return 2;
    }
    opts.threads = tpd;
    if (steps < 2 || global_batch < 1 || seq < 1 || tpd < 1 || opts.accum < 1) {
        fprintf(stderr, "bench_train: need --steps >= 2 (the first is not timed), --batch, "
                        "--seq, --threads-per-device and --grad-accum >= 1\n");
        return 2;
    }
    int dev[BENCH_MAX_LIST], thr[BENCH_MAX_LIST], n_modes = 0;
    int n_dev = parse_list(devices, dev), n_thr = parse_list(threads, thr);
    fsdp_cpu_streams modes[FSDP_CPU_STREAMS_COUNT];
    char sbuf[64];
    snprintf(sbuf, sizeof sbuf, "%s", streams_arg);
    for (char *save = NULL, *tok = strtok_r(sbuf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int v;
        if (n_modes == FSDP_CPU_STREAMS_COUNT - 1 ||
            fsdp_names_parse(&fsdp_cpu_streams_names, 0, tok, &v) != FSDP_STATUS_OK) {
            fprintf(stderr, "bench_train: --cpu-streams wants inline, async or inline,async\n");
            return 2;
        }
        modes[n_modes++] = (fsdp_cpu_streams)v;
    }
    if (n_dev < 0 || n_thr < 0) {
        fprintf(stderr, "bench_train: --devices and --threads want comma lists of 1..1024, at "
                        "most %d entries, e.g. 1,2,4,8\n", BENCH_MAX_LIST);
        return 2;
    }
    fsdp_gpt2_config gc;
    fsdp_model m;
    if (fsdp_model_from_spec(model, &m) != FSDP_STATUS_OK || !fsdp_gpt2_config_of(&m)) {
        fprintf(stderr, "bench_train: %s\n", m.units ? "the PyTorch reference is a GPT-2"
                                                     : fsdp_error_msg());
        fsdp_model_free(&m);
        return 2;
    }
    gc = *fsdp_gpt2_config_of(&m);
    fsdp_model_free(&m);
    const char *python = bench_torch_python(python_arg);
    printf("fsdp train step, model %s (L%d H%d C%d V%d), global batch %d x seq %d = %d tokens, "
           "%d steps,\ncpu devices = threads of one process (FULL_SHARD, fp32, offload %s, "
           "%d micro-step(s)); PyTorch: %s, threads %s\n",
           model, gc.n_layer, gc.n_head, gc.n_embd, gc.vocab_size, global_batch, seq,
           global_batch * seq, steps, opts.offload ? "optimizer" : "none", opts.accum,
           no_torch ? "skipped" : python, threads);
    printf("cpu: %d thread(s) per device (fewer where devices x threads > cores); GEMM: %s\n", tpd,
           fsdp_cpu_blas_describe());
    if (fsdp_cpu_blas_warning())
        printf("warning: %s\n", fsdp_cpu_blas_warning());
    printf("%7s %9s %7s | %10s %8s %9s | %12s %14s | %9s\n", "devices", "batch/dev", "streams",
           "tok/s", "vs 1 dev", "vs inline", "peak/dev", "recv/dev/step", "vs torch");
    fflush(stdout);
    /* PyTorch first, so each C row can print its ratio as soon as it is done */
    double torch_row[BENCH_MAX_LIST] = {0}, torch_tok_s = 0;
    for (int i = 0; i < n_thr && !no_torch; i++) {
        torch_row[i] = bench_torch(python, &gc, global_batch, seq, steps, thr[i], &def);
        if (torch_row[i] > torch_tok_s)
            torch_tok_s = torch_row[i];
    }
    double base = 0;
    for (int i = 0; i < n_dev; i++) {
        if (global_batch % (dev[i] * opts.accum) != 0) {
            printf("%7d %9s | skipped: global batch %d does not split over %d devices x %d "
                   "micro-steps\n", dev[i], "-", global_batch, dev[i], opts.accum);
            continue;
        }
        double inline_tok_s = 0;
        for (int k = 0; k < n_modes; k++) {
            const char *mode = fsdp_names_name(&fsdp_cpu_streams_names, (int)modes[k]);
            bench_row r = bench_c(model, dev[i], global_batch, seq, steps, &opts, modes[k]);
            if (!r.ok) {
                printf("%7d %9d %7s | failed (see above)\n", dev[i], global_batch / dev[i], mode);
                continue;
            }
            if (dev[i] == 1 && base == 0)
                base = r.tok_s;
            if (modes[k] == FSDP_CPU_STREAMS_INLINE)
                inline_tok_s = r.tok_s;
            char pb[32], cb[32], vs[32] = "-", vi[32] = "-", vt[32] = "n/a";
            if (base > 0)
                snprintf(vs, sizeof vs, "%.2fx", r.tok_s / base);
            if (inline_tok_s > 0 && modes[k] != FSDP_CPU_STREAMS_INLINE)
                snprintf(vi, sizeof vi, "%.2fx", r.tok_s / inline_tok_s);
            if (torch_tok_s > 0)
                snprintf(vt, sizeof vt, "%.2fx", r.tok_s / torch_tok_s);
            printf("%7d %9d %7s | %10.0f %8s %9s | %12s %14s | %9s\n", r.devices,
                   global_batch / r.devices, mode, r.tok_s, vs, vi,
                   fsdp_fmt_bytes(pb, sizeof pb, (double)r.peak_bytes),
                   fsdp_fmt_bytes(cb, sizeof cb, (double)r.comm_bytes), vt);
            fflush(stdout);
        }
    }
    for (int i = 0; i < n_thr && torch_tok_s > 0; i++) {
        char label[32];
        snprintf(label, sizeof label, "torch %dt", thr[i]);
        if (torch_row[i] > 0)
            printf("%9s %7d %7s | %10.0f %8s %9s | %12s %14s | %8.2fx\n", label, global_batch, "",
                   torch_row[i], "", "", "-", "-", torch_row[i] / torch_tok_s);
        else
            printf("%9s %7d | failed (see above)\n", label, global_batch);
    }
    if (torch_tok_s > 0)
        printf("(vs torch: against the faster PyTorch row; torch Nt = N threads, one process)\n");
    if (!no_torch && torch_tok_s == 0)
        printf("PyTorch run failed or torch is missing (see above); try --python PATH\n");
    return 0;
}
