/*
 * plan.c - `fsdp plan`: per-device peak memory (by kind), pinned host
 * memory and collective traffic of a training configuration, measured by
 * running its real step schedule on the meta backend (train/plan.h).
 *
 * Takes train's model, data, batch, sharding, precision and offload options
 * (the shared list of cli/run_opts.h, with the same defaults, so a plan
 * describes the run `fsdp train` makes) minus the backend choice: a plan
 * always runs on meta, without a cap, and compares the peak with
 * --device-mem afterwards. Exit 0 whether or not the run fits (the report says which),
 * 1 if the plan itself fails, 2 for usage errors.
 */
#include <stdio.h>

#include "cli/cli.h"
#include "cli/run_opts.h"
#include "report/plan_report.h"

int fsdp_cli_plan(int argc, char **argv)
{
    fsdp_run_opts ro;
    fsdp_opt_list l = {0};
    fsdp_run_opts_table(&ro, &l);
    fsdp_train_config *c = &ro.cfg;
    /* meta only: the backend, transport and virtual-rank options do not apply */
    fsdp_opt_remove(&l, "backend");
    fsdp_opt_remove(&l, "comm");
    fsdp_opt_remove(&l, "ranks-per-device");
    fsdp_opt_get(&l, "device-mem")->help =
        "per-device memory to check the plan against, e.g. 24GiB (default none)";
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
    int rc = fsdp_args_parse("plan", "[options]   (runs on the meta backend: nothing is allocated "
                                     "or computed)",
                             l.v, l.n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    ro.backend = FSDP_BACKEND_META;
    if ((rc = fsdp_run_opts_finish("plan", &ro)))
        return rc;

    c->out = NULL;
    c->eval_problems = 0;
    c->log_path = NULL;
    fsdp_plan plan;
    fsdp_status st = fsdp_plan_run(c, steps, &plan);
    if (st != FSDP_STATUS_OK)
        return fsdp_cli_status("plan", st);
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
    fsdp_plan_free(&plan);
    return fsdp_cli_flush("plan");
}
