/*
 * shard_file.h - one rank's checkpoint shard file.
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
#ifndef FSDP_CKPT_SHARD_FILE_H
#define FSDP_CKPT_SHARD_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define FSDP_CKPT_SHARD_VERSION 1
#define FSDP_CKPT_BLOCK_NUMEL ((size_t)65536) /* elements per checksum block */

/* The arrays stored for each unit, in file order. */
typedef enum fsdp_ckpt_array {
    FSDP_CKPT_MASTER = 0, /* fp32 master parameters */
    FSDP_CKPT_ADAM_M,     /* AdamW first moment */
    FSDP_CKPT_ADAM_V,     /* AdamW second moment */
    FSDP_CKPT_N_ARRAYS
} fsdp_ckpt_array;

const char *fsdp_ckpt_array_name(fsdp_ckpt_array a);

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

#endif /* FSDP_CKPT_SHARD_FILE_H */
