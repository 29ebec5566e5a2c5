/*
 * infer_opts.c - options shared by `fsdp eval` and `fsdp sample`.
 */
#include <stdio.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "cli/infer_opts.h"
#include "device/device.h"

int fsdp_infer_opts_table(fsdp_infer_opts *io, fsdp_opt *o)
{
    memset(io, 0, sizeof *io);
    fsdp_infer_config_default(&io->cfg);
    int n = 0;
#define OPT(name_, type_, dst_, meta_, help_) \
    o[n++] = (fsdp_opt){.name = name_, .type = type_, .dst = dst_, .metavar = meta_, .help = help_}
    static char model_help[512];
    size_t k = fsdp_modelfile_help(model_help, sizeof model_help);
    snprintf(model_help + k, sizeof model_help - k, " (required)");
    OPT("model", FSDP_OPT_STR, &io->cfg.model_path, "FILE", model_help);
    OPT("backend", FSDP_OPT_STR, &io->backend, "cpu|cuda",
        "device backend (default: cuda when a GPU is visible, else cpu)");
    OPT("devices", FSDP_OPT_INT, &io->devices, "N",
        "shard the model over N devices = ranks (default 1)");
    OPT("precision", FSDP_OPT_STR, &io->precision, "fp32|bf16", "compute dtype (default fp32)");
    OPT("device-mem", FSDP_OPT_SIZE, &io->cfg.device_mem, "BYTES",
        "per-device memory cap, e.g. 24GiB (default none)");
#undef OPT
    return n;
}

int fsdp_infer_opts_finish(const char *cmd, fsdp_infer_opts *io)
{
    fsdp_infer_config *c = &io->cfg;
    if (!c->model_path) {
        char files[256];
        fsdp_modelfile_help(files, sizeof files);
        fprintf(stderr, "fsdp %s: --model FILE is required (%s)\n", cmd, files);
        return 2;
    }
    if (io->backend) {
        if (!strcmp(io->backend, "cpu")) {
            c->backend = FSDP_BACKEND_CPU;
        } else if (!strcmp(io->backend, "cuda")) {
            c->backend = FSDP_BACKEND_CUDA;
        } else {
            fprintf(stderr, "fsdp %s: --backend: unknown value '%s' (expected cpu|cuda)\n", cmd,
                    io->backend);
            return 2;
        }
    }
    if (c->backend == FSDP_BACKEND_CUDA && fsdp_cuda_device_count() == 0) {
        fprintf(stderr, "fsdp %s: --backend cuda: no CUDA device is visible%s\n", cmd,
                fsdp_device_cuda_iface() ? "" : " (this build has no CUDA: built with CUDA=0)");
        return 2;
    }
    if (io->precision) {
        if (!strcmp(io->precision, "fp32")) {
            c->compute_dtype = FSDP_DTYPE_F32;
        } else if (!strcmp(io->precision, "bf16")) {
            c->compute_dtype = FSDP_DTYPE_BF16;
        } else {
            fprintf(stderr, "fsdp %s: --precision: unknown value '%s' (expected fp32|bf16)\n", cmd,
                    io->precision);
            return 2;
        }
    }
    if (io->devices)
        c->n_ranks = io->devices;
    if (c->n_ranks < 1 || c->n_ranks > 1024) {
        fprintf(stderr, "fsdp %s: --devices must be 1..1024 (got %d)\n", cmd, c->n_ranks);
        return 2;
    }
    if (c->backend == FSDP_BACKEND_CUDA && c->n_ranks > fsdp_cuda_device_count()) {
        fprintf(stderr, "fsdp %s: --devices %d but only %d GPU(s) are visible\n", cmd, c->n_ranks,
                fsdp_cuda_device_count());
        return 2;
    }
    return 0;
}
