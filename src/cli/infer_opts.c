/*
 * infer_opts.c - options shared by `fsdp eval` and `fsdp sample`.
 */
#include <stdio.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "cli/cli.h"
#include "cli/infer_opts.h"
#include "device/device.h"
#include "train/adapt.h"

void fsdp_infer_opts_table(fsdp_infer_opts *io, fsdp_opt_list *l)
{
    memset(io, 0, sizeof *io);
    fsdp_infer_config_default(&io->cfg);
    static char model_help[512];
    size_t k = fsdp_modelfile_help(model_help, sizeof model_help);
    snprintf(model_help + k, sizeof model_help - k, " (required)");
    fsdp_opt_add(l, "model", FSDP_OPT_STR, &io->cfg.model_path, "FILE|DIR", model_help);
    fsdp_opt_add(l, "adapter", FSDP_OPT_STR, &io->cfg.adapter, "DIR",
                 "a PEFT LoRA adapter directory (adapter_config.json + "
                 "adapter_model.safetensors) on --model");
    fsdp_opt_add_name(l, "quantize", &io->cfg.quantize, &fsdp_quant_names,
                      "with --adapter: store the base's linear weights as a QLoRA run trained "
                      "them (--quantize nf4: the NF4 round trip the adapters saw)");
    fsdp_opt_add(l, "backend", FSDP_OPT_STR, &io->backend, "cpu|cuda",
                 "device backend (default: cuda when a GPU is visible, else cpu)");
    io->devices = 1;
    fsdp_opt_add_int(l, "devices", &io->devices, 1, FSDP_MAX_RANKS, "N",
                     "shard the model over N devices = ranks (default 1)");
    fsdp_opt_add(l, "precision", FSDP_OPT_STR, &io->precision, "fp32|bf16",
                 "compute dtype (default fp32; eval of a checkpoint: its run's)");
    fsdp_opt_add(l, "device-mem", FSDP_OPT_SIZE, &io->cfg.device_mem, "BYTES",
                 "per-device memory cap, e.g. 24GiB (default none)");
    fsdp_cli_add_cpu_streams(l, &io->cfg.cpu_streams);
}

int fsdp_infer_opts_finish(const char *cmd, fsdp_infer_opts *io)
{
    fsdp_infer_config *c = &io->cfg;
    if (!c->model_path) {
        char files[256];
        fsdp_modelfile_help(files, sizeof files);
        fprintf(stderr, "fsdp %s: --model FILE|DIR is required (%s)\n", cmd, files);
        return 2;
    }
    int v;
    if (io->backend) { /* a computing backend: not meta */
        unsigned computing = FSDP_NAME_BIT(FSDP_BACKEND_CPU) | FSDP_NAME_BIT(FSDP_BACKEND_CUDA);
        if (fsdp_names_parse(&fsdp_backend_names, computing, io->backend, &v) != FSDP_STATUS_OK)
            return fsdp_cli_usage(cmd, "--backend: %s", fsdp_error_msg());
        c->backend = (fsdp_backend)v;
    }
    if (io->precision) {
        if (fsdp_names_parse(&fsdp_dtype_names, 0, io->precision, &v) != FSDP_STATUS_OK)
            return fsdp_cli_usage(cmd, "--precision: %s", fsdp_error_msg());
        c->compute_dtype = (fsdp_dtype)v;
    }
    c->n_ranks = io->devices;
    if (fsdp_cli_cpu_streams_finish(cmd, c->cpu_streams, c->backend) != 0)
        return 2;
    if (fsdp_backend_check(c->backend, c->n_ranks, 1) != FSDP_STATUS_OK)
        return fsdp_cli_usage(cmd, "%s", fsdp_error_msg());
    return 0;
}
