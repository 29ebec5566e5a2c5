/*
 * safetensors.h - Hugging Face safetensors files: the validated container
 * (safetensors.c) and the model it holds (safetensors_model.c, the
 * "safetensors" weight format of modelfile.h).
 *
 * File layout: u64 little-endian N (header bytes), N bytes of JSON (an
 * object: "__metadata__" -> {string: string}, and per tensor name ->
 * {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, offsets
 * relative to the data section), then the data section, which the tensors
 * tile exactly in offset order.
 *
 * Tensor names, shapes, transposes and metadata are the model family's
 * (models/weights.h: fsdp_safetensors_mapping): the family works out its
 * config from the tensors, and every tensor must then be one of the
 * model's parameters (right shape, a dtype fsdp converts: F32, BF16, F16)
 * or one the family skips; every parameter must be present once.
 */
#ifndef FSDP_CKPT_SAFETENSORS_H
#define FSDP_CKPT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/modelfile_internal.h"

#define FSDP_ST_MAX_HEADER_BYTES ((uint64_t)100 << 20) /* as the reference reader */
#define FSDP_ST_MAX_DIMS 8

typedef struct fsdp_st_tensor {
    char *name;               /* as written in the file (owned) */
    char dtype_name[8];       /* "F32", "BF16", ... */
    fsdp_file_dtype dtype;    /* FSDP_FILE_OTHER: a valid dtype fsdp does not convert */
    int elem_bytes;
    int ndim;
    uint64_t shape[FSDP_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;      /* byte range within the data section */
} fsdp_st_tensor;

typedef struct fsdp_st_file {
    char *path;               /* for messages (owned) */
    uint64_t file_bytes;
    uint64_t data_offset;     /* 8 + header bytes: where the data section starts */
    int n_tensors;
    fsdp_st_tensor *tensors;  /* [n_tensors], in data-offset order (owned) */
    int n_meta;               /* "__metadata__" entries (owned strings) */
    char **meta_key, **meta_val;
} fsdp_st_file;

/* Parse and validate a whole file held in memory (data[0..n)); `label`
 * names it in messages. Only the header is interpreted: every tensor's
 * dtype, shape and offsets are checked against each other and against n,
 * and the tensors must tile the data section. FORMAT naming the file and
 * the tensor on any inconsistency. On failure *out is zeroed. */
fsdp_status fsdp_st_parse_buffer(const char *label, const void *data, size_t n,
                                 fsdp_st_file *out);

/* The same for a file on disk (reads the header only; a non-regular file
 * is IO). */
fsdp_status fsdp_st_open(const char *path, fsdp_st_file *out);

void fsdp_st_free(fsdp_st_file *f);

/* FORMAT with "safetensors file '<path>': <message>"; returns FORMAT. */
fsdp_status fsdp_st_error(const char *path, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- writing ------------------------------------------------------------------- */

/* One tensor of a file fsdp writes: parameter `param` of unit `unit`, under
 * `name` (its shape and transpose are the family's mapping's). */
typedef struct fsdp_st_out {
    int unit, param;
    char name[FSDP_WEIGHT_NAME_MAX + 32];
} fsdp_st_out;

/* Write the safetensors file `path` atomically: the header (metadata
 * key[i] = val[i] for i < n_meta, then the tensors out[0..n_out) in that
 * order, compact JSON padded with spaces to a multiple of 8 bytes, as the
 * reference writer does) and their data as dt (F32 or BF16), transposing
 * what the mapping stores transposed. */
fsdp_status fsdp_st_write_tensors(const char *path, const fsdp_model *m,
                                  const float *const *units, fsdp_dtype dt,
                                  const fsdp_st_out *out, int n_out, char (*key)[64],
                                  char (*val)[64], int n_meta);

/* The data bytes tensor o takes in a file of element type dt. */
uint64_t fsdp_st_out_bytes(const fsdp_model *m, const fsdp_st_out *o, fsdp_dtype dt);

/* ---- JSON objects read one member at a time (safetensors_json.c) --------------- */

struct fsdp_json; /* core/json.h */

/* Called with each member of an object: its name (decoded; key_len bytes,
 * NUL-terminated, may hold NULs) and the raw text of its value
 * value[0..value_n), which starts at byte `offset` of the object's text. A
 * non-OK return stops the walk. */
typedef fsdp_status (*fsdp_st_member_fn)(void *arg, const char *key, size_t key_len,
                                         const char *value, size_t value_n, size_t offset);

/* Walk the members of the JSON object text[0..n) in document order,
 * without building a tree: memory stays what fn keeps. The framing is
 * checked strictly: FORMAT "<label> is not valid JSON: byte B: expected
 * ..." (label names the text: "safetensors file 'x': the header"). Values
 * are handed over raw, so fn checks them (fsdp_st_json_value). fn NULL:
 * check the framing only (a first pass, so that a mangled text is reported
 * as such rather than by what its first member lacks). */
fsdp_status fsdp_st_json_members(const char *label, const char *text, size_t n,
                                 fsdp_st_member_fn fn, void *arg);

/* Parse the raw value of member `key` (at byte `offset`) with core/json if
 * it is at most max bytes long: a bounded tree. FORMAT naming label, key
 * and offset otherwise. */
fsdp_status fsdp_st_json_value(const char *label, const char *key, const char *value, size_t n,
                               size_t offset, size_t max, struct fsdp_json **out);

/* "object", "array", "string", ...: the JSON type a raw value starts as. */
const char *fsdp_st_json_raw_type(const char *value, size_t n);

/* The model a parsed file holds: the first family (registry order) whose
 * safetensors mapping reads a config from the tensors, that model built,
 * and every tensor checked against it (fsdp_st_locate). FORMAT naming the
 * file and the tensor otherwise. Free *m with fsdp_model_free. */
fsdp_status fsdp_st_model(const fsdp_st_file *f, fsdp_model *m);

/* Where each of m's parameters lives in the files files[0..n_files) (one
 * model split over several files: a sharded Hugging Face directory):
 * src[k] for the k-th parameter in unit order, src[k].part the index of
 * its file. m must be the files' model (its family's mapping is used);
 * FORMAT naming the tensor and its file on any mismatch, and `label`
 * ("safetensors file 'x'") for a parameter no file holds, named with
 * `prefix` (NULL: none) before the mapping's name. */
fsdp_status fsdp_st_locate(const fsdp_st_file *files, int n_files, const char *label,
                           const char *prefix, const fsdp_model *m, fsdp_tensor_src *src);

/* The same for a bnb-4bit directory with quantized weights q (bnb4.h):
 * a weight's codes stand for its parameter (the quant_state's shape
 * checked against the model's; src[k].nf4 set), its other tensors are
 * skipped. q NULL: fsdp_st_locate. */
struct fsdp_bnb4;
fsdp_status fsdp_st_locate_bnb4(const fsdp_st_file *files, int n_files, const char *label,
                                const char *prefix, const fsdp_model *m,
                                const struct fsdp_bnb4 *q, fsdp_tensor_src *src);

#endif /* FSDP_CKPT_SAFETENSORS_H */
