/*
 * modelfile_internal.h - the inside of src/ckpt/modelfile.h: the table entry
 * a weight format fills, the open-file object the formats share, and the
 * flat-file reader that llm.c and safetensors files (one tensor per
 * parameter at a byte offset) have in common.
 *
 * Adding a format: a src/ckpt/<format>.c that fills an
 * fsdp_modelfile_format, and one line in modelfile.c's table.
 * A format works out which family and config a file holds from what the
 * family's mapping (models/weights.h) says, never from a family it knows.
 */
#ifndef FSDP_CKPT_MODELFILE_INTERNAL_H
#define FSDP_CKPT_MODELFILE_INTERNAL_H

#include "ckpt/ckpt_dir.h"
#include "ckpt/modelfile.h"

/* Element types found in weight files. */
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
    uint64_t file_numel;         /* elements stored; fsdp's elements past them are zero */
    bool transposed;             /* the file holds the (cols, rows) transpose of fsdp's
                                  * row-major (rows, cols) */
    uint64_t rows, cols;         /* fsdp's shape as a matrix (a vector: numel x 1) */
    int part;                    /* multi-file formats: the file (mf->part_fd[part]) */
    int nf4;                     /* stored in NF4 (a bnb-4bit directory): 1 + its index in
                                  * mf->bnb4; 0: stored as dtype */
} fsdp_tensor_src;

struct fsdp_modelfile_format {
    const char *short_name;      /* "llmc": convert --to */
    const char *name;            /* "llm.c model file": in messages */
    const char *help;            /* "FILE.bin (llm.c)": in --help */
    const char *suffix;          /* ".bin": a file named so has this format; NULL: a directory */
    bool bf16;                   /* writes bf16 tensors as well as fp32 */
    bool ships_tokenizer;        /* writes the tokenizer's files beside the weights and splits
                                  * the weights into files (write opts companions, tokenizer,
                                  * shard_bytes) */
    const char *note;            /* what a written one is beyond its dtype, for messages
                                  * ("step 0, 1 device"), or NULL */
    /* Does `path` have this format's form (an existing directory holding
     * certain files)? No I/O beyond a stat. NULL: a path ending in
     * `suffix`. */
    bool (*claims)(const char *path);
    /* Open and validate: fill mf->path, family, config, dtype_name and the
     * format's own state (fd, impl). FORMAT/IO naming the file. NULL: a
     * format fsdp writes only (never claims a path, not in the --model help). */
    fsdp_status (*open)(fsdp_modelfile *mf, const char *path);
    /* Prepare reads for m (built from the file's family and config; the
     * caller has checked that): flat formats fill mf->src. */
    fsdp_status (*bind)(fsdp_modelfile *mf, const fsdp_model *m);
    /* A range read (modelfile.h); NULL: fsdp_flat_read_range over mf->src. */
    fsdp_status (*read_range)(const fsdp_modelfile *mf, int unit, size_t begin, size_t end,
                              float *dst);
    /* Release the format's own state (impl); NULL if there is none. */
    void (*close)(fsdp_modelfile *mf);
    /* Write m (modelfile.h: fsdp_modelfile_write_with) atomically; options a
     * format has no use for are ignored. */
    fsdp_status (*write)(const char *path, const fsdp_model *m, const float *const *units,
                         const fsdp_modelfile_write_opts *o);
};

struct fsdp_modelfile {
    const fsdp_modelfile_format *format;
    char path[FSDP_CKPT_PATH_MAX];     /* the file or checkpoint actually read */
    const fsdp_model_family *family;
    char config[FSDP_MODEL_CONFIG_MAX];
    fsdp_lora_config lora;             /* what the file's model has beyond its family and */
    char freeze[256];                  /* config (a checkpoint of a LoRA or --freeze run):
                                        * fsdp_modelfile_resolve applies them (models/lora.h) */
    char base[FSDP_CKPT_PATH_MAX];     /* then the base its frozen parameters come from */
    bool nf4_round_trip;               /* and its frozen linear weights read as their NF4
                                        * round trip (a QLoRA checkpoint: fsdp_model.nf4) */
    const char *dtype_name;
    const fsdp_model *model;           /* after bind */
    int fd;                            /* flat formats: the open file; else -1 */
    int n_parts;                       /* flat formats of several files (a sharded Hugging
                                        * Face directory): src[k].part indexes these */
    int *part_fd;                      /* [n_parts] open files */
    char **part_path;                  /* [n_parts] their paths, for messages */
    fsdp_tensor_src *src;              /* flat formats after bind: one per parameter, in
                                        * unit order */
    int *unit_base;                    /* [n_units + 1]: index of each unit's first parameter */
    void *impl;                        /* the format's own state */
    struct fsdp_bnb4 *bnb4;            /* a bnb-4bit directory's quantized weights (bnb4.h),
                                        * or NULL */
    struct fsdp_nf4_cache *nf4_cache;  /* fsdp_modelfile_read_nf4 of float weights: each
                                        * tensor's double quantization (modelfile_nf4.c) */
    void (*nf4_cache_free)(fsdp_modelfile *mf); /* set with nf4_cache by modelfile_nf4.c:
                                        * releases it and clears both (a callback, so that
                                        * modelfile.c, which modelfile_nf4.c reads through,
                                        * does not call back into it) */
};

extern const fsdp_modelfile_format fsdp_format_llmc;        /* llmc.c */
extern const fsdp_modelfile_format fsdp_format_safetensors; /* safetensors_model.c */
extern const fsdp_modelfile_format fsdp_format_hfdir;       /* hfdir.c */
extern const fsdp_modelfile_format fsdp_format_ckpt;        /* ckpt_model.c */
extern const fsdp_modelfile_format fsdp_format_peft;        /* peft.c: written only */

/* ---- helpers for a format's open (modelfile.c) ------------------------------------ */

/* mf->path = path; INVALID_ARG "path '...' is too long" if it does not fit. */
fsdp_status fsdp_modelfile_set_path(fsdp_modelfile *mf, const char *path);
/* mf->impl = `bytes` zeroed bytes, the format's own state (its close frees
 * it); OOM "out of host memory". */
fsdp_status fsdp_modelfile_impl_alloc(fsdp_modelfile *mf, size_t bytes);

/* ---- helpers (modelfile_flat.c) ------------------------------------------------ */

/* Bytes per element (0 for FSDP_FILE_OTHER). */
int fsdp_file_dtype_size(fsdp_file_dtype dt);
/* Convert n elements (little-endian storage) to fp32. */
void fsdp_file_dtype_to_f32(fsdp_file_dtype dt, const void *src, size_t n, float *dst);

/* n bytes at absolute offset `off` of file `part` (mf->part_fd; mf->fd for
 * a single-file format), counted in fsdp_modelfile_thread_bytes_read
 * (modelfile_pread.c). */
fsdp_status fsdp_modelfile_pread(const fsdp_modelfile *mf, int part, void *buf, size_t n,
                                 uint64_t off);

/* Allocate mf->src and mf->unit_base for m (src zeroed). */
fsdp_status fsdp_flat_prepare(fsdp_modelfile *mf, const fsdp_model *m);

/* The flat reader: elements [begin, hi) of unit `unit` (hi <= the unit's
 * numel) through mf->src and mf->fd (or mf->part_fd[src->part] when the
 * format has several files). */
fsdp_status fsdp_flat_read_range(const fsdp_modelfile *mf, int unit, size_t begin, size_t hi,
                                 float *dst);

/* The family's name for the model the file holds, for messages:
 * "GPT-2 'layers=2,...'". */
void fsdp_modelfile_describe(const fsdp_modelfile *mf, char *buf, size_t n);

/* Build family f's model of `config` for a file being opened; a config the
 * family refuses is FORMAT "<what> '<path>' describes a model fsdp cannot
 * build: ...". */
fsdp_status fsdp_modelfile_build(const char *what, const char *path,
                                 const fsdp_model_family *f, const char *config, fsdp_model *m);

#endif /* FSDP_CKPT_MODELFILE_INTERNAL_H */
