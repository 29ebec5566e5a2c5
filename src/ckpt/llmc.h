/*
 * llmc.h - llm.c's GPT-2 model file: 256 x int32 header (magic 20240326,
 * version 3 = fp32 or 5 = bf16, maxT, V, L, NH, C, Vp), then the parameters
 * in llm.c's order (wte (Vp,C), wpe, ln1w (L,C), ln1b, qkvw (L,3C,C), qkvb,
 * attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb).
 */
#ifndef FSDP_CKPT_LLMC_H
#define FSDP_CKPT_LLMC_H

#include "models/gpt2.h"

/* Read and validate the header: fills cfg and the file's dtype. A bad magic,
 * version, shape or file size is FSDP_STATUS_FORMAT naming the file. */
fsdp_status fsdp_llmc_read_config(const char *path, fsdp_gpt2_config *cfg, fsdp_dtype *file_dt);

/* Read every parameter into host fp32 unit buffers: units[u] holds
 * m->units[u].numel floats, laid out as the unit's parameter specs say. The
 * model must have the file's config. */
fsdp_status fsdp_llmc_read(const char *path, const fsdp_model *m, float *const *units);

/* Write the model (units as above) as an llm.c file in dtype dt (fp32 ->
 * version 3, bf16 -> version 5), atomically (temporary name, fsync, rename). */
fsdp_status fsdp_llmc_write(const char *path, const fsdp_model *m, const float *const *units,
                            fsdp_dtype dt);

#endif /* FSDP_CKPT_LLMC_H */
