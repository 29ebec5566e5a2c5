/*
 * modelfile.h - model weights on disk, in every format fsdp reads and
 * writes, behind one table of formats (modelfile_internal.h): an llm.c model
 * file (.bin), a Hugging Face safetensors file (.safetensors), a Hugging
 * Face model directory (config.json and one or more safetensors files) and
 * an fsdp checkpoint directory. Which model family a file holds, and how that
 * family names its tensors, comes from the family (models/weights.h): the
 * formats know no family.
 *
 * And the one entry point for --model values: fsdp_modelfile_resolve turns
 * a named shape, a spec or a path into a model (plus the open file for a
 * path), so no command resolves --model itself.
 *
 * Reading is by range: fsdp_modelfile_read_range fills elements
 * [begin, end) of one unit's flat fp32 buffer straight from the file
 * (converting dtypes and undoing transposes on the fly), so each rank of an
 * engine reads only its own shard and no rank ever holds the whole model
 * (fsdp_modelfile_init_fn has the engine's init_fn signature). Files are
 * validated completely when opened and bound to a model, before any
 * parameter is read; reads are thread-safe.
 *
 * Writing takes whole host units (fsdp convert holds the model in host
 * memory) and is atomic for every format (temporary name, fsync, rename).
 */
#ifndef FSDP_CKPT_MODELFILE_H
#define FSDP_CKPT_MODELFILE_H

#include <stdbool.h>
#include <stdint.h>

#include "models/registry.h"

typedef struct fsdp_modelfile_format fsdp_modelfile_format; /* modelfile_internal.h */
typedef struct fsdp_modelfile fsdp_modelfile;

/* The formats, in detection order. */
int fsdp_modelfile_format_count(void);
const fsdp_modelfile_format *fsdp_modelfile_format_at(int i);
/* By short name ("llmc", "safetensors", "hf", "ckpt"); NULL if unknown. */
const fsdp_modelfile_format *fsdp_modelfile_format_find(const char *name);
/* "llm.c model file", "safetensors file", "Hugging Face directory",
 * "checkpoint": for messages. */
const char *fsdp_modelfile_format_name(const fsdp_modelfile_format *f);
/* "llmc", "safetensors", "hf", "ckpt": the short name (--to). */
const char *fsdp_modelfile_format_short_name(const fsdp_modelfile_format *f);

/* The short names joined by sep ("llmc|safetensors|hf|ckpt" with sep "|"),
 * for --to; truncated to fit n. Returns buf. */
const char *fsdp_modelfile_format_names(char *buf, size_t n, const char *sep);

/* The file format whose suffix `path` ends with (".bin": llm.c,
 * ".safetensors"), or NULL (a directory format, or no suffix known). */
const fsdp_modelfile_format *fsdp_modelfile_format_by_suffix(const char *path);

/* What a format is and writes (the table's entries, modelfile_internal.h):
 * a directory rather than a file; bf16 tensors as well as fp32; the
 * tokenizer's files beside the weights, which it splits into files
 * (fsdp_modelfile_write_opts' companions, tokenizer and shard_bytes); what
 * a written one is beyond its dtype ("step 0, 1 device"), or NULL. */
bool fsdp_modelfile_format_is_dir(const fsdp_modelfile_format *f);
bool fsdp_modelfile_format_writes_bf16(const fsdp_modelfile_format *f);
bool fsdp_modelfile_format_ships_tokenizer(const fsdp_modelfile_format *f);
const char *fsdp_modelfile_format_note(const fsdp_modelfile_format *f);

/* The format `path` names by its form: a claim by extension (*.bin,
 * *.safetensors), a directory holding config.json (Hugging Face) or another
 * existing directory; anything else is a checkpoint directory (to be
 * created, when writing). */
const fsdp_modelfile_format *fsdp_modelfile_format_of(const char *path);

/* The help text for model files, from the format table:
 * "FILE.bin (llm.c), FILE.safetensors (Hugging Face) or a checkpoint
 * directory". */
size_t fsdp_modelfile_help(char *buf, size_t n);

/* What a --model value may be, for --help and messages: the registry's
 * specs, then "or a model file: " and fsdp_modelfile_help. */
size_t fsdp_modelfile_value_help(char *buf, size_t n);

/* Open and validate `path` (format by fsdp_modelfile_format_of). For a
 * checkpoint, path is either one complete checkpoint (DIR/step_N holding
 * DONE) or a --ckpt-dir, whose newest complete checkpoint is used.
 * FORMAT/IO errors name the file and what is wrong. */
fsdp_status fsdp_modelfile_open(fsdp_modelfile **out, const char *path);
void fsdp_modelfile_close(fsdp_modelfile *mf);

/* The model the file holds: its family and canonical config (build it with
 * fsdp_model_build, or use fsdp_modelfile_resolve). */
const fsdp_model_family *fsdp_modelfile_family(const fsdp_modelfile *mf);
const char *fsdp_modelfile_config(const fsdp_modelfile *mf);
const fsdp_modelfile_format *fsdp_modelfile_format_get(const fsdp_modelfile *mf);
/* The base a checkpoint's frozen parameters come from (its --model value), or NULL. */
const char *fsdp_modelfile_base(const fsdp_modelfile *mf);
/* The file actually read (for a --ckpt-dir: its newest checkpoint). */
const char *fsdp_modelfile_path(const fsdp_modelfile *mf);
/* "fp32", "bf16", "fp16" or "mixed": how the parameters are stored. */
const char *fsdp_modelfile_dtype_name(const fsdp_modelfile *mf);

/* Check the file against a model built from its family and config and
 * locate every parameter; must precede reads. The model must outlive the
 * reads. INVALID_ARG if m is another model. */
fsdp_status fsdp_modelfile_bind(fsdp_modelfile *mf, const fsdp_model *m);

/* Elements [begin, end) of unit `unit`'s flat fp32 buffer into dst;
 * elements past the unit's numel (padding) are zero. Thread-safe. Only the
 * stored bytes of that range are read (a transposed tensor: whole rows of
 * its band). */
fsdp_status fsdp_modelfile_read_range(const fsdp_modelfile *mf, int unit, size_t begin,
                                      size_t end, float *dst);

/* Bytes the calling thread has read from weight files through range reads
 * so far (each rank thread: its own shard), for tests and reports. */
uint64_t fsdp_modelfile_thread_bytes_read(void);

/* The directory whose tokenizer and generation files belong to the model
 * (a Hugging Face directory: itself), or NULL. */
const char *fsdp_modelfile_companions(const fsdp_modelfile *mf);

/* The tokenizer.json that comes with the --model value `value` (a Hugging
 * Face directory holding one) into buf; false if there is none. No I/O
 * beyond stats. */
bool fsdp_modelfile_tokenizer_of(const char *value, char *buf, size_t n);

/* Elements [begin, end) of unit `unit` of model m, for the parameters of m that the model mf
 * is bound to (the same model before LoRA adapters were added or parameters frozen, which lays
 * the unit out otherwise) also has: each read from mf by name. Elements of m's other
 * parameters (adapters) are left as they are. Thread-safe as fsdp_modelfile_read_range. */
fsdp_status fsdp_modelfile_read_by_name(const fsdp_modelfile *mf, const fsdp_model *m, int unit,
                                        size_t begin, size_t end, float *dst);

/* NF4 (bnb-4bit) files: whether mf stores weights in NF4; mark every
 * parameter of m stored so (nf4 = true); elements [begin, end) of m's unit's
 * NF4 group as codes and fp32 absmax (quantized as bitsandbytes would when
 * the file holds floats). */
bool fsdp_modelfile_is_nf4(const fsdp_modelfile *mf);
fsdp_status fsdp_modelfile_mark_nf4(const fsdp_modelfile *mf, fsdp_model *m);
fsdp_status fsdp_modelfile_read_nf4(const fsdp_modelfile *mf, const fsdp_model *m, int unit,
                                    size_t begin, size_t end, uint8_t *codes, float *absmax);
/* fsdp_engine_shared.init_fn: arg is a bound fsdp_modelfile. */
fsdp_status fsdp_modelfile_init_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                                   size_t end, float *dst);

/* The token ids transformers' generate needs to start, pad and stop: a
 * Hugging Face OUT whose companions hold no generation_config.json gets
 * one with them; the companions' one gets end_of_turn added to its
 * eos_token_id when it lacks it (ckpt/hfdir_gen.c). -1: none. */
typedef struct fsdp_modelfile_generation {
    int bos_token_id, pad_token_id;
    int end_of_turn;           /* the chat format's: added to the model's own file's
                                * eos_token_id when it lacks it */
    int n_eos;
    int eos_token_id[4];       /* the chat format's end of turn first, then the end of text */
} fsdp_modelfile_generation;

/* How a model is written (fsdp_modelfile_write_with). */
typedef struct fsdp_modelfile_write_opts {
    fsdp_dtype dtype;          /* F32 or BF16; checkpoints always hold fp32 (F32 only) */
    uint64_t shard_bytes;      /* Hugging Face directories: the most tensor bytes per
                                * safetensors file (a larger tensor gets a file of its
                                * own); more than one file gets an index. 0: 5 GB */
    const char *companions;    /* Hugging Face directories: a directory whose tokenizer and
                                * generation files (hfdir.h) are copied along, or NULL */
    const char *tokenizer;     /* Hugging Face directories: a tokenizer.json copied in as
                                * tokenizer.json (over the companions' one), or NULL */
    const char *base;          /* PEFT adapter directories: base_model_name_or_path (NULL:
                                * null) */
    const fsdp_modelfile_generation *generation; /* Hugging Face directories: what
                                * generation_config.json must say (NULL: the companions'
                                * copied as they are) */
    /* out (may be NULL): the names of the files copied along, ", "-separated */
    char *copied;
    size_t copied_size;
} fsdp_modelfile_write_opts;

#define FSDP_MODELFILE_SHARD_BYTES_DEFAULT ((uint64_t)5000000000) /* "5GB", as transformers 4 */

/* Write the model (host fp32 unit buffers, units[u] holding
 * m->units[u].numel floats) in `format` at path, atomically. A checkpoint
 * is written as step 0 of a 1-device run (optimizer state zero) into the
 * --ckpt-dir `path`, which must not hold checkpoints already; a Hugging
 * Face directory is built under a temporary name and renamed to path,
 * which must not exist (or be an empty directory). INVALID_ARG when the
 * model's family has no mapping for the format. */
fsdp_status fsdp_modelfile_write_with(const char *path, const fsdp_modelfile_format *format,
                                      const fsdp_model *m, const float *const *units,
                                      const fsdp_modelfile_write_opts *opts);

/* The same with default options and element type dt. */
fsdp_status fsdp_modelfile_write(const char *path, const fsdp_modelfile_format *format,
                                 const fsdp_model *m, const float *const *units, fsdp_dtype dt);

/* The one way a --model value becomes a model. A named shape or spec
 * ("small", "gpt2:layers=4", "custom:...") is built by the registry; a
 * path is opened, validated, and the model it holds is built. With
 * file != NULL, a path's file is returned bound to the model (NULL for a
 * spec): read weights from it, and close it before freeing the model. With
 * file == NULL only the shape is wanted and the file is closed again.
 * INVALID_ARG for a spec that does not parse and for a value that is
 * neither a spec nor a path; FORMAT/IO for a bad file. On failure *m is
 * zeroed and *file NULL. */
fsdp_status fsdp_modelfile_resolve(const char *value, fsdp_model *m, fsdp_modelfile **file);

#endif /* FSDP_CKPT_MODELFILE_H */
