/*
 * ckpt_base.h - the reference a checkpoint keeps to the base its frozen
 * parameters come from (LoRA, --freeze): the --model value and a hash of
 * what it holds, so that resuming against another base is refused.
 */
#ifndef FSDP_CKPT_CKPT_BASE_H
#define FSDP_CKPT_CKPT_BASE_H

#include <stdint.h>

#include "core/error.h"

/* A hash of the base named by `model` (a --model value) whose canonical config is `config`:
 * for a model file, its size and its first and last MiB; for a directory, the same of each of
 * its weight and config files (*.safetensors, *.bin, *.json, in name order); for a named shape
 * or spec (no file: the seed initialises it), the config and the seed. IO naming the file. */
fsdp_status fsdp_ckpt_base_hash(const char *model, const char *config, uint64_t seed,
                                uint64_t *out);

#endif /* FSDP_CKPT_CKPT_BASE_H */
