/*
 * main.c - the fsdp command: dispatches to subcommands, and starts the job
 * this process belongs to for the subcommands that run ranks.
 *
 * A job is one process, or several started together (by mpirun, or by
 * hand with a rendezvous directory: comm/procs.h), one per node, each
 * running --devices rank threads of one global world. For `fsdp train`,
 * main meets the job's other processes before the subcommand runs and
 * ends the job after it (fsdp_procs_init ... fsdp_procs_fini): a failure
 * in any process ends every process (under MPI through MPI_Abort, exit
 * code 1), so none waits for a dead peer. The other subcommands run in
 * one process and refuse to run as several.
 *
 * Exit codes: 0 ok, 1 runtime error, 2 usage error; fsdp train 130 or 143
 * when SIGINT or SIGTERM stopped it (in every process of its job).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "comm/procs.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    bool job;   /* runs as one process of a job of several */
    const char *help;
} commands[] = {
    {"train", fsdp_cli_train, true, "train a model (sharded across devices, nodes)"},
    {"plan", fsdp_cli_plan, false, "per-device memory and traffic of a run, without running it"},
    {"shardmap", fsdp_cli_shardmap, false, "print how a model's units are sharded over N devices"},
    {"eval", fsdp_cli_eval, false, "mean loss of a model on a data set"},
    {"sample", fsdp_cli_sample, false, "generate tokens from a model"},
    {"convert", fsdp_cli_convert, false,
     "convert between checkpoints, llm.c .bin and .safetensors"},
    {"plot", fsdp_cli_plot, false, "draw a metrics file as an SVG"},
    {"tokenize", fsdp_cli_tokenize, false,
     "tokenize a text or .jsonl corpus into llm.c token shards"},
};

static struct fsdp_procs *job_procs;

struct fsdp_procs *fsdp_cli_procs(void) { return job_procs; }

static void usage(FILE *f)
{
    fprintf(f, "usage: fsdp <command> [options]   (fsdp <command> --help for its options)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\nWith no command-line options, 'fsdp train' trains a small GPT on a built-in\n"
               "synthetic task on 4 simulated devices. Several nodes: mpirun -np NODES fsdp "
               "train\n--devices N ... (one process per node; README: several nodes).\n");
}

/* Run a subcommand that may be one process of a job: meet the others,
 * run, end the job (a failure anywhere ends every process). */
static int run_job(int i, int argc, char **argv)
{
    const char *name = commands[i].name;
    fsdp_status st = fsdp_procs_init(&job_procs, NULL);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp %s: error: %s\n", name, fsdp_error_msg());
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    int rc = commands[i].fn(argc, argv);
    /* any failure ends the whole job: a process that stopped here would
     * leave the others waiting for it (under MPI this does not return).
     * 128 + a signal is a stop the job's processes agreed on (cli/train.c),
     * so every one ends in order with that code, not as a failure. */
    fsdp_procs_fini(job_procs, rc == 0 || rc > 128 ? FSDP_STATUS_OK
                               : rc == 2           ? FSDP_STATUS_INVALID_ARG
                                                   : FSDP_STATUS_INTERNAL);
    job_procs = NULL;
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name))
            continue;
        if (commands[i].job)
            return run_job((int)i, argc - 1, argv + 1);
        int n = fsdp_procs_launched_size();
        if (n > 1) {
            fprintf(stderr, "fsdp %s: runs in one process, but it was started as one of %d "
                    "(mpirun -np %d): start it without mpirun (only fsdp train runs across "
                    "processes; fsdp plan --nodes plans such a job)\n", commands[i].name, n, n);
            return 2;
        }
        return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "fsdp: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
