/*
 * plan.c - `fsdp plan`: per-device peak memory (by kind), pinned host
 * memory and collective traffic of a training configuration, measured by
 * running its real step schedule on the meta backend (train/plan.h).
 *
 * Takes train's model, batch, sharding, precision and offload options (the
 * shared table of cli/run_opts.h) minus the backend choice: a plan always
 * runs on meta, without a cap, and compares the peak with --device-mem
 * afterwards. Exit 0 whether or not the run fits (the report says which),
 * 1 if the plan itself fails, 2 for usage errors.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_opts.h"
#include "report/plan_report.h"

int fsdp_cli_plan(int argc, char **argv)
{
    fsdp_run_opts ro;
    fsdp_opt opts[FSDP_RUN_OPTS_MAX];
    int n = fsdp_run_opts_table(&ro, opts);
    fsdp_train_config *c = &ro.cfg;
    /* meta only: the backend, communicator and virtual-rank options do not apply */
    static const char *const dropped[] = {"backend", "comm", "ranks-per-device"};
    for (size_t i = 0; i < sizeof dropped / sizeof dropped[0]; i++) {
        int k = fsdp_args_find(opts, n, dropped[i]);
        if (k >= 0) {
            memmove(&opts[k], &opts[k + 1], (size_t)(n - k - 1) * sizeof opts[0]);
            n--;
        }
    }
    int k = fsdp_args_find(opts, n, "device-mem");
    if (k >= 0)
        opts[k].help = "per-device memory to check the plan against, e.g. 24GiB (default none)";
    const char *svg = NULL;
    bool json = false;
    int steps = 2;
#define OPT(name_, type_, dst_, meta_, help_) \
    opts[n++] = (fsdp_opt){.name = name_, .type = type_, .dst = dst_, .metavar = meta_, .help = help_}
    OPT("clip", FSDP_OPT_FLOAT, &c->eng.clip, "X", "gradient-norm clip, as for train (default 1.0)");
    OPT("trace", FSDP_OPT_STR, &c->trace_path, "FILE.json",
        "write the planned steps as a Chrome trace (Perfetto, chrome://tracing)");
    OPT("svg", FSDP_OPT_STR, &svg, "OUT.svg", "draw each device's memory at its peak as stacked bars");
    OPT("json", FSDP_OPT_FLAG, &json, "", "print the plan as JSON (exact byte counts) instead of text");
    OPT("steps", FSDP_OPT_INT, &steps, "S", "steps to run on the meta backend (default 2)");
#undef OPT
    int rc = fsdp_args_parse("plan", "[options]   (runs on the meta backend: nothing is allocated "
                                     "or computed)",
                             opts, n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    /* run_opts reads --devices 0 as "the default": refuse it here */
    k = fsdp_args_find(opts, n, "devices");
    if (k >= 0 && opts[k].seen && ro.devices < 1) {
        fprintf(stderr, "fsdp plan: --devices must be 1..1024 (got %d)\n", ro.devices);
        return 2;
    }
    ro.backend = "meta";
    if ((rc = fsdp_run_opts_finish("plan", &ro)))
        return rc;
    if (steps < 1 || steps > 1000 || !(c->eng.clip >= 0)) {
        fprintf(stderr, "fsdp plan: need --steps 1..1000 and --clip >= 0\n");
        return 2;
    }
    c->out = NULL;
    c->eval_problems = 0;
    c->log_path = NULL;
    fsdp_plan plan;
    fsdp_status st = fsdp_plan_run(c, steps, &plan);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp plan: error: %s\n", fsdp_error_msg());
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    if (json)
        fsdp_plan_write_json(stdout, &plan);
    else
        fsdp_plan_print(stdout, &plan);
    if (svg) {
        st = fsdp_plan_write_svg(&plan, svg);
        if (st != FSDP_STATUS_OK) {
            fprintf(stderr, "fsdp plan: error: %s\n", fsdp_error_msg());
            fsdp_plan_free(&plan);
            return 1;
        }
        if (!json)
            printf("memory chart written to %s\n", svg);
    }
    if (c->trace_path && !json)
        printf("trace written to %s\n", c->trace_path);
    fsdp_plan_free(&plan);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "fsdp plan: error writing the report\n");
        return 1;
    }
    return 0;
}
