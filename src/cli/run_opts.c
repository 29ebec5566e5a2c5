/*
 * run_opts.c - options shared by `fsdp train` and `fsdp plan`, so that a
 * plan describes the run `fsdp train` makes with the same options
 * (defaults included).
 *
 * Every count is bounded here, at parse time, well inside what the sizes
 * computed from it (64-bit) and the int indexes of a micro-batch hold.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "data/data.h"
#include "cli/cli.h"
#include "cli/run_opts.h"
#include "models/lora.h"
#include "train/adapt.h"

/* --model's help, from the model registry and the weight-format table. */
static const char *model_help(void)
{
    static char help[2048];
    size_t k = fsdp_modelfile_value_help(help, sizeof help);
    snprintf(help + k, sizeof help - k, " (default small; a model file also gives the starting weights)");
    return help;
}

/* Bounds of the counts (see the file comment). */
enum {
    MAX_BATCH = 1 << 16,       /* sequences per micro-batch per device */
    MAX_GRAD_ACCUM = 1 << 16,  /* micro-steps per step */
};

static const fsdp_name prefetch_names[] = {
    {"on", 1, NULL},
    {"off", 0, NULL},
};
const fsdp_name_table fsdp_prefetch_names = FSDP_NAME_TABLE(prefetch_names);

void fsdp_run_opts_adapt_table(fsdp_run_opts *ro, fsdp_opt_list *l)
{
    fsdp_train_config *c = &ro->cfg;
    ro->lora_alpha = NAN;
    fsdp_opt_add_int(l, "lora", &c->lora.r, 1, 4096, "R",
                     "train LoRA adapters of rank R on a frozen base (PEFT's LoRA: y = x W^T + "
                     "alpha/R (x A^T) B^T; A Kaiming-uniform, B zero)");
    fsdp_opt_add(l, "lora-alpha", FSDP_OPT_FLOAT, &ro->lora_alpha, "A",
                 "LoRA's alpha: the branch is scaled by alpha / R (default 2 x R)");
    fsdp_opt_add(l, "lora-targets", FSDP_OPT_STR, &ro->lora_targets, "LIST",
                 "the linear layers that get adapters, PEFT's target_modules: module names "
                 "(q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj), or all-linear "
                 "(every linear layer but the LM head) (default q_proj,v_proj)");
    fsdp_opt_add(l, "rslora", FSDP_OPT_FLAG, &c->lora.rslora, NULL,
                 "rank-stabilised LoRA: scale by alpha / sqrt(R)");
    fsdp_opt_add(l, "freeze", FSDP_OPT_STR, &c->freeze, "PATTERN[,...]",
                 "parameters not to train, by Hugging Face tensor name with * globs (e.g. "
                 "model.embed_tokens.weight,model.layers.*.mlp.*): no gradient, optimizer state "
                 "or reduction, kept in the compute dtype");
    fsdp_opt_add_name(l, "quantize", &c->quantize, &fsdp_quant_names,
                      "how frozen linear weights are stored, sharded and gathered (QLoRA: "
                      "--lora R --quantize nf4); a bnb-4bit model's are NF4 whatever this says");
}

void fsdp_run_opts_table(fsdp_run_opts *ro, fsdp_opt_list *l)
{
    memset(ro, 0, sizeof *ro);
    fsdp_train_config_default(&ro->cfg);
    fsdp_train_config *c = &ro->cfg;
    fsdp_engine_config *e = &c->eng;
    ro->backend = (int)e->backend;
    ro->shard = (int)e->shard;
    ro->precision = (int)e->compute_dtype;
    ro->offload = fsdp_offload_value(e);
    ro->prefetch = e->prefetch;
    ro->recompute = (int)e->recompute;
    ro->comm = (int)e->comm;
    ro->accum = (int)e->accum;
    ro->devices = -1; /* unset: the backend's default */
    e->seq = 0;       /* unset: chosen from the data and model in fsdp_run_opts_finish */
    /* --optimizer's values and help, from the registry */
    static char optim_names[96], optim_help[640];
    fsdp_optim_names(optim_names, sizeof optim_names, "|");
    size_t at = (size_t)snprintf(optim_help, sizeof optim_help, "the optimizer:");
    for (int i = 0; i < fsdp_optim_count() && at < sizeof optim_help; i++)
        at += (size_t)snprintf(optim_help + at, sizeof optim_help - at, "%s %s = %s",
                               i ? ";" : "", fsdp_optim_at(i)->name, fsdp_optim_at(i)->help);
    if (at < sizeof optim_help)
        snprintf(optim_help + at, sizeof optim_help - at, " (default %s)", fsdp_optim_at(0)->name);
    fsdp_opt_add_name(l, "backend", &ro->backend, &fsdp_backend_names,
                      "device backend; cuda when a GPU is visible, else cpu");
    fsdp_opt_add_int(l, "devices", &ro->devices, 1, FSDP_MAX_RANKS, "N",
                     "devices = ranks of each node (default: 4 simulated cpu devices, or every "
                     "GPU)");
    fsdp_opt_add_int(l, "nodes", &ro->nodes, 1, FSDP_MAX_RANKS, "P",
                     "nodes of the job, --devices ranks each: under mpirun one per process (the "
                     "default); in one process, P simulated nodes (hybrid sharding, traffic "
                     "between nodes)");
    fsdp_opt_add(l, "model", FSDP_OPT_STR, &c->model, "NAME|SPEC|FILE", model_help());
    fsdp_opt_add(l, "data", FSDP_OPT_STR, &c->data, "synthetic|FILE.txt|FILE.jsonl|'GLOB.bin'",
                 "training data: the built-in addition task, a text file (bytes, or tokens with "
                 "--tokenizer), .jsonl rows ({\"text\"}, or {\"prompt\",\"completion\"} and "
                 "{\"messages\"} with the loss on the completion/assistant tokens only) or llm.c "
                 "token shards (default synthetic)");
    fsdp_opt_add_int(l, "batch", &e->batch, 1, MAX_BATCH, "B",
                     "sequences per micro-batch per device (default 16)");
    fsdp_opt_add_int(l, "seq", &e->seq, 1, INT_MAX, "T",
                     "sequence length (default: 14 on the synthetic task, one problem per row; "
                     "a pre-trained model (file or directory) on .jsonl data: the smaller of its "
                     "context and 2048, or the longest example rounded up to a multiple of 64 "
                     "when shorter; else the model's context)");
    fsdp_opt_add_int(l, "grad-accum", &e->grad_accum, 1, MAX_GRAD_ACCUM, "A",
                     "micro-steps per device per step (default 1)");
    fsdp_opt_add_name(l, "accum", &ro->accum, &fsdp_accum_names,
                      "how --grad-accum sums the micro-steps' gradients");
    fsdp_opt_add_name(l, "pack", &c->pack, &fsdp_train_pack_names,
                      "example (.jsonl prompt/completion, messages) rows (fsdp plan: 'on' "
                      "counts a packed run's token positions; give its --seq)");
    fsdp_opt_add_name(l, "shard", &ro->shard, &fsdp_shard_names, "sharding strategy");
    fsdp_opt_add_name(l, "precision", &ro->precision, &fsdp_dtype_names,
                      "compute dtype: gathered parameters and activations; master weights, "
                      "gradients and optimizer state stay fp32");
    fsdp_opt_add_name(l, "offload", &ro->offload, &fsdp_offload_names,
                      "what lives in pinned host memory instead of the device");
    fsdp_opt_add_name(l, "prefetch", &ro->prefetch, &fsdp_prefetch_names,
                      "all-gather the next unit while computing this one");
    fsdp_opt_add_name(l, "recompute", &ro->recompute, &fsdp_recompute_names,
                      "activation recompute: what each block keeps from forward to backward "
                      "(same losses and parameters, bit for bit, in every mode)");
    fsdp_opt_add_name(l, "comm", &ro->comm, &fsdp_comm_kind_names,
                      "collectives' transport (it must serve --backend)");
    fsdp_opt_add_int(l, "ranks-per-device", &e->ranks_per_device, 1, FSDP_MAX_RANKS, "K",
                     "cuda + peer: K virtual ranks share each GPU (default 1)");
    fsdp_opt_add(l, "device-mem", FSDP_OPT_SIZE, &e->device_mem, "BYTES",
                 "per-device memory cap, e.g. 24GiB (default none on cpu/meta)");
    fsdp_opt_add_int(l, "threads-per-device", &e->threads_per_device, 1, 4096, "N",
                     "cpu: threads each device computes with (default: cores / devices, at least "
                     "1; lowered if devices x N would exceed the cores)");
    fsdp_cli_add_cpu_streams(l, &e->cpu_streams);
    fsdp_opt_add(l, "optimizer", FSDP_OPT_STR, &ro->optimizer, optim_names, optim_help);
    /* the optimizers' hyper-parameters, as they declare them (optim/optim.h) */
    static char flag_help[FSDP_OPTIM_MAX_FLAGS][256];
    for (int i = 0; i < fsdp_optim_flag_count(); i++) {
        ro->optim_flags[i] = NAN; /* not given: the optimizer's default */
        fsdp_opt_add(l, fsdp_optim_flag_at(i), FSDP_OPT_FLOAT, &ro->optim_flags[i], "X",
                     fsdp_optim_flag_help(fsdp_optim_flag_at(i), flag_help[i],
                                          sizeof flag_help[i]));
    }
    fsdp_run_opts_adapt_table(ro, l);
    fsdp_opt_add(l, "seed", FSDP_OPT_U64, &e->seed, "S",
                 "seed for initialisation and data (default 1337)");
}

int fsdp_run_opts_adapt_finish(const char *cmd, fsdp_run_opts *ro)
{
    fsdp_lora_config *lc = &ro->cfg.lora;
    bool given = !isnan(ro->lora_alpha) || ro->lora_targets || lc->rslora;
    if (!lc->r) {
        if (given)
            return fsdp_cli_usage(cmd, "--lora-alpha, --lora-targets and --rslora set up LoRA "
                                  "adapters: give --lora R too");
        return 0;
    }
    lc->alpha = isnan(ro->lora_alpha) ? 2.0 * lc->r : (double)ro->lora_alpha;
    snprintf(lc->targets, sizeof lc->targets, "%s",
             ro->lora_targets ? ro->lora_targets : "q_proj,v_proj");
    if (ro->lora_targets && strlen(ro->lora_targets) >= sizeof lc->targets)
        return fsdp_cli_usage(cmd, "--lora-targets is longer than %zu characters",
                              sizeof lc->targets - 1);
    if (fsdp_lora_config_check(lc) != FSDP_STATUS_OK)
        return fsdp_cli_usage(cmd, "%s", fsdp_error_msg());
    return 0;
}

int fsdp_run_opts_finish(const char *cmd, fsdp_run_opts *ro)
{
    fsdp_engine_config *e = &ro->cfg.eng;
    e->backend = (fsdp_backend)ro->backend;
    e->shard = (fsdp_shard_strategy)ro->shard;
    e->compute_dtype = (fsdp_dtype)ro->precision;
    e->offload = (ro->offload & 1) != 0;
    e->offload_params = (ro->offload & 2) != 0;
    e->prefetch = ro->prefetch != 0;
    e->recompute = (fsdp_recompute)ro->recompute;
    e->comm = (fsdp_comm_kind)ro->comm;
    e->accum = (fsdp_accum_mode)ro->accum;
    e->positions = ro->cfg.pack == FSDP_TRAIN_PACK_ON; /* else the trainer's data decides */
    if (fsdp_run_opts_adapt_finish(cmd, ro) != 0)
        return 2;
    if (fsdp_cli_cpu_streams_finish(cmd, e->cpu_streams, e->backend) != 0)
        return 2;
    if (e->threads_per_device > 0 && e->backend == FSDP_BACKEND_CUDA)
        return fsdp_cli_usage(cmd, "--threads-per-device sets the cpu backend's threads; a CUDA "
                              "device computes on its GPU (leave it out with --backend cuda)");
    int per_node = ro->devices != -1 ? ro->devices : fsdp_backend_default_devices(e->backend);
    int P = ro->n_processes > 1 ? ro->n_processes : 1;
    if (P > 1 && ro->nodes && ro->nodes != P)
        return fsdp_cli_usage(cmd, "--nodes %d, but the job has %d processes: one node per "
                              "process (leave --nodes out under mpirun)", ro->nodes, P);
    int nodes = P > 1 ? P : ro->nodes ? ro->nodes : 1;
    if ((long)per_node * nodes > FSDP_MAX_RANKS)
        return fsdp_cli_usage(cmd, "%d nodes x %d devices: at most %d ranks", nodes, per_node,
                              FSDP_MAX_RANKS);
    e->n_nodes = nodes;
    e->n_ranks = per_node * nodes;
    /* the ranks this process runs need devices here */
    if (fsdp_backend_check(e->backend, P > 1 ? per_node : e->n_ranks, e->ranks_per_device) !=
        FSDP_STATUS_OK)
        return fsdp_cli_usage(cmd, "%s", fsdp_error_msg());
    const fsdp_transport *t;
    fsdp_transport_req req = {.backend = e->backend, .kind = e->comm,
                              .ranks_per_device = e->ranks_per_device, .n_processes = P};
    if (fsdp_transport_pick(&req, &t) != FSDP_STATUS_OK)
        return fsdp_cli_usage(cmd, "%s", fsdp_error_msg());
    const fsdp_optim *o = fsdp_optim_at(0);
    if (ro->optimizer && fsdp_optim_find(ro->optimizer, &o) != FSDP_STATUS_OK)
        return fsdp_cli_usage(cmd, "--optimizer: %s", fsdp_error_msg());
    e->optim = o;
    for (int i = 0; i < fsdp_optim_flag_count(); i++) {
        const char *name = fsdp_optim_flag_at(i);
        if (isnan(ro->optim_flags[i]))
            continue;
        if (fsdp_optim_hparam_index(o, name) < 0)
            return fsdp_cli_usage(cmd, "--%s is not a setting of --optimizer %s", name, o->name);
        fsdp_optim_hparam_set(o, &e->optim_hp, name, ro->optim_flags[i]);
    }
    fsdp_optim_hparams hp;
    fsdp_optim_hparams_resolve(o, &e->optim_hp, &hp);
    if (fsdp_optim_hparams_check(o, &hp) != FSDP_STATUS_OK)
        return fsdp_cli_usage(cmd, "%s", fsdp_error_msg());
    fsdp_model m; /* the shape only: a model file is validated and closed again */
    fsdp_status st = fsdp_modelfile_resolve(ro->cfg.model, &m, NULL);
    if (st != FSDP_STATUS_OK) {
        /* a name nobody knows is a usage error; a model file that is bad is not */
        fprintf(stderr, "fsdp %s: --model: %s\n", cmd, fsdp_error_msg());
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    int context = m.max_seq_len;
    fsdp_model_free(&m);
    /* not given: one problem per row on the synthetic task, else the
     * context; the same for train and plan */
    const char *data = ro->cfg.data;
    size_t dn = data ? strlen(data) : 0;
    if (e->seq == 0 && dn > 6 && !strcmp(data + dn - 6, ".jsonl") &&
        fsdp_modelfile_format_of(ro->cfg.model)) { /* fine-tuning: the trainer may lower it */
        e->seq = context < FSDP_TRAIN_SEQ_CAP ? context : FSDP_TRAIN_SEQ_CAP;
        ro->cfg.seq_auto = true;
    }
    if (e->seq == 0)
        e->seq = data && !strcmp(data, "synthetic") ? FSDP_SYNTH_ROW : context;
    if (e->seq > context) {
        fprintf(stderr, "fsdp %s: --seq %d is longer than model '%s''s context of %d\n", cmd, e->seq,
                ro->cfg.model, context);
        return 2;
    }
    if ((int64_t)e->batch * e->seq > INT_MAX)
        return fsdp_cli_usage(cmd, "--batch %d x --seq %d = %lld tokens per micro-batch, more than "
                              "a device's batch can index (%d); lower --batch and raise "
                              "--grad-accum", e->batch, e->seq,
                              (long long)e->batch * e->seq, INT_MAX);
    return 0;
}
