/*
 * ckpt.h - sharded training checkpoints. Knows nothing about engines or
 * devices: the engine side (src/engine/engine_ckpt.c) feeds it host buffers.
 * Three parts, one file pair each:
 *
 *   ckpt_dir.h    the directory layout, atomic begin/commit, retention
 *   manifest.h    the text manifest: what was trained, where, how far
 *   shard_file.h  one rank's block-checksummed shard file
 *
 * Layout of a checkpoint directory (all names fixed):
 *
 *   DIR/step_00000010/manifest        text, `key value` lines (manifest.h)
 *   DIR/step_00000010/rank_00000.bin  rank 0's shards of every unit (shard_file.h)
 *   ...                               one file per rank of the writing world
 *   DIR/step_00000010/tokenizer.json  the tokenizer the run read its data with, and
 *   ...                               its companions (ckpt_tok.h), when there is one
 *   DIR/step_00000010/DONE            written last
 */
#ifndef FSDP_CKPT_CKPT_H
#define FSDP_CKPT_CKPT_H

#include "ckpt/ckpt_dir.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_file.h"

#endif /* FSDP_CKPT_CKPT_H */
