/*
 * shard_file.h - one rank's checkpoint shard file: for each unit, a fixed
 * list of named fp32 arrays (the master parameters, then the optimizer's
 * state arrays), block-checksummed.
 *
 * Version 2 (written; little-endian):
 *   header, 72 bytes: "FSDPCKPT", u32 version (2), u32 header bytes (72),
 *     u32 rank, u32 world size, u32 unit count, u32 block numel,
 *     u64 run id, u64 step, u64 optimizer step count t, u32 array count A,
 *     u32 zero, u64 header checksum (XXH64 over the header with this field
 *     zero, the name table, the unit table and the checksum table);
 *   name table: A names of FSDP_CKPT_ARRAY_NAME_MAX bytes, NUL-padded
 *     ([a-z0-9_], unique; the first is "master");
 *   unit table: per unit u64 shard numel S, u64 k x S for the file of shard
 *     k (checked against the manifest; in checkpoints before manifest version
 *     4 also the shard's first element in the unit's padded flat buffer);
 *   checksum table: per unit, per array, one XXH64 (seed 0) per block of
 *     FSDP_CKPT_BLOCK_NUMEL elements;
 *   payload at the next multiple of 64: per unit, A arrays of S fp32.
 * Version 1 (read only): a 64-byte header without the array count (the
 *   checksum field at byte 56), no name table, always the arrays master,
 *   adam_m, adam_v (AdamW), and a weaker checksum (FNV-style over 8-byte
 *   words, kept only to verify those files: an even number of sign flips in
 *   one block passes it).
 * Block checksums let a reader that needs only part of a shard (resharding
 * to another world size) verify exactly the blocks it reads.
 *
 * Every reader validates before it trusts: magic, version, sizes against
 * the manifest, the exact file size, the header checksum, the run id and
 * step (a shard from another run or another step is refused), the array
 * names against what the caller expects, and each block's checksum as it
 * is read. Each failure is FSDP_STATUS_FORMAT (or IO) with a message naming
 * the file and what is wrong.
 */
#ifndef FSDP_CKPT_SHARD_FILE_H
#define FSDP_CKPT_SHARD_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define FSDP_CKPT_SHARD_VERSION 2
#define FSDP_CKPT_BLOCK_NUMEL ((size_t)65536) /* elements per checksum block */
#define FSDP_CKPT_MAX_ARRAYS 8                /* arrays per unit, the master included */
#define FSDP_CKPT_ARRAY_NAME_MAX 24           /* bytes per name in the file, with the NUL */

/* Array indices of the default layout: AdamW's, which every version-1 file
 * has and which a writer gets when it names no arrays. Array 0 is the
 * master in every layout. */
enum { FSDP_CKPT_MASTER = 0, FSDP_CKPT_ADAM_M = 1, FSDP_CKPT_ADAM_V = 2 };

/* Whether s can name an array: 1..FSDP_CKPT_ARRAY_NAME_MAX-1 characters
 * of [a-z0-9_]. */
bool fsdp_ckpt_array_name_valid(const char *s);

/* ---- shard files ----------------------------------------------------------- */

/* Identity and layout of one rank's shard file. */
typedef struct fsdp_ckpt_shard_info {
    uint64_t run_id, step;
    uint64_t adam_t;           /* the optimizer's step count (named after the manifest key) */
    int rank, world_size, n_units;
    const size_t *shard_numel; /* [n_units] elements per array */
    const size_t *first;       /* [n_units] k x shard numel for shard k (unit table) */
    /* The arrays of every unit, in file order; array_names[0] is "master".
     * n_arrays 0: for a writer, the default layout (master, adam_m, adam_v);
     * for a reader, whatever the file holds (readers of the master alone). */
    int n_arrays;
    const char *const *array_names; /* [n_arrays] */
} fsdp_ckpt_shard_info;

typedef struct fsdp_ckpt_writer fsdp_ckpt_writer;
typedef struct fsdp_ckpt_reader fsdp_ckpt_reader;

/* Create `path` (truncating) for a shard file with this layout (version
 * 2). INVALID_ARG for a bad array list. */
fsdp_status fsdp_ckpt_writer_open(fsdp_ckpt_writer **out, const char *path,
                                  const fsdp_ckpt_shard_info *info);
/* Write block `block` of array a of unit u: FSDP_CKPT_BLOCK_NUMEL elements,
 * or what is left of the shard for the last block. Blocks may come in any
 * order; each exactly once. */
fsdp_status fsdp_ckpt_writer_put(fsdp_ckpt_writer *w, int u, int a, size_t block,
                                 const float *data);
/* Write the header and tables, fsync and close; frees w (also on error).
 * Fails (INTERNAL) if a block was never written. */
fsdp_status fsdp_ckpt_writer_close(fsdp_ckpt_writer *w);
/* Close without finishing (error paths); the file is left incomplete. */
void fsdp_ckpt_writer_abort(fsdp_ckpt_writer *w);

/* Open a shard file (version 1 or 2) and validate it against what the
 * manifest expects (every field of info; the array names unless
 * expect->n_arrays is 0). FORMAT/IO errors name the file. */
fsdp_status fsdp_ckpt_reader_open(fsdp_ckpt_reader **out, const char *path,
                                  const fsdp_ckpt_shard_info *expect);
/* Read elements [first, first + n) of array a of unit u (indices local to
 * the file's shard) into dst, verifying the checksum of every block read. */
fsdp_status fsdp_ckpt_reader_read(fsdp_ckpt_reader *r, int u, int a, size_t first, size_t n,
                                  float *dst);
void fsdp_ckpt_reader_close(fsdp_ckpt_reader *r);

/* The file's format version, its array count and array a's name. */
int fsdp_ckpt_reader_version(const fsdp_ckpt_reader *r);
int fsdp_ckpt_reader_n_arrays(const fsdp_ckpt_reader *r);
const char *fsdp_ckpt_reader_array_name(const fsdp_ckpt_reader *r, int a);

/* ---- test hook ------------------------------------------------------------- */

/* Make every shard-file write of a checkpoint with step >= from_step stall
 * for `ms` milliseconds after its first unit (crash-safety tests kill the
 * process meanwhile). ms = 0 disables. */
void fsdp_ckpt_test_set_stall(uint64_t from_step, int ms);
/* The stall for `step` (0 if none); used by the engine's writer. */
int fsdp_ckpt_test_stall_ms(uint64_t step);

#endif /* FSDP_CKPT_SHARD_FILE_H */
