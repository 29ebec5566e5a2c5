/*
 * shardmap.c - `fsdp shardmap`: how a model's units are split over N
 * devices (unit sizes, padding, each rank's element range, and with
 * --params the parameter slices each rank owns), as a table or JSON.
 * Builds the same shard map the engine builds; nothing is allocated.
 */
#include <stdio.h>
#include <string.h>

#include "ckpt/modelfile.h"
#include "cli/args.h"
#include "cli/cli.h"
#include "engine/shardmap.h"
#include "report/plan_report.h"

int fsdp_cli_shardmap(int argc, char **argv)
{
    static char model_help[2048];
    size_t k = fsdp_modelfile_value_help(model_help, sizeof model_help);
    snprintf(model_help + k, sizeof model_help - k, " whose shape to use (default small)");
    const char *model = "small", *shard = "full";
    int devices = 4;
    bool json = false, params = false;
    fsdp_opt opts[] = {
        {.name = "model", .type = FSDP_OPT_STR, .dst = &model, .metavar = "NAME|SPEC|FILE",
         .help = model_help},
        {.name = "devices", .type = FSDP_OPT_INT, .dst = &devices, .metavar = "N",
         .help = "number of devices = ranks (default 4)"},
        {.name = "shard", .type = FSDP_OPT_STR, .dst = &shard, .metavar = "full|grad-op|none",
         .help = "sharding strategy (default full)"},
        {.name = "params", .type = FSDP_OPT_FLAG, .dst = &params, .metavar = "",
         .help = "list the rows of every parameter each rank holds"},
        {.name = "json", .type = FSDP_OPT_FLAG, .dst = &json, .metavar = "",
         .help = "print JSON (with every parameter's shape and offset) instead of a table"},
    };
    int n = (int)(sizeof opts / sizeof opts[0]);
    int rc = fsdp_args_parse("shardmap", "[options]", opts, n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (devices < 1 || devices > FSDP_MAX_RANKS) {
        fprintf(stderr, "fsdp shardmap: --devices must be 1..%d (got %d)\n", FSDP_MAX_RANKS,
                devices);
        return 2;
    }
    fsdp_shard_strategy strategy;
    if (fsdp_shard_strategy_parse(shard, &strategy) != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp shardmap: --shard: %s\n", fsdp_error_msg());
        return 2;
    }
    fsdp_model m;
    fsdp_shardmap sm;
    fsdp_status st = fsdp_modelfile_resolve(model, &m, NULL);
    if (st != FSDP_STATUS_OK) { /* an unknown name is a usage error, a bad file is not */
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
