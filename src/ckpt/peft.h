/*
 * peft.h - PEFT LoRA adapter directories, in and out: what
 * `PeftModel.save_pretrained` writes and `PeftModel.from_pretrained` loads
 * (https://huggingface.co/docs/peft; facts and formats only).
 *
 *   DIR/adapter_config.json        {"peft_type": "LORA", "r": 4, "lora_alpha": 8,
 *                                   "target_modules": ["q_proj", ...] or "all-linear",
 *                                   "use_rslora": false, "base_model_name_or_path": ...}
 *   DIR/adapter_model.safetensors  the adapters, named as fsdp names them
 *                                  (models/lora.h) behind "base_model.model.":
 *                                  base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
 *
 * Reading: the config gives an fsdp_lora_config (the caller builds the
 * model with fsdp_model_add_lora from it); every key fsdp does not
 * implement with a value that changes the math (dropout, DoRA, biases,
 * fan_in_fan_out, modules_to_save, per-layer or per-module patterns, a
 * regular expression as target_modules) is refused naming the file and
 * the key; other unknown keys are ignored. Binding holds the weights file
 * against the model both ways: every adapter of the model present with its
 * exact shape and a dtype fsdp converts (F32, BF16, F16), r as the config
 * says, no other tensor. Reads are preads of one parameter's element range,
 * so a rank reads only its shard, from any thread.
 *
 * Writing: both files under "<DIR>.tmp.<pid>", renamed into place at the
 * end (hfdir.h: fsdp_dir_write_begin); the config as PEFT writes it
 * (indented, keys sorted), the tensors in F32 sorted by name.
 */
#ifndef FSDP_CKPT_PEFT_H
#define FSDP_CKPT_PEFT_H

#include <stdbool.h>
#include <stddef.h>

#include "ckpt/safetensors.h"
#include "models/model.h"

#define FSDP_PEFT_CONFIG "adapter_config.json"
#define FSDP_PEFT_WEIGHTS "adapter_model.safetensors"
#define FSDP_PEFT_PREFIX "base_model.model." /* PEFT's names: prefix + fsdp's name */
#define FSDP_PEFT_CONFIG_MAX_BYTES ((size_t)1 << 20)

/* An open adapter directory. */
typedef struct fsdp_peft_dir {
    char path[FSDP_CKPT_PATH_MAX];            /* the directory, as given */
    char config_path[FSDP_CKPT_PATH_MAX + 32]; /* DIR/adapter_config.json (messages) */
    fsdp_lora_config lora;                    /* r, lora_alpha, use_rslora, target_modules */
    char base[FSDP_CKPT_PATH_MAX];            /* base_model_name_or_path ("" when null) */
    bool targets_by_last;                     /* target_modules was a list of paths longer
                                               * than lora.targets holds, kept as their
                                               * last components (peft.c: read_targets) */
    fsdp_st_file st;                          /* adapter_model.safetensors's header */
    int fd;                                   /* that file, open for preads; -1 when closed */
    const fsdp_model *model;                  /* after bind */
    int *unit_base;                           /* after bind: [n_units + 1] first flat index of
                                               * each unit's parameters */
    int *tensor_of;                           /* after bind: per parameter (unit order) its
                                               * index in st.tensors, -1 for a base parameter */
} fsdp_peft_dir;

/* Open the adapter directory `dir`: parse and check adapter_config.json
 * (FORMAT for a malformed file or value, UNSUPPORTED for a feature fsdp
 * does not implement, IO when it is missing: each naming the file and the
 * key) and validate adapter_model.safetensors's header (FORMAT naming the
 * file, and the tensor whose data a truncated file lacks). On failure *d
 * holds nothing to close. */
fsdp_status fsdp_peft_open(const char *dir, fsdp_peft_dir *d);

/* Hold the weights against m, a model built with fsdp_model_add_lora from
 * d->lora (m outlives d's reads): every adapter parameter of m present as
 * FSDP_PEFT_PREFIX + its name, of its shape and dtype F32, BF16 or F16, r
 * as adapter_config.json says; no tensor that is not one of them. FORMAT
 * naming the file and the tensor otherwise; INVALID_ARG when m has no
 * adapters or another r or scale than the directory. */
fsdp_status fsdp_peft_bind(fsdp_peft_dir *d, const fsdp_model *m);

/* Elements [first, first + n) (row-major) of adapter parameter `param` of
 * unit `unit` of the bound model, as fp32, into dst. Thread-safe (preads,
 * no shared state). INVALID_ARG for a base parameter or a range past the
 * parameter; IO/FORMAT naming the file and the tensor when the read fails
 * or comes back short. */
fsdp_status fsdp_peft_read(const fsdp_peft_dir *d, int unit, int param, size_t first, size_t n,
                           float *dst);

/* Release d (safe on a zeroed or failed-open d). */
void fsdp_peft_close(fsdp_peft_dir *d);

/* Write the adapters of m (a model with fsdp_model_add_lora's adapters) as
 * the PEFT directory `dir` (which must not exist, or be empty): units[u]
 * holds unit u's trainable elements [0, train_numel) in fp32 (the
 * adapters are trainable, so they are all there). The config says m->lora's
 * r, alpha and rslora, `base` as base_model_name_or_path (NULL: null), and
 * as target_modules the sorted adapted module names: the last component
 * ("q_proj") when every module of that name has adapters, else the full
 * paths. Atomic; on failure nothing is left at dir. */
fsdp_status fsdp_peft_write(const char *dir, const fsdp_model *m, const float *const *units,
                            const char *base);

#endif /* FSDP_CKPT_PEFT_H */
