/*
 * safetensors.h - Hugging Face safetensors files holding GPT-2 weights:
 * validated header parsing, the mapping from HF GPT-2 tensor names to
 * fsdp's parameters, and export.
 *
 * File layout: u64 little-endian N (header bytes), N bytes of JSON (an
 * object: "__metadata__" -> {string: string}, and per tensor name ->
 * {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, offsets
 * relative to the data section), then the data section, which the tensors
 * tile exactly in offset order.
 *
 * HF GPT-2 layout vs fsdp's (models/gpt2.h): names are the same ("wte.weight",
 * "h.3.attn.c_attn.weight", "ln_f.bias"), optionally prefixed "transformer."
 * (accepted on import, never written). HF's Conv1D weights (attn.c_attn,
 * attn.c_proj, mlp.c_fc, mlp.c_proj) are stored (in, out), the transpose of
 * fsdp's (OC, C). HF's wte is (V, C); fsdp's is padded to (Vp, C): the pad
 * rows are zero on import and dropped on export. HF's causal-mask buffers
 * (h.N.attn.bias, h.N.attn.masked_bias) and the tied lm_head.weight are
 * ignored on import. The number of heads is not in the tensors' shapes: it
 * comes from the "n_head" metadata entry fsdp writes, else channels / 64
 * (every released GPT-2 size has 64-dimensional heads).
 */
#ifndef FSDP_CKPT_SAFETENSORS_H
#define FSDP_CKPT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/modelfile.h"
#include "models/gpt2.h"

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
    int n_head;               /* metadata "n_head", 0 if absent */
} fsdp_st_file;

/* Parse and validate a whole file held in memory (data[0..n)); `label`
 * names it in messages. Only the header is interpreted: every tensor's
 * dtype, shape and offsets are checked against each other and against n,
 * and the tensors must tile the data section. FORMAT naming the file and
 * the tensor on any inconsistency. On failure *out is zeroed. */
fsdp_status fsdp_st_parse_buffer(const char *label, const void *data, size_t n,
                                 fsdp_st_file *out);

/* The same for a file on disk (reads the header only). */
fsdp_status fsdp_st_open(const char *path, fsdp_st_file *out);

void fsdp_st_free(fsdp_st_file *f);

/* The GPT-2 the file holds: shapes from wte, wpe and the h.N blocks, heads
 * from the metadata (see above). Every tensor must be a GPT-2 parameter of
 * the right shape and a dtype fsdp converts (F32, BF16, F16), or one of the
 * ignored buffers; every parameter must be present once. FORMAT naming the
 * file and the tensor otherwise. */
fsdp_status fsdp_st_gpt2_config(const fsdp_st_file *f, fsdp_gpt2_config *cfg);

/* Where each of the model's parameters lives in the file: src[k] for the
 * k-th parameter in unit order (units[0].params[0], ...). The model must be
 * built from fsdp_st_gpt2_config's config (checked: FORMAT otherwise). */
fsdp_status fsdp_st_gpt2_locate(const fsdp_st_file *f, const fsdp_model *m, fsdp_tensor_src *src);

/* Write the model (host fp32 unit buffers, units[u] holding
 * m->units[u].numel floats) as an HF GPT-2 safetensors file in dtype dt
 * (F32 or BF16), atomically: temporary name, fsync, rename, fsync of the
 * directory. Metadata: format "pt", n_head, n_layer, n_embd, n_ctx,
 * vocab_size (strings). */
fsdp_status fsdp_st_write(const char *path, const fsdp_model *m, const float *const *units,
                          fsdp_dtype dt);

#endif /* FSDP_CKPT_SAFETENSORS_H */
