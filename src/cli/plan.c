/*
 * plan.c - `fsdp plan`: per-device peak memory (by kind), pinned host
 * memory and collective traffic of a training configuration, measured by
 * running its real step schedule on the meta backend (train/plan.h); and
 * `fsdp plan --fit`: the fastest setting that fits a memory cap, searched
 * over many such runs (train/fit.h).
 *
 * Takes train's model, data, batch, sharding, precision and offload options
 * (the shared list of cli/run_opts.h, with the same defaults, so a plan
 * describes the run `fsdp train` makes) minus the transport and
 * virtual-rank choices: a plan always runs on meta, without a cap, and
 * compares the peak with --device-mem afterwards. With --fit, --target
 * names the backend the planned run will use (cuda adds what a cuda run
 * holds beyond the engine). Exit codes: plan: 0 whether or not the run fits
 * (the report says which); --fit: 0 when a setting fits, 1 when none does;
 * both: 1 if the planning itself fails, 2 for usage errors.
 */
#include <stddef.h>
#include <stdio.h>

#include "cli/cli.h"
#include "cli/run_opts.h"
#include "report/fit_report.h"
#include "report/plan_report.h"

/* The options that set one field of the request's fsdp_machine (all but
 * node-gbs only with --fit), in --help order. */
enum { MO_MFU, MO_LINK_GBS, MO_LINK_LATENCY_US, MO_PCIE_GBS, MO_HOST_GBS, MO_NODE_GBS,
       N_MACHINE_OPTS };

/* The options only --fit reads, and the request they fill. */
struct fit_opts {
    bool fit;
    int global_batch;
    size_t host_mem;
    int target;
    size_t cuda_overhead;
    float gpu_tflops;
    float machine[N_MACHINE_OPTS]; /* machine_opts[i]; fsdp_machine holds doubles */
    int jobs, top;
};

/* Each defaults to fsdp_machine_default's value. */
static const struct machine_opt {
    const char *name, *metavar;
    size_t off; /* of a double in fsdp_machine */
    const char *help;
} machine_opts[] = {
    [MO_MFU] = {"mfu", "F", offsetof(fsdp_machine, mfu),
     "--fit: fraction of the peak the step achieves (default 0.4)"},
    [MO_LINK_GBS] = {"link-gbs", "X", offsetof(fsdp_machine, link_gbs),
     "--fit: collective bus bandwidth per device in GB/s, as nccl-tests report "
     "it (default 360: NVLink 4)"},
    [MO_LINK_LATENCY_US] = {"link-latency-us", "X", offsetof(fsdp_machine, link_latency_us),
     "--fit: time per collective call in us (default 20)"},
    [MO_PCIE_GBS] = {"pcie-gbs", "X", offsetof(fsdp_machine, pcie_gbs),
     "--fit: pinned host<->device copy bandwidth per device in GB/s (default 25)"},
    [MO_HOST_GBS] = {"host-gbs", "X", offsetof(fsdp_machine, host_gbs),
     "--fit: host memory bandwidth of the CPU optimizer, all devices, in GB/s "
     "(default 100; build/tools/bench_adam measures yours)"},
    [MO_NODE_GBS] = {"node-gbs", "X", offsetof(fsdp_machine, node_gbs),
     "with --nodes: each node's network bandwidth to the others in GB/s, each "
     "direction, for the time of the bytes between nodes (default 50: one 400 Gb/s "
     "NIC per node)"},
};

static double *machine_field(fsdp_machine *m, size_t i)
{
    return (double *)((char *)m + machine_opts[i].off);
}

static void fit_opts_table(struct fit_opts *o, fsdp_opt_list *l)
{
    fsdp_machine m;
    fsdp_machine_default(&m);
    o->target = FSDP_BACKEND_CUDA;
    for (size_t i = 0; i < N_MACHINE_OPTS; i++)
        o->machine[i] = (float)*machine_field(&m, i);
    o->top = 10;
    fsdp_opt_add(l, "fit", FSDP_OPT_FLAG, &o->fit, NULL,
                 "search micro-batch (keeping the global batch), --accum, --shard, --offload, "
                 "--prefetch and --recompute for the fastest setting that fits --device-mem; a "
                 "--accum, --shard, --recompute, "
                 "--offload or --prefetch given stays fixed. Exit 0 when a setting fits, 1 when "
                 "none does");
    fsdp_opt_add_int(l, "global-batch", &o->global_batch, 1, 1 << 30, "G",
                     "--fit: sequences per optimizer step = devices x batch x grad-accum "
                     "(default: devices x --batch x --grad-accum)");
    fsdp_opt_add(l, "host-mem", FSDP_OPT_SIZE, &o->host_mem, "BYTES",
                 "--fit: host memory the run may use: pinned memory of every device (and the "
                 "simulated devices on cpu) (default: not limited; the target machine's is not "
                 "taken to be this one's)");
    fsdp_opt_add_name(l, "target", &o->target, &fsdp_backend_names,
                      "--fit: the backend the run will use (train's --backend); cuda adds what "
                      "a cuda run holds beyond the engine (CUDA context, cuBLAS, op scratch, "
                      "NCCL) to each device")
        ->allow = FSDP_NAME_BIT(FSDP_BACKEND_CPU) | FSDP_NAME_BIT(FSDP_BACKEND_CUDA);
    fsdp_opt_add(l, "cuda-overhead", FSDP_OPT_SIZE, &o->cuda_overhead, "BYTES",
                 "--fit, cuda: what a run holds beyond the engine per device, measured "
                 "(default: the estimate of src/train/cost.h)");
    fsdp_opt_add_float(l, "gpu-tflops", &o->gpu_tflops, 0.0, true, 1e9, "X",
                       "--fit: dense peak TFLOP/s of one device at --precision, > 0 (default "
                       "67 fp32, 989 bf16: H100/H200 SXM)");
    for (size_t i = 0; i < N_MACHINE_OPTS; i++)
        fsdp_opt_add(l, machine_opts[i].name, FSDP_OPT_FLOAT, &o->machine[i],
                     machine_opts[i].metavar, machine_opts[i].help);
    fsdp_opt_add_int(l, "jobs", &o->jobs, 1, 64, "J",
                     "--fit: micro-batches searched at once (default: CPUs / devices)");
    fsdp_opt_add_int(l, "top", &o->top, 1, 1000000, "K",
                     "--fit: settings listed in the text report (default 10)");
}

/* --fit: fill the request from the parsed options and answer. */
static int run_fit(fsdp_run_opts *ro, struct fit_opts *o, fsdp_opt_list *l, bool json, int steps)
{
    fsdp_train_config *c = &ro->cfg;
    fsdp_fit_request req;
    fsdp_fit_request_default(&req);
    req.base = *c;
    req.global_batch = o->global_batch
                           ? o->global_batch
                           : c->eng.n_ranks * c->eng.batch * c->eng.grad_accum;
    req.device_mem = c->eng.device_mem;
    if (o->host_mem)
        req.host_mem = o->host_mem;
    req.backend = (fsdp_backend)o->target;
    req.cuda_overhead = o->cuda_overhead;
    req.steps = steps;
    req.jobs = o->jobs;
    fsdp_machine *m = &req.machine;
    if (o->gpu_tflops > 0) {
        if (c->eng.compute_dtype == FSDP_DTYPE_BF16)
            m->tflops_bf16 = o->gpu_tflops;
        else
            m->tflops_fp32 = o->gpu_tflops;
    }
    for (size_t i = 0; i < N_MACHINE_OPTS; i++)
        *machine_field(m, i) = o->machine[i];
    if (!(m->mfu > 0 && m->mfu <= 1) || !(m->link_gbs > 0) || !(m->link_latency_us >= 0) ||
        !(m->pcie_gbs > 0) || !(m->host_gbs > 0) || !(m->node_gbs > 0) || o->gpu_tflops < 0)
        return fsdp_cli_usage("plan", "need 0 < --mfu <= 1, --gpu-tflops, --link-gbs, "
                                      "--pcie-gbs, --host-gbs, --node-gbs > 0 and "
                                      "--link-latency-us >= 0");
    /* an accumulation mode, strategy, offload or prefetch the user named is kept fixed */
    if (fsdp_opt_get(l, "accum")->seen)
        req.accum_mask = FSDP_NAME_BIT(c->eng.accum);
    if (fsdp_opt_get(l, "shard")->seen)
        req.shard_mask = FSDP_NAME_BIT(c->eng.shard);
    if (fsdp_opt_get(l, "offload")->seen)
        req.offload_mask = FSDP_NAME_BIT(fsdp_offload_value(&c->eng));
    if (fsdp_opt_get(l, "prefetch")->seen)
        req.prefetch_mask = FSDP_NAME_BIT(c->eng.prefetch);
    if (fsdp_opt_get(l, "recompute")->seen)
        for (int k = 0; k < fsdp_fit_n_recompute_modes; k++)
            if (fsdp_fit_recompute_modes[k].value == (int)c->eng.recompute)
                req.recompute_mask = FSDP_NAME_BIT(k);
    fsdp_fit_result res;
    fsdp_status st = fsdp_fit_search(&req, &res);
    if (st != FSDP_STATUS_OK)
        return fsdp_cli_status("plan", st);
    if (json)
        fsdp_fit_write_json(stdout, &req, &res);
    else
        fsdp_fit_print(stdout, &req, &res, o->top);
    int rc = res.best >= 0 ? 0 : 1;
    fsdp_fit_free(&res);
    int flush = fsdp_cli_flush("plan");
    return flush ? flush : rc;
}

int fsdp_cli_plan(int argc, char **argv)
{
    fsdp_run_opts ro;
    fsdp_opt_list l = {0};
    fsdp_run_opts_table(&ro, &l);
    fsdp_train_config *c = &ro.cfg;
    /* meta only: the backend, transport and virtual-rank options do not apply
     * (--fit's --target names the backend the run will use) */
    fsdp_opt_remove(&l, "backend");
    fsdp_opt_remove(&l, "comm");
    fsdp_opt_remove(&l, "ranks-per-device");
    fsdp_opt_get(&l, "device-mem")->help =
        "per-device memory to check the plan against, e.g. 24GiB (default none; --fit needs it)";
    fsdp_opt_get(&l, "data")->help =
        "the data train would read; a plan reads none, but the default --seq depends on it "
        "(14 on the synthetic task, as for train; else the model's context) (default "
        "synthetic)";
    const char *svg = NULL;
    bool json = false;
    int steps = 2;
    fsdp_opt_add_float(&l, "clip", &c->eng.clip, 0.0, false, 1e6, "X",
                       "gradient-norm clip, as for train (default 1.0)");
    fsdp_opt_add(&l, "trace", FSDP_OPT_STR, &c->trace_path, "FILE.json",
                 "write the planned steps as a Chrome trace (Perfetto, chrome://tracing)");
    fsdp_opt_add(&l, "svg", FSDP_OPT_STR, &svg, "OUT.svg",
                 "draw each device's memory at its peak as stacked bars");
    fsdp_opt_add(&l, "json", FSDP_OPT_FLAG, &json, NULL,
                 "print the plan as JSON (exact byte counts) instead of text");
    fsdp_opt_add_int(&l, "steps", &steps, 1, 1000, "S",
                     "steps to run on the meta backend (default 2)");
    struct fit_opts fo = {0};
    fit_opts_table(&fo, &l);
    int rc = fsdp_args_parse("plan", "[options]   (runs on the meta backend: nothing is allocated "
                                     "or computed)",
                             l.v, l.n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    ro.backend = FSDP_BACKEND_META;
    if ((rc = fsdp_run_opts_finish("plan", &ro)))
        return rc;
    const fsdp_path_arg ins[] = {{"--model", c->model, FSDP_PATH_TREE}};
    const fsdp_path_arg outs[] = {{"--trace", c->trace_path, FSDP_PATH_FILE},
                                  {"--svg", svg, FSDP_PATH_FILE}};
    if ((rc = fsdp_cli_check_paths("plan", ins, 1, outs, 2)))
        return rc;

    c->out = NULL;
    c->eval_problems = 0;
    c->log_path = NULL;
    if (fo.fit) {
        if (svg || c->trace_path)
            return fsdp_cli_usage("plan", "--svg and --trace draw one plan; run them without "
                                          "--fit on the setting it chose");
        if (!c->eng.device_mem)
            return fsdp_cli_usage("plan", "--fit needs --device-mem BYTES: the memory of each "
                                          "device (e.g. 80GiB)");
        return run_fit(&ro, &fo, &l, json, steps);
    }
    static const char *const fit_only[] = {"global-batch", "host-mem", "target", "cuda-overhead",
                                           "gpu-tflops", "mfu", "link-gbs", "link-latency-us",
                                           "pcie-gbs", "host-gbs", "jobs", "top"};
    for (size_t i = 0; i < sizeof fit_only / sizeof fit_only[0]; i++)
        if (fsdp_opt_get(&l, fit_only[i])->seen)
            return fsdp_cli_usage("plan", "--%s is an option of --fit", fit_only[i]);
    if (!(fo.machine[MO_NODE_GBS] > 0))
        return fsdp_cli_usage("plan", "need --node-gbs > 0");
    fsdp_plan plan;
    fsdp_status st = fsdp_plan_run(c, steps, &plan);
    if (st != FSDP_STATUS_OK)
        return fsdp_cli_status("plan", st);
    plan.node_gbs = fo.machine[MO_NODE_GBS];
    if (json)
        fsdp_plan_write_json(stdout, &plan);
    else
        fsdp_plan_print(stdout, &plan);
    if (svg) {
        st = fsdp_plan_write_svg(&plan, svg);
        if (st != FSDP_STATUS_OK) {
            fsdp_plan_free(&plan);
            return fsdp_cli_status("plan", st);
        }
        if (!json)
            printf("memory chart written to %s\n", svg);
    }
    if (c->trace_path && !json)
        printf("trace written to %s\n", c->trace_path);
    if (c->seq_auto && !json) /* train lowers it once it reads the rows: a plan reads none */
        printf("seq %d: train's default on .jsonl data before it reads them; on example rows "
               "train lowers it to the\nlongest example rounded up to a multiple of %d (its "
               "header's seq: line) and packs them: give that --seq and --pack on to plan that run\n", c->eng.seq,
               FSDP_TRAIN_SEQ_ROUND);
    fsdp_plan_free(&plan);
    return fsdp_cli_flush("plan");
}
