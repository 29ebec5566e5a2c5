/*
 * bnb4.h - Hugging Face "bnb-4bit" directories: what transformers +
 * bitsandbytes save_pretrained writes for a model loaded with
 * BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type="nf4",
 * bnb_4bit_use_double_quant=True). The NF4 format itself is ops/nf4.h.
 *
 * config.json carries "quantization_config" {"quant_method":
 * "bitsandbytes", "load_in_4bit": true, "bnb_4bit_quant_type": "nf4",
 * "bnb_4bit_use_double_quant": true, ...}; each quantized weight W (every
 * nn.Linear of the blocks, not lm_head) is six tensors:
 *
 *   W                                   U8 [ceil(n/2), 1]  codes, two per byte
 *   W.absmax                            U8 [blocks]        absmax codes
 *   W.quant_map                         F32 [16]           fsdp_nf4_code
 *   W.nested_absmax                     F32 [nested]       one per 256 absmax
 *   W.nested_quant_map                  F32 [256]          fsdp_nf4_dynamic_map
 *   W.quant_state.bitsandbytes__nf4     U8 [len]           JSON: {"quant_type":
 *       "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [out, in],
 *       "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": m}
 *
 * The rest of the model is stored as usual. Reading (bnb4.c) validates all
 * of it when the directory is opened (every tensor's dtype and length
 * against the JSON, the maps against ops/nf4.c's tables, the JSON's shape
 * against the model), keeping only each weight's nested absmax and offset
 * in memory; a range read then preads only the codes and absmax codes of
 * its blocks. Anything else (fp4, 8-bit, no double quantization, another
 * quant_method) is refused by name.
 *
 * Writing (bnb4_write.c, `fsdp convert --to hf --quantize nf4`) makes such
 * a directory from a model in floats, byte for byte as transformers +
 * bitsandbytes save it: the weights quantized from their values in the
 * storage dtype (bf16: "dtype": "bfloat16" in the quant_state and
 * config.json, the rest of the model in BF16; or fp32), inside each file
 * the tensors sorted by dtype (F32, BF16, U8) then name.
 */
#ifndef FSDP_CKPT_BNB4_H
#define FSDP_CKPT_BNB4_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt/safetensors.h"

struct fsdp_json;

#define FSDP_BNB4_STATE_SUFFIX ".quant_state.bitsandbytes__nf4"
#define FSDP_BNB4_STATE_MAX_BYTES 4096 /* a quant_state JSON: about 170 bytes */

/* One quantized weight of the directory. */
typedef struct fsdp_bnb4_tensor {
    char *name;                /* the file's name of W ("model.layers.0.mlp.up_proj.weight") */
    uint64_t numel;            /* the product of the quant_state's shape */
    uint64_t n_blocks;         /* fsdp_nf4_blocks(numel) */
    int ndim;
    uint64_t shape[FSDP_ST_MAX_DIMS]; /* the quant_state's "shape" */
    char dtype[16];            /* the quant_state's "dtype" ("bfloat16") */
    int codes_part, absmax_part;      /* the files (mf->part_fd) of W and W.absmax */
    uint64_t codes_offset, absmax_offset; /* absolute byte offsets of their data */
    float *nested;             /* [fsdp_nf4_nested_blocks(n_blocks)] */
    float offset;              /* nested_offset */
} fsdp_bnb4_tensor;

typedef struct fsdp_bnb4 {
    int n;
    fsdp_bnb4_tensor *t;       /* [n] sorted by name */
} fsdp_bnb4;

/* config.json's "quantization_config" qc: OK for bitsandbytes 4-bit NF4
 * with double quantization; FORMAT starting with `label` (the file) and
 * naming the key otherwise (another quant_method, 8-bit, fp4, no double
 * quantization, another quant storage). */
fsdp_status fsdp_bnb4_check_config(const char *label, const struct fsdp_json *qc);

/* Find and validate every quantized weight of files[0..n_files) (fds: their
 * open files, for the small tensors read now). FORMAT naming the file and
 * the tensor on anything inconsistent. The model's shapes are checked
 * later (fsdp_st_locate). *out: free with fsdp_bnb4_free. */
fsdp_status fsdp_bnb4_open(fsdp_bnb4 **out, const fsdp_st_file *files, const int *fds,
                           int n_files);
void fsdp_bnb4_free(fsdp_bnb4 *q);

/* What tensor `name` is to q: the index of the weight it stores the codes
 * of (>= 0), -2 one of a weight's other five tensors, -1 none of these. */
int fsdp_bnb4_role(const fsdp_bnb4 *q, const char *name);

/* Elements [a, b) of quantized weight t (flat, row-major), dequantized to
 * fp32 as bitsandbytes' flat dequantize_4bit. */
fsdp_status fsdp_bnb4_read(const fsdp_modelfile *mf, const fsdp_bnb4_tensor *t, uint64_t a,
                           uint64_t b, float *dst);

/* Blocks [first, first + count) of t as stored: codes (count * 32 bytes)
 * and each block's fp32 absmax (fsdp_nf4_absmax). Reads only those blocks'
 * bytes (and the absmax codes back to their nested block's start). */
fsdp_status fsdp_bnb4_read_blocks(const fsdp_modelfile *mf, const fsdp_bnb4_tensor *t,
                                  uint64_t first, uint64_t count, uint8_t *codes, float *absmax);

/* Write model m (host fp32 units, as modelfile.h's writer takes them) as a
 * bnb-4bit Hugging Face directory at path, atomically, with o's storage
 * dtype (F32 or BF16), shard size and companions (hfdir.h's writer does the
 * rest). INVALID_ARG for a family without Hugging Face names or a weight
 * that is not finite (named). */
fsdp_status fsdp_bnb4_write(const char *path, const fsdp_model *m, const float *const *units,
                            const fsdp_modelfile_write_opts *o);

/* config.json of m as a bnb-4bit directory stored in dt: the family's
 * (hf_config_write) with transformers' quantization_config among its
 * sorted keys, appended to out. */
struct fsdp_sbuf;
fsdp_status fsdp_bnb4_config_write(const fsdp_model *m, fsdp_dtype dt, struct fsdp_sbuf *out);

/* A weight's quant_state JSON (W.quant_state.bitsandbytes__nf4) into
 * buf[0..n), NUL-terminated: json.dumps of bitsandbytes' packed dict, the
 * offset as Python's repr of it as a double ("nested_offset":
 * 0.12599945068359375, 1e-05, 0.0). Returns its length (0: did not fit). */
size_t fsdp_bnb4_state_json(char *buf, size_t n, const uint64_t *shape, int ndim,
                            const char *dtype, float offset);

#endif /* FSDP_CKPT_BNB4_H */
