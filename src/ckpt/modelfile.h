/*
 * modelfile.h - one reader and one writer for every form a GPT-2's weights
 * can take on disk: an llm.c model file (.bin), a Hugging Face safetensors
 * file (.safetensors) and an fsdp checkpoint directory.
 *
 * Reading is by range: fsdp_modelfile_read_range fills elements
 * [begin, end) of one unit's flat fp32 buffer straight from the file (pread,
 * converting dtypes and undoing transposes on the fly), so each rank of an
 * engine reads only its own shard and no rank ever holds the whole model
 * (fsdp_modelfile_init_fn has the engine's init_fn signature). Files are
 * validated completely when opened and bound to a model, before any
 * parameter is read; reads are thread-safe.
 *
 * Writing takes whole host units (fsdp convert holds the model in host
 * memory) and is atomic for every kind (temporary name, fsync, rename).
 */
#ifndef FSDP_CKPT_MODELFILE_H
#define FSDP_CKPT_MODELFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "models/gpt2.h"

typedef enum fsdp_modelfile_kind {
    FSDP_MODELFILE_LLMC = 0,     /* llm.c gpt2_*.bin */
    FSDP_MODELFILE_SAFETENSORS,  /* HF GPT-2 .safetensors */
    FSDP_MODELFILE_CKPT,         /* fsdp checkpoint directory (src/ckpt/ckpt.h) */
    FSDP_MODELFILE_KIND_COUNT
} fsdp_modelfile_kind;

/* Element types found in model files. */
typedef enum fsdp_file_dtype {
    FSDP_FILE_F32 = 0,
    FSDP_FILE_BF16,
    FSDP_FILE_F16,
    FSDP_FILE_OTHER,             /* valid in the format, not convertible by fsdp */
} fsdp_file_dtype;

/* Where one parameter lives in a flat file. */
typedef struct fsdp_tensor_src {
    uint64_t offset;             /* absolute byte offset of the stored tensor's element 0 */
    fsdp_file_dtype dtype;
    uint64_t file_numel;         /* elements stored; fsdp's elements past them are zero
                                  * (the pad rows of wte) */
    bool transposed;             /* the file holds the (cols, rows) transpose of fsdp's
                                  * row-major (rows, cols) */
    uint64_t rows, cols;         /* fsdp's shape as a matrix (a vector: numel x 1) */
} fsdp_tensor_src;

const char *fsdp_modelfile_kind_name(fsdp_modelfile_kind k);

/* Which kind `path` names: an existing directory or a path without a
 * .bin/.safetensors extension is a checkpoint directory, "*.safetensors"
 * safetensors, "*.bin" llm.c. */
fsdp_modelfile_kind fsdp_modelfile_kind_of(const char *path);

/* True if a --model value names a file or directory rather than a config
 * ("small", "custom:..."): it ends in .bin or .safetensors, or is an
 * existing directory. */
bool fsdp_modelfile_is_path(const char *spec);

typedef struct fsdp_modelfile fsdp_modelfile;

/* Open and validate `path`. For a checkpoint, path is either one complete
 * checkpoint (DIR/step_N holding DONE) or a --ckpt-dir, whose newest complete
 * checkpoint is used. FORMAT/IO errors name the file and what is wrong. */
fsdp_status fsdp_modelfile_open(fsdp_modelfile **out, const char *path);
void fsdp_modelfile_close(fsdp_modelfile *mf);

/* The GPT-2 the file holds (build the model from it). */
const fsdp_gpt2_config *fsdp_modelfile_config(const fsdp_modelfile *mf);
fsdp_modelfile_kind fsdp_modelfile_kind_get(const fsdp_modelfile *mf);
/* The file actually read (for a --ckpt-dir: its newest checkpoint). */
const char *fsdp_modelfile_path(const fsdp_modelfile *mf);
/* "fp32", "bf16", "fp16" or "mixed": how the parameters are stored. */
const char *fsdp_modelfile_dtype_name(const fsdp_modelfile *mf);
/* Checkpoints: the step it was written at (0 for other kinds). */
uint64_t fsdp_modelfile_step(const fsdp_modelfile *mf);

/* Check the file against a model built from fsdp_modelfile_config and
 * locate every parameter; must precede reads. The model must outlive the
 * reads. */
fsdp_status fsdp_modelfile_bind(fsdp_modelfile *mf, const fsdp_model *m);

/* Elements [begin, end) of unit `unit`'s flat fp32 buffer into dst;
 * elements past the unit's numel (padding) are zero. Thread-safe. */
fsdp_status fsdp_modelfile_read_range(const fsdp_modelfile *mf, int unit, size_t begin,
                                      size_t end, float *dst);

/* fsdp_engine_shared.init_fn: arg is a bound fsdp_modelfile. */
fsdp_status fsdp_modelfile_init_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                                   size_t end, float *dst);

/* Write the model (host fp32 unit buffers, units[u] holding
 * m->units[u].numel floats) as `kind` at path. dt: F32 or BF16 for llm.c
 * and safetensors; checkpoints always hold fp32 (dt must be F32). A
 * checkpoint is written as step 0 of a 1-device run (Adam moments zero)
 * into the --ckpt-dir `path`, which must not hold checkpoints already. */
fsdp_status fsdp_modelfile_write(const char *path, fsdp_modelfile_kind kind,
                                 const fsdp_model *m, const float *const *units, fsdp_dtype dt);

/* Convert one element type to fp32 (n elements, little-endian storage). */
void fsdp_file_dtype_to_f32(fsdp_file_dtype dt, const void *src, size_t n, float *dst);
/* Bytes per element (0 for FSDP_FILE_OTHER). */
int fsdp_file_dtype_size(fsdp_file_dtype dt);

#endif /* FSDP_CKPT_MODELFILE_H */
