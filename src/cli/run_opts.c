/*
 * run_opts.c - options shared by `fsdp train` and `fsdp plan`.
 */
#include <stdio.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "cli/run_opts.h"
#include "models/gpt2.h"

int fsdp_run_opts_table(fsdp_run_opts *ro, fsdp_opt *o)
{
    memset(ro, 0, sizeof *ro);
    fsdp_train_config_default(&ro->cfg);
    fsdp_train_config *c = &ro->cfg;
    fsdp_engine_config *e = &c->eng;
    ro->devices = -1; /* unset: the backend's default */
    e->seq = 0;       /* unset: chosen from the data and model in fsdp_run_opts_finish */
    int n = 0;
#define OPT(name_, type_, dst_, meta_, help_) \
    o[n++] = (fsdp_opt){.name = name_, .type = type_, .dst = dst_, .metavar = meta_, .help = help_}
    OPT("backend", FSDP_OPT_STR, &ro->backend, "cpu|cuda|meta",
        "device backend (default: cuda when a GPU is visible, else cpu)");
    OPT("devices", FSDP_OPT_INT, &ro->devices, "N",
        "number of devices = ranks (default: 4 simulated cpu devices, or every GPU)");
    OPT("model", FSDP_OPT_STR, &c->model, "NAME|FILE",
        "tiny|small|gpt2|gpt2-medium|gpt2-large|gpt2-xl|custom:layers=L,heads=H,channels=C,"
        "vocab=V,context=T (default small), or a model to start from: FILE.bin (llm.c), "
        "FILE.safetensors (HF GPT-2) or a checkpoint directory");
    OPT("batch", FSDP_OPT_INT, &e->batch, "B", "sequences per micro-batch per device (default 16)");
    OPT("seq", FSDP_OPT_INT, &e->seq, "T",
        "sequence length (default: 14 on the synthetic task, one problem per row; else the "
        "model's context)");
    OPT("grad-accum", FSDP_OPT_INT, &e->grad_accum, "A", "micro-steps per device per step (default 1)");
    OPT("shard", FSDP_OPT_STR, &ro->shard, "full|grad-op|none",
        "FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2) or NO_SHARD (DDP) (default full)");
    OPT("precision", FSDP_OPT_STR, &ro->precision, "fp32|bf16",
        "compute dtype: gathered parameters and activations; master weights stay fp32 (default fp32)");
    OPT("offload", FSDP_OPT_STR, &ro->offload, "none|optimizer",
        "keep master weights, Adam state and gradient shards in pinned host memory (default none)");
    OPT("prefetch", FSDP_OPT_STR, &ro->prefetch, "on|off",
        "all-gather the next unit while computing this one (default on)");
    OPT("comm", FSDP_OPT_STR, &ro->comm, "auto|host|nccl|peer",
        "collectives: host (cpu), nccl or peer (cuda) (default auto)");
    OPT("ranks-per-device", FSDP_OPT_INT, &e->ranks_per_device, "K",
        "cuda + peer: K virtual ranks share each GPU (default 1)");
    OPT("device-mem", FSDP_OPT_SIZE, &e->device_mem, "BYTES",
        "per-device memory cap, e.g. 24GiB (default none on cpu/meta)");
    OPT("threads-per-device", FSDP_OPT_INT, &e->threads_per_device, "N",
        "cpu: threads each device computes with (default: cores / devices, at least 1; lowered "
        "if devices x N would exceed the cores)");
    OPT("seed", FSDP_OPT_U64, &e->seed, "S", "seed for initialisation and data (default 1337)");
#undef OPT
    return n;
}

static int pick(const char *cmd, const char *flag, const char *v, const char *const *names, int n,
                int *out)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v, names[i])) {
            *out = i;
            return 0;
        }
    fprintf(stderr, "fsdp %s: --%s: unknown value '%s' (expected", cmd, flag, v);
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s%s", i ? "|" : " ", names[i]);
    fprintf(stderr, ")\n");
    return 2;
}

int fsdp_run_opts_finish(const char *cmd, fsdp_run_opts *ro)
{
    fsdp_engine_config *e = &ro->cfg.eng;
    int k;
    if (ro->backend) {
        static const char *const b[] = {"cpu", "cuda", "meta"};
        if (pick(cmd, "backend", ro->backend, b, 3, &k))
            return 2;
        e->backend = (fsdp_backend)k;
        if (e->backend == FSDP_BACKEND_CUDA && fsdp_cuda_device_count() == 0) {
            fprintf(stderr, "fsdp %s: --backend cuda: no CUDA device is visible%s\n", cmd,
                    fsdp_device_cuda_iface() ? "" : " (this build has no CUDA: built with CUDA=0)");
            return 2;
        }
    }
    if (ro->devices != -1)
        e->n_ranks = ro->devices;
    else
        e->n_ranks = e->backend == FSDP_BACKEND_CUDA ? fsdp_cuda_device_count() : 4;
    if (ro->shard) {
        static const char *const s[] = {"full", "grad-op", "none"};
        if (pick(cmd, "shard", ro->shard, s, 3, &k))
            return 2;
        e->shard = (fsdp_shard_strategy)k;
    }
    if (ro->precision) {
        static const char *const p[] = {"fp32", "bf16"};
        if (pick(cmd, "precision", ro->precision, p, 2, &k))
            return 2;
        e->compute_dtype = (fsdp_dtype)k;
    }
    if (ro->offload) {
        static const char *const o[] = {"none", "optimizer"};
        if (pick(cmd, "offload", ro->offload, o, 2, &k))
            return 2;
        e->offload = k == 1;
    }
    if (ro->prefetch) {
        static const char *const p[] = {"off", "on"};
        if (pick(cmd, "prefetch", ro->prefetch, p, 2, &k))
            return 2;
        e->prefetch = k == 1;
    }
    if (ro->comm) {
        static const char *const c[] = {"auto", "host", "meta", "nccl", "peer"};
        if (pick(cmd, "comm", ro->comm, c, 5, &k))
            return 2;
        e->comm = (fsdp_comm_kind)k;
    }
    if (e->n_ranks < 1 || e->n_ranks > 1024) {
        fprintf(stderr, "fsdp %s: --devices must be 1..1024 (got %d)\n", cmd, e->n_ranks);
        return 2;
    }
    if (e->batch < 1 || e->seq < 0 || e->grad_accum < 1 || e->ranks_per_device < 1) {
        fprintf(stderr, "fsdp %s: --batch, --seq, --grad-accum and --ranks-per-device must be >= 1\n",
                cmd);
        return 2;
    }
    if (e->ranks_per_device > 1 && (e->backend != FSDP_BACKEND_CUDA || e->comm == FSDP_COMM_NCCL)) {
        fprintf(stderr, "fsdp %s: --ranks-per-device needs --backend cuda with --comm peer "
                        "(NCCL refuses two ranks on one GPU)\n", cmd);
        return 2;
    }
    if (e->threads_per_device < 0 || e->threads_per_device > 4096 ||
        (e->threads_per_device > 0 && e->backend == FSDP_BACKEND_CUDA)) {
        fprintf(stderr, "fsdp %s: --threads-per-device must be 1..4096, on the cpu backend\n",
                cmd);
        return 2;
    }
    if (e->comm == FSDP_COMM_HOST && e->backend != FSDP_BACKEND_CPU) {
        fprintf(stderr, "fsdp %s: --comm host needs --backend cpu\n", cmd);
        return 2;
    }
    if ((e->comm == FSDP_COMM_NCCL || e->comm == FSDP_COMM_PEER) && e->backend != FSDP_BACKEND_CUDA) {
        fprintf(stderr, "fsdp %s: --comm %s needs --backend cuda\n", cmd, ro->comm);
        return 2;
    }
    if (e->backend == FSDP_BACKEND_CUDA && e->n_ranks > fsdp_cuda_device_count() * e->ranks_per_device) {
        fprintf(stderr, "fsdp %s: --devices %d but only %d GPU(s) x %d rank(s) per device are available\n",
                cmd, e->n_ranks, fsdp_cuda_device_count(), e->ranks_per_device);
        return 2;
    }
    fsdp_gpt2_config gc;
    if (fsdp_modelfile_is_path(ro->cfg.model)) {
        /* a model file (fine-tuning): its header gives the shape */
        fsdp_modelfile *mf = NULL;
        if (fsdp_modelfile_open(&mf, ro->cfg.model) != FSDP_STATUS_OK) {
            fprintf(stderr, "fsdp %s: --model: %s\n", cmd, fsdp_error_msg());
            return 2;
        }
        gc = *fsdp_modelfile_config(mf);
        fsdp_modelfile_close(mf);
    } else if (fsdp_gpt2_config_parse(ro->cfg.model, &gc) != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp %s: --model: %s\n", cmd, fsdp_error_msg());
        return 2;
    }
    if (e->seq == 0) /* not given: one problem per row on the synthetic task, else the context */
        e->seq = ro->cfg.data && !strcmp(ro->cfg.data, "synthetic") && !strcmp(cmd, "train")
                     ? 14
                     : gc.max_seq_len;
    if (e->seq > gc.max_seq_len) {
        fprintf(stderr, "fsdp %s: --seq %d is longer than model '%s''s context of %d\n", cmd, e->seq,
                ro->cfg.model, gc.max_seq_len);
        return 2;
    }
    return 0;
}
