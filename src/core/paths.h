/*
 * paths.h - whether a command's outputs would overwrite its inputs (or
 * each other), checked once, before anything is read or written, by every
 * subcommand through one call.
 *
 * A path argument names files by its kind: one file; the files a glob
 * names (token shards); or a tree (a model directory, a checkpoint
 * directory: the directory and the files up to two levels below it). Two
 * named files are the same when both exist and share device and inode (a
 * hard link, a symlink, "./x" and "x" all meet there); a file that does
 * not exist yet is compared by its absolute path with the directory part
 * resolved (symlinks, "." and ".."), which is all that can collide with
 * another output that does not exist yet either.
 */
#ifndef FSDP_CORE_PATHS_H
#define FSDP_CORE_PATHS_H

#include <stdbool.h>

#include "core/error.h"

typedef enum fsdp_path_kind {
    FSDP_PATH_FILE = 0, /* one file; it may not exist yet */
    FSDP_PATH_GLOB,     /* the files a glob pattern names now (none is fine) */
    FSDP_PATH_TREE,     /* a file, or a directory and the files up to two levels below it */
} fsdp_path_kind;

typedef struct fsdp_path_arg {
    const char *flag;    /* how the user gave it, for messages: "--log", "IN" */
    const char *path;    /* NULL: not given (skipped) */
    fsdp_path_kind kind;
} fsdp_path_arg;

/* OK when no output names a file that an input or another output names.
 * Otherwise INVALID_ARG naming both flags and the file: "--log 'x.jsonl'
 * is the file that --data reads; writing it would destroy that input: give
 * --log another path" ("... is 'M/a.bin', a file that --model 'M' reads"
 * for a file of a glob or tree), or "--trace 'x' and --log 'x' name the
 * same file; give each output its own path". Inputs that do not exist
 * are skipped (their readers say so); a tree is listed up to a bounded
 * number of files (those beyond are not compared). OOM. */
fsdp_status fsdp_paths_check_disjoint(const fsdp_path_arg *in, int n_in, const fsdp_path_arg *out,
                                      int n_out);

/* True when a and b both exist and are the same file (device and inode). */
bool fsdp_paths_same_file(const char *a, const char *b);

#endif /* FSDP_CORE_PATHS_H */
