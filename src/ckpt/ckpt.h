/*
 * ckpt.h - sharded training checkpoints: the directory layout, the manifest
 * and the per-rank shard files. Knows nothing about engines or devices: the
 * engine side (src/fsdp/engine_ckpt.c) feeds it host buffers.
 *
 * Layout of a checkpoint directory (all names fixed):
 *
 *   DIR/step_00000010/manifest        text, `key value` lines (below)
 *   DIR/step_00000010/rank_00000.bin  rank 0's shards of every unit
 *   ...                               one file per rank of the writing world
 *   DIR/step_00000010/DONE            written last
 *
 * Atomicity: a checkpoint is written into DIR/step_00000010.tmp; every file
 * in it is fsynced, then DONE is written and fsynced, the directory is
 * fsynced and renamed to its final name, and DIR is fsynced. Only
 * directories named exactly step_<digits> that contain DONE are complete;
 * anything else (a *.tmp left by a crash, a *.old being deleted, a step
 * directory without DONE) is ignored by fsdp_ckpt_latest, and *.tmp / *.old
 * are removed by the next fsdp_ckpt_begin. A crash at any point therefore
 * leaves every earlier complete checkpoint loadable.
 *
 * Shard file (little-endian):
 *   header, 64 bytes: "FSDPCKPT", u32 version (1), u32 header bytes (64),
 *     u32 rank, u32 world size, u32 unit count, u32 block numel,
 *     u64 run id, u64 step, u64 Adam step count t, u64 header checksum
 *     (over the header with this field zero, the unit table and the
 *     checksum table);
 *   unit table: per unit u64 shard numel S, u64 first element of the shard
 *     in the unit's padded flat buffer;
 *   checksum table: per unit, per array (master, Adam m, Adam v), one u64
 *     per block of FSDP_CKPT_BLOCK_NUMEL elements;
 *   payload at the next multiple of 64: per unit, S fp32 master parameters,
 *     then S fp32 m, then S fp32 v.
 * Block checksums let a reader that needs only part of a shard (resharding
 * to another world size) verify exactly the blocks it reads.
 *
 * Every reader validates before it trusts: magic, version, sizes against
 * the manifest, the exact file size, the header checksum, the run id and
 * step (a shard from another run or another step is refused), and each
 * block's checksum as it is read. Each failure is FSDP_STATUS_FORMAT (or
 * IO) with a message naming the file and what is wrong.
 */
#ifndef FSDP_CKPT_CKPT_H
#define FSDP_CKPT_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "models/gpt2.h"

#define FSDP_CKPT_VERSION 1
#define FSDP_CKPT_BLOCK_NUMEL ((size_t)65536) /* elements per checksum block */
#define FSDP_CKPT_PATH_MAX 4096

/* The arrays stored for each unit, in file order. */
typedef enum fsdp_ckpt_array {
    FSDP_CKPT_MASTER = 0, /* fp32 master parameters */
    FSDP_CKPT_ADAM_M,     /* AdamW first moment */
    FSDP_CKPT_ADAM_V,     /* AdamW second moment */
    FSDP_CKPT_N_ARRAYS
} fsdp_ckpt_array;

const char *fsdp_ckpt_array_name(fsdp_ckpt_array a);

/* ---- manifest ------------------------------------------------------------ */

typedef struct fsdp_ckpt_param {
    char name[64];
    int ndim;
    int64_t shape[4];
    size_t numel;
    size_t offset;            /* in the unit's flat buffer */
    int line;                 /* manifest line it was read from (0: built in memory) */
} fsdp_ckpt_param;

typedef struct fsdp_ckpt_unit {
    char name[32];
    size_t numel;             /* unpadded */
    size_t padded_numel;
    size_t shard_numel;       /* per rank file; = padded_numel when replicated */
    int n_params;
    fsdp_ckpt_param *params;  /* [n_params], owned */
    int line;
} fsdp_ckpt_unit;

/* Everything needed to resume: what was trained (model, parameter names,
 * shapes and shard ranges), where (world size, sharding), and how far (step,
 * Adam t, data position; the RNG is counter-based, so (seed, data position)
 * is its whole state). Rank r's file of a world of N holds, for unit u,
 * elements [r * S, (r + 1) * S) of the padded flat buffer (S = shard_numel),
 * or all of it when replicated (shard none). */
typedef struct fsdp_ckpt_manifest {
    int version;
    uint64_t run_id;          /* random per training process; in every shard file */
    uint64_t step;            /* optimizer steps completed */
    uint64_t adam_t;          /* AdamW step count */
    uint64_t data_sequences;  /* sequences consumed = step * batch * world * accum */
    uint64_t seed;            /* parameter init, data and sampling */
    int world_size;
    char shard[16];           /* full | grad-op | none */
    bool replicated;          /* shard none: every file holds whole units */
    int batch, seq, grad_accum;
    int steps_total;          /* --steps of the run that wrote it (lr schedule) */
    char compute_dtype[8];    /* fp32 | bf16 (informational: state is fp32) */
    char model_name[64];
    char model_spec[192];     /* re-parseable by fsdp_gpt2_config_parse, or "" */
    bool has_gpt2;
    fsdp_gpt2_config gpt2;    /* when has_gpt2 */
    int vocab_size, padded_vocab_size, max_seq_len;
    char data[512];           /* data spec (informational) */
    int n_units;
    fsdp_ckpt_unit *units;    /* [n_units], owned */
} fsdp_ckpt_manifest;

/* Release what the manifest owns and zero it. */
void fsdp_ckpt_manifest_free(fsdp_ckpt_manifest *m);

/* Describe a model's units and parameters in m->units (allocated; the rest
 * of m is left alone) for a world of n_ranks with the given shard numel per
 * unit (shard_numel[u]) and padded numel (padded_numel[u]). */
fsdp_status fsdp_ckpt_manifest_set_units(fsdp_ckpt_manifest *m, const fsdp_model *model,
                                         const size_t *padded_numel, const size_t *shard_numel);

/* Write the manifest to `path` and fsync it. IO error naming the path. */
fsdp_status fsdp_ckpt_manifest_write(const char *path, const fsdp_ckpt_manifest *m);

/* Read and validate a manifest: every key present once, every number in
 * range and consistent (shard sizes vs world size, parameter offsets tiling
 * each unit). A malformed file is FSDP_STATUS_FORMAT naming the file and
 * the line. On failure *m is left zeroed. */
fsdp_status fsdp_ckpt_manifest_read(const char *path, fsdp_ckpt_manifest *m);

/* The manifest's units and parameters (names, shapes, offsets, unpadded
 * sizes) must be the model's: FSDP_STATUS_FORMAT naming `path` and the line
 * of the first difference otherwise. */
fsdp_status fsdp_ckpt_manifest_check_model(const fsdp_ckpt_manifest *m, const char *path,
                                           const fsdp_model *model);

/* First element of rank r's shard of unit u in the unit's padded buffer. */
static inline size_t fsdp_ckpt_shard_first(const fsdp_ckpt_manifest *m, int u, int r)
{
    return m->replicated ? 0 : (size_t)r * m->units[u].shard_numel;
}

/* ---- directories ----------------------------------------------------------- */

/* "DIR/step_%08llu" + suffix ("" or ".tmp"); INVALID_ARG if too long. */
fsdp_status fsdp_ckpt_step_path(char *out, size_t n, const char *dir, uint64_t step,
                                const char *suffix);
/* "CKPT/rank_%05d.bin" */
fsdp_status fsdp_ckpt_rank_path(char *out, size_t n, const char *ckpt, int rank);

/* True if `ckpt` is a directory holding a DONE marker. */
bool fsdp_ckpt_is_complete(const char *ckpt);

/* Newest complete checkpoint in dir: *found = false when there is none (or
 * dir does not exist). Incomplete directories are skipped. IO error only
 * when dir exists but cannot be listed. */
fsdp_status fsdp_ckpt_latest(const char *dir, uint64_t *step, bool *found);

/* Start writing checkpoint `step`: create dir (and its parents) if needed,
 * remove leftovers of interrupted saves (step_*.tmp, step_*.old), and
 * create an empty DIR/step_<step>.tmp. Rank 0 only, before the ranks write. */
fsdp_status fsdp_ckpt_begin(const char *dir, uint64_t step);

/* Finish checkpoint `step` once every file in the .tmp directory is
 * written and fsynced: write DONE, fsync, rename to the final name (a
 * complete checkpoint of the same step already there is replaced), fsync
 * dir; then keep only the `keep` newest complete checkpoints (0: all).
 * Rank 0 only. */
fsdp_status fsdp_ckpt_commit(const char *dir, uint64_t step, int keep);

/* ---- shard files ----------------------------------------------------------- */

/* Identity and layout of one rank's shard file. */
typedef struct fsdp_ckpt_shard_info {
    uint64_t run_id, step, adam_t;
    int rank, world_size, n_units;
    const size_t *shard_numel; /* [n_units] elements per array */
    const size_t *first;       /* [n_units] first element in the unit's padded buffer */
} fsdp_ckpt_shard_info;

typedef struct fsdp_ckpt_writer fsdp_ckpt_writer;
typedef struct fsdp_ckpt_reader fsdp_ckpt_reader;

/* Create `path` (truncating) for a shard file with this layout. */
fsdp_status fsdp_ckpt_writer_open(fsdp_ckpt_writer **out, const char *path,
                                  const fsdp_ckpt_shard_info *info);
/* Write block `block` of array a of unit u: FSDP_CKPT_BLOCK_NUMEL elements,
 * or what is left of the shard for the last block. Blocks may come in any
 * order; each exactly once. */
fsdp_status fsdp_ckpt_writer_put(fsdp_ckpt_writer *w, int u, fsdp_ckpt_array a, size_t block,
                                 const float *data);
/* Write the header and tables, fsync and close; frees w (also on error).
 * Fails (INTERNAL) if a block was never written. */
fsdp_status fsdp_ckpt_writer_close(fsdp_ckpt_writer *w);
/* Close without finishing (error paths); the file is left incomplete. */
void fsdp_ckpt_writer_abort(fsdp_ckpt_writer *w);

/* Open a shard file and validate it against what the manifest expects
 * (every field of info). FORMAT/IO errors name the file. */
fsdp_status fsdp_ckpt_reader_open(fsdp_ckpt_reader **out, const char *path,
                                  const fsdp_ckpt_shard_info *expect);
/* Read elements [first, first + n) of array a of unit u (indices local to
 * the file's shard) into dst, verifying the checksum of every block read. */
fsdp_status fsdp_ckpt_reader_read(fsdp_ckpt_reader *r, int u, fsdp_ckpt_array a, size_t first,
                                  size_t n, float *dst);
void fsdp_ckpt_reader_close(fsdp_ckpt_reader *r);

/* ---- test hook ------------------------------------------------------------- */

/* Make every shard-file write of a checkpoint with step >= from_step stall
 * for `ms` milliseconds after its first unit (crash-safety tests kill the
 * process meanwhile). ms = 0 disables. */
void fsdp_ckpt_test_set_stall(uint64_t from_step, int ms);
/* The stall for `step` (0 if none); used by the engine's writer. */
int fsdp_ckpt_test_stall_ms(uint64_t step);

/* A fresh random 64-bit run id (never 0). */
uint64_t fsdp_ckpt_new_run_id(void);

#endif /* FSDP_CKPT_CKPT_H */
