/*
 * cli.h - the subcommands of the fsdp command. Each takes argv with argv[0]
 * = the subcommand name and returns the process exit code (0 ok, 1 runtime
 * error, 2 usage error).
 */
#ifndef FSDP_CLI_CLI_H
#define FSDP_CLI_CLI_H

int fsdp_cli_train(int argc, char **argv);
int fsdp_cli_plan(int argc, char **argv);
int fsdp_cli_shardmap(int argc, char **argv);
int fsdp_cli_eval(int argc, char **argv);
int fsdp_cli_sample(int argc, char **argv);
int fsdp_cli_convert(int argc, char **argv);
int fsdp_cli_plot(int argc, char **argv);
int fsdp_cli_tokenize(int argc, char **argv);

#endif /* FSDP_CLI_CLI_H */
