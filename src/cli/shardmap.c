/*
 * shardmap.c - `fsdp shardmap`: how a model's units are split over N
 * devices (unit sizes, padding, each rank's element range, and with
 * --params the parameter slices each rank owns), as a table or JSON.
 * Builds the same shard map the engine builds for a run of the same
 * --model, --lora, --freeze and --quantize (train's options): trainable,
 * frozen and NF4 parameters in their own segments; nothing is allocated.
 */
#include <stdio.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "cli/run_opts.h"
#include "engine/shardmap.h"
#include "report/plan_report.h"
#include "train/adapt.h"

int fsdp_cli_shardmap(int argc, char **argv)
{
    static char model_help[2048];
    size_t k = fsdp_modelfile_value_help(model_help, sizeof model_help);
    snprintf(model_help + k, sizeof model_help - k, " whose shape to use (default small)");
    const char *model = "small", *shard = "full";
    int devices = 4;
    bool json = false, params = false;
    fsdp_run_opts ro; /* its adapter fragment: what a run trains of --model */
    memset(&ro, 0, sizeof ro);
    fsdp_opt_list l = {.n = 0};
    fsdp_opt_add(&l, "model", FSDP_OPT_STR, &model, "NAME|SPEC|FILE", model_help);
    fsdp_opt_add(&l, "devices", FSDP_OPT_INT, &devices, "N",
                 "number of devices = ranks (default 4)");
    fsdp_opt_add(&l, "shard", FSDP_OPT_STR, &shard, "full|grad-op|none",
                 "sharding strategy (default full)");
    fsdp_run_opts_adapt_table(&ro, &l);
    fsdp_opt_add(&l, "params", FSDP_OPT_FLAG, &params, "",
                 "list the rows of every parameter each rank holds (by segment with --lora, "
                 "--freeze or NF4 weights: trainable, frozen, nf4)");
    fsdp_opt_add(&l, "json", FSDP_OPT_FLAG, &json, "",
                 "print JSON (with every parameter's shape, offset and segment) instead of a "
                 "table");
    int rc = fsdp_args_parse("shardmap", "[options]", l.v, l.n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (devices < 1 || devices > FSDP_MAX_RANKS) {
        fprintf(stderr, "fsdp shardmap: --devices must be 1..%d (got %d)\n", FSDP_MAX_RANKS,
                devices);
        return 2;
    }
    if ((rc = fsdp_run_opts_adapt_finish("shardmap", &ro)))
        return rc;
    fsdp_shard_strategy strategy;
    if (fsdp_shard_strategy_parse(shard, &strategy) != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp shardmap: --shard: %s\n", fsdp_error_msg());
        return 2;
    }
    fsdp_model m;
    fsdp_shardmap sm;
    fsdp_status st = fsdp_adapt_shape(model, &ro.cfg.lora, ro.cfg.freeze,
                                      (fsdp_quant)ro.cfg.quantize, &m);
    if (st != FSDP_STATUS_OK) { /* an unknown name or setting is a usage error, a bad file not */
        fprintf(stderr, "fsdp shardmap: --model: %s\n", fsdp_error_msg());
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    st = fsdp_shardmap_init(&sm, &m, devices, strategy);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp shardmap: error: %s\n", fsdp_error_msg());
        fsdp_model_free(&m);
        return 1;
    }
    if (json)
        fsdp_plan_shardmap_json(stdout, &sm, model);
    else
        fsdp_plan_shardmap_table(stdout, &sm, model, params);
    fsdp_shardmap_free(&sm);
    fsdp_model_free(&m);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "fsdp shardmap: error writing the output\n");
        return 1;
    }
    return 0;
}
