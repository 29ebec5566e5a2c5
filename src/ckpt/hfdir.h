/*
 * hfdir.h - Hugging Face model directories as a weight format (the "hf"
 * entry of modelfile.h's table): what `save_pretrained` writes and the Hub
 * serves.
 *
 *   DIR/config.json                     model_type picks the family (its
 *                                       hf_model_types), whose hf_config
 *                                       reads the shape (models/weights.h)
 *   DIR/model.safetensors               the weights in one file, or
 *   DIR/model.safetensors.index.json    {"metadata": {...}, "weight_map":
 *                                       {tensor: file}} naming the
 *   DIR/model-0000K-of-0000N.safetensors  files that hold them
 *   DIR/tokenizer.json, ...             companions (fsdp_hfdir_companions)
 *
 * Reading (hfdir.c): config.json and the index are bounded in size and
 * parsed before anything else; every shard's header is validated
 * (safetensors.c) and held against the index both ways, then every tensor
 * against the model the family builds from config.json, so a bad
 * directory is refused at open, naming the file and the tensor. Reads are
 * the flat reader's (modelfile_flat.c): each rank preads only its shard's
 * byte ranges, straight from the right file.
 *
 * Writing (hfdir_write.c): config.json from the family's hf_config_write,
 * the tensors in files of at most `shard_bytes` (assigned in model order,
 * each file's tensors sorted by name, as transformers and the reference
 * safetensors writer lay them out) with an index when there is more than
 * one, and the companions copied; all under a temporary name, renamed into
 * place at the end.
 */
#ifndef FSDP_CKPT_HFDIR_H
#define FSDP_CKPT_HFDIR_H

#include <stdint.h>

#include "ckpt/modelfile_internal.h"

#define FSDP_HF_CONFIG "config.json"
#define FSDP_HF_WEIGHTS "model.safetensors"
#define FSDP_HF_INDEX "model.safetensors.index.json"
#define FSDP_HF_CONFIG_MAX_BYTES ((size_t)1 << 20) /* config.json: a few KiB in practice */
#define FSDP_HF_INDEX_MAX_BYTES ((size_t)64 << 20) /* 100k tensors: about 10 MiB */
#define FSDP_HF_MAX_FILES 4096                      /* shard files (405B models: 191) */

/* Files that travel with a model's weights and are copied by the writer
 * when present: tokenizer, its configuration and chat template, and the
 * generation settings. NULL-terminated. */
extern const char *const fsdp_hfdir_companions[];

/* generation_config.json into `dir` (hfdir_gen.c): the companion `src` (NULL:
 * none), kept byte for byte when its eos_token_id already holds
 * g->end_of_turn (or g has none, or src is not a JSON object with numeric
 * ids), else re-written with it appended; without src, one written from g.
 * *what: "copied", "its end of turn added" or "written". IO naming the
 * file that cannot be read or written. */
fsdp_status fsdp_hfdir_write_generation(const char *dir, const char *src,
                                        const fsdp_modelfile_generation *g, const char **what);

/* The family and canonical config that config.json text[0..n) describes:
 * model_type through the families' hf_model_types, an architectures entry
 * that is a causal language model, then the family's hf_config.
 * FORMAT/UNSUPPORTED with a message that starts with `label` (which names
 * the file) and names the key. A "quantization_config" is the directory's
 * (bnb4.h): bitsandbytes 4-bit NF4 sets *bnb4 (may be NULL) and is not
 * shown to the family; any other is refused by name. */
fsdp_status fsdp_hfdir_parse_config(const char *label, const char *text, size_t n,
                                    const fsdp_model_family **family, char *config,
                                    size_t config_size, bool *bnb4);

/* A parsed model.safetensors.index.json. */
typedef struct fsdp_hfdir_index {
    int n_files;
    char **files;             /* [n_files] distinct shard file names, sorted */
    int n_tensors;
    char **tensors;           /* [n_tensors] tensor names, sorted */
    int *file_of;             /* [n_tensors] index into files */
    uint64_t total_size;      /* metadata.total_size (0 if absent) */
} fsdp_hfdir_index;

/* Parse index text[0..n): weight_map is read one member at a time
 * (safetensors_json.c), so memory follows the entries kept. File names
 * must be plain names in the directory ending in ".safetensors"; a tensor
 * listed twice, a missing weight_map or more than FSDP_HF_MAX_FILES files
 * are FORMAT errors starting with `label`. On failure *out is zeroed. */
fsdp_status fsdp_hfdir_parse_index(const char *label, const char *text, size_t n,
                                   fsdp_hfdir_index *out);
void fsdp_hfdir_index_free(fsdp_hfdir_index *x);

/* The format's write slot (hfdir_write.c): modelfile.h's
 * fsdp_modelfile_write_with for a Hugging Face directory. */
fsdp_status fsdp_hfdir_write(const char *path, const fsdp_model *m, const float *const *units,
                             const fsdp_modelfile_write_opts *o);

/* What writes config.json and the weights of a Hugging Face directory into
 * the temporary directory tmp (*n_files: the safetensors files written). */
typedef fsdp_status (*fsdp_hfdir_model_writer)(const char *tmp, const fsdp_model *m,
                                               const float *const *units,
                                               const fsdp_modelfile_write_opts *o,
                                               int *n_files);

/* fsdp_hfdir_write with config.json and the weights written by
 * write_weights (NULL: the floats of the format's own writer; bnb4_write.c
 * has another): the checks, staging, companions and rename are the same. */
fsdp_status fsdp_hfdir_write_as(const char *path, const fsdp_model *m,
                                const float *const *units, const fsdp_modelfile_write_opts *o,
                                fsdp_hfdir_model_writer write_weights);

/* "model.safetensors" for one file, "model-0000K-of-0000N.safetensors" (K
 * = k + 1) for file k of n_shards. */
void fsdp_hfdir_shard_name(char *buf, size_t n, int k, int n_shards);

/* model.safetensors.index.json into tmp, as transformers writes it (keys
 * sorted, two-space indent): e[0..n) each a tensor's name and file (sorted
 * here), with total_parameters and total_size (data bytes) as metadata. */
typedef struct fsdp_hfdir_entry {
    const char *name;
    int shard;
} fsdp_hfdir_entry;
fsdp_status fsdp_hfdir_write_index(const char *tmp, fsdp_hfdir_entry *e, int n, int n_shards,
                                   uint64_t total_parameters, uint64_t total_bytes);

/* Writing a directory atomically (hfdir_write.c; the adapter writer, peft.c,
 * shares it). Begin: `path` must not exist or be an empty directory (never
 * a file, which is never replaced); creates "<path>.tmp.<pid>" into
 * tmp[0..n) for the caller to fill. `what` ("Hugging Face directory")
 * names the output in messages. End: with st OK, fsync tmp, rename it to
 * path and fsync the parent; otherwise (or when that fails) remove tmp and
 * the plain files in it. Returns st, or the error that ended it. */
fsdp_status fsdp_dir_write_begin(const char *path, const char *what, char *tmp, size_t n);
fsdp_status fsdp_dir_write_end(const char *path, const char *tmp, fsdp_status st);

/* Read a whole small file (a regular file of at most max bytes; FIFOs and
 * devices are refused without blocking) into *buf (malloc'd,
 * NUL-terminated). `what` names it in messages. */
fsdp_status fsdp_hfdir_read_file(const char *path, size_t max, const char *what, char **buf,
                                 size_t *n);

#endif /* FSDP_CKPT_HFDIR_H */
