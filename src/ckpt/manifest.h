/*
 * manifest.h - the checkpoint manifest: a text file of `key value` lines
 * that says what was trained (model, every parameter's name, shape and
 * offset, every unit's shard sizes), where (world size, sharding) and how
 * far (step, optimizer step count, data position).
 *
 * Versions. 4 (written now) is version 3 with per-parameter shards: each
 * parameter line ends `rows R at A`, file k holding rows [k R, (k+1) R)
 * of it (fewer or none at the end) at element A of its unit arrays
 * (engine/shardmap.h's layout), so resharding re-slices rows
 * (fsdp_ckpt_param_run). 3 is version 2 with the tokenizer the data was
 * read with (`tokenizer`) and a last line `checksum <XXH64 of every byte
 * before it, 16 hex digits>`: the shard files cannot tell a model's heads
 * or rope settings from its shapes, so an edited or damaged manifest would
 * otherwise rebuild another model over the same numbers; every reader
 * refuses one whose checksum does not match. Version 3 may also list the
 * tokenizer files the checkpoint carries (`tokenizer_file` lines, one per
 * file, after `tokenizer`; ckpt_tok.h), optional like `shard_ranks`: a build
 * older than them refuses such a manifest by that key's name. 2 records the model as
 * `model_family <name>` and `model_config <the family's canonical
 * config>`: one source of truth, rebuilt through the model registry; it
 * has no checksum and is checked against its shard files only (sizes, run
 * id, step), as version 1 is. 1 (written before the registry)
 * recorded a GPT-2 as `model_spec`, a `gpt2 layers=.. heads=..` line and
 * vocab_size / padded_vocab_size / max_seq_len; it is read into the same
 * in-memory form, and its lines must agree with each other. Either way the
 * reader builds the recorded model and refuses unit or parameter lines that
 * contradict it.
 */
#ifndef FSDP_CKPT_MANIFEST_H
#define FSDP_CKPT_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/shard_file.h"
#include "models/registry.h"

#define FSDP_CKPT_VERSION 4     /* what this build writes */
#define FSDP_CKPT_VERSION_MIN 1 /* the oldest it reads */
#define FSDP_CKPT_MANIFEST_LINE_MAX 1024 /* characters of one line, written and read */
#define FSDP_CKPT_TOK_FILES_MAX 16       /* tokenizer files a checkpoint carries */
#define FSDP_CKPT_TOK_KEY "tokenizer_file"       /* the manifest key of one file */
#define FSDP_CKPT_TOK_JSON "tokenizer.json"      /* the tokenizer itself: listed first */
#define FSDP_CKPT_TOK_BYTES_MAX ((size_t)256 << 20) /* one file's size (Llama 3's: 9 MB) */
#define FSDP_CKPT_TOK_NAME_MAX 32        /* bytes of one's name, NUL included */
#define FSDP_CKPT_CHAT_FORMAT_MAX 16     /* bytes of a chat_format name, NUL included */

/* One file of the tokenizer a checkpoint carries (ckpt_tok.h): a
 * `tokenizer_file <name> <bytes> <XXH64, 16 hex digits>` line of a
 * version-3 manifest, and the file CKPT/<name> beside it. */
typedef struct fsdp_ckpt_tok_file {
    char name[FSDP_CKPT_TOK_NAME_MAX]; /* one of fsdp_hfdir_companions */
    uint64_t size_bytes;
    uint64_t xxh64;           /* XXH64 (seed 0) of its bytes */
    char *data;               /* when writing: its bytes (owned: freed with the manifest);
                                 NULL as read */
    int line;                 /* manifest line it was read from (0: built in memory) */
} fsdp_ckpt_tok_file;

typedef struct fsdp_ckpt_param {
    char name[64];
    int ndim;
    int64_t shape[4];
    size_t numel;
    size_t offset;            /* in the unit's flat buffer */
    size_t shard_rows;        /* version 4: rows per shard file (0 before: the unit's flat
                                 buffer split in equal ranges) */
    size_t shard_at;          /* version 4: its first element in a file's unit arrays */
    int line;                 /* manifest line it was read from (0: built in memory) */
} fsdp_ckpt_param;

typedef struct fsdp_ckpt_unit {
    char name[32];
    size_t numel;             /* unpadded */
    size_t padded_numel;
    size_t shard_numel;       /* per rank file; = padded_numel when replicated */
    int n_params;
    fsdp_ckpt_param *params;  /* [n_params], owned */
    int line;
} fsdp_ckpt_unit;

/* Everything needed to resume: what was trained (model, parameter names,
 * shapes and shard ranges), where (world size, sharding), and how far (step,
 * Adam t, data position; the RNG is counter-based, so (seed, data position)
 * is its whole state). Rank r's file of a world of N holds, for unit u,
 * elements [r * S, (r + 1) * S) of the padded flat buffer (S = shard_numel),
 * or all of it when replicated (shard none). */
typedef struct fsdp_ckpt_manifest {
    int version;              /* as read (1 or 2); written as FSDP_CKPT_VERSION */
    uint64_t run_id;          /* random per training process; in every shard file */
    uint64_t step;            /* optimizer steps completed */
    uint64_t adam_t;          /* the optimizer's step count (key named when AdamW was the only one) */
    uint64_t data_sequences;  /* sequences consumed = step * batch * world * accum */
    uint64_t seed;            /* parameter init, data and sampling */
    int world_size;           /* ranks of the run (the global batch is batch x world_size x
                                 grad_accum) */
    char shard[16];           /* full | grad-op | none | hybrid */
    bool replicated;          /* shard none: every file holds whole units */
    int shard_ranks;          /* ranks each unit is split over: world_size, 1 when
                                 replicated, a node's ranks for hybrid (whose other nodes
                                 hold copies and write no files); 0 when writing: the
                                 default. Written as `shard_ranks` only when it is not the
                                 default, so other manifests read as before */
    int batch, seq, grad_accum;
    int steps_total;          /* --steps of the run that wrote it (lr schedule) */
    char compute_dtype[8];    /* fp32 | bf16 (informational: state is fp32) */
    /* The optimizer and the names of its state arrays, stored after the
     * master in every shard file. Written as the lines `optimizer NAME` and
     * `optim_state A,B` (or `-`); a version-1 manifest (without them) is
     * AdamW's: adam_m, adam_v. An empty name when writing means the same. */
    char optimizer[FSDP_CKPT_ARRAY_NAME_MAX];
    int n_optim_state;
    char optim_state[FSDP_CKPT_MAX_ARRAYS - 1][FSDP_CKPT_ARRAY_NAME_MAX];
    char model_name[FSDP_MODEL_NAME_MAX];     /* for messages: "tiny" */
    char model_family[32];                    /* registry name: "gpt2" */
    char model_config[FSDP_MODEL_CONFIG_MAX]; /* the family's canonical config */
    int model_line;           /* manifest line of the model's config (0: built in memory) */
    char data[512];           /* data spec: a resume on other data needs --allow-data-change */
    char tokenizer[512];      /* the tokenizer the data was read with ("" none; version 3) */
    bool tokenizer_recorded;  /* read from a manifest that records it (version 3) */
    /* The tokenizer's files the checkpoint carries (optional `tokenizer_file`
     * lines of version 3, written only when there are some, so a manifest
     * without them reads as before): tokenizer.json first. */
    int n_tok_files;
    fsdp_ckpt_tok_file tok_files[FSDP_CKPT_TOK_FILES_MAX];
    /* How the run rendered {"messages"} rows (optional version-3 line `chat_format NAME`,
     * written only by a run that read such rows, so other manifests read as before): the
     * --chat-format name of the renderer it used, "template" (the tokenizer's chat
     * template) or a built-in format's. A resume, and eval and sample of the checkpoint,
     * take it when not given --chat-format. "" : not recorded. */
    char chat_format[FSDP_CKPT_CHAT_FORMAT_MAX];
    /* A run that did not train every weight (optional version-3 lines, written only then):
     * `lora R ALPHA RSLORA TARGETS`, `freeze PATTERNS`, and `base HASH PATH`, the model the
     * frozen parameters come from (they are not in the shard files: the units and their
     * parameters list the trainable ones only). HASH: fsdp_ckpt_base_hash. */
    fsdp_lora_config lora;    /* r = 0: none */
    char freeze[256];         /* "" : none */
    char base[512];           /* "" : none (nothing frozen) */
    uint64_t base_hash;
    /* `quantize nf4` (optional version-3 line, written only then): the frozen linear weights
     * were stored in NF4, so the base's values are their NF4 round trip (ops/nf4.h). */
    bool nf4;
    /* The learning-rate schedule of the run that wrote it (optional version-3 line
     * `schedule NAME LR MIN_LR WARMUP DECAY_FRAC`, written only when `schedule` is set, so a
     * manifest without it reads as before: schedule ""). NAME: the --schedule registry's
     * name (this layer does not interpret it); lr and decay_frac are floats written with 9
     * significant digits, min_lr a double with 17, so each reads back exactly. */
    char schedule[16];        /* "" : not recorded */
    double lr, min_lr, decay_frac;
    int warmup;
    /* The held-out standing (--eval-data) after `step` (optional version-3 line
     * `eval_standing BEST BEST_STEP N_WORSE`, written once an evaluation has run): the
     * lowest eval loss so far (9 significant digits: a float), the step it was measured
     * after, and the evaluations since without a lower one (--early-stop's count). */
    bool eval_recorded;       /* false: none (an older manifest, or no evaluation yet) */
    double eval_best;
    uint64_t eval_best_step;
    int eval_n_worse;
    int n_units;
    fsdp_ckpt_unit *units;    /* [n_units], owned */
} fsdp_ckpt_manifest;

/* Release what the manifest owns and zero it. */
void fsdp_ckpt_manifest_free(fsdp_ckpt_manifest *m);

/* Record which model this is (name, family, canonical config). */
void fsdp_ckpt_manifest_set_model(fsdp_ckpt_manifest *m, const fsdp_model *model);

/* Describe a model's units and parameters in m->units (allocated; the rest
 * of m is left alone) for a world of n_ranks with the given shard numel per
 * unit (shard_numel[u]) and padded numel (padded_numel[u]); each parameter's
 * rows per shard as one shard holds them (shard_rows = its rows, shard_at = its
 * offset), which a sharded writer replaces with its own. */
fsdp_status fsdp_ckpt_manifest_set_units(fsdp_ckpt_manifest *m, const fsdp_model *model,
                                         const size_t *padded_numel, const size_t *shard_numel);

/* Write the manifest to `path` and fsync it: version 4, or 3 (no rows) when
 * its shards are flat ranges (a manifest read from an older checkpoint). IO
 * error naming the path. */
fsdp_status fsdp_ckpt_manifest_write(const char *path, const fsdp_ckpt_manifest *m);

/* Read and validate a manifest of version FSDP_CKPT_VERSION_MIN ..
 * FSDP_CKPT_VERSION: every key of its version present once, every number
 * in range and consistent (shard sizes vs world size, parameter offsets
 * tiling each unit), the recorded model one this build can build, the
 * unit and parameter lines that model's, and (version 3) the checksum
 * line matching the text. A malformed, self-contradicting or edited file
 * is FSDP_STATUS_FORMAT naming the file and the line (a field's error
 * before the checksum's). On failure *m is left zeroed. */
fsdp_status fsdp_ckpt_manifest_read(const char *path, fsdp_ckpt_manifest *m);

/* The manifest's model must be `model`: the same units and parameters
 * (names, shapes, offsets, unpadded sizes) and the same family and config
 * (a GPT-2 with other heads has the same shapes). FSDP_STATUS_FORMAT naming
 * `path`, the line of the first difference and the --model to use. */
fsdp_status fsdp_ckpt_manifest_check_model(const fsdp_ckpt_manifest *m, const char *path,
                                           const fsdp_model *model);

/* Build the model the manifest records (family and config) and check the
 * unit and parameter lines against it: FORMAT naming `path` and the line
 * when the family is not in this build, the config does not build, or a
 * line contradicts the model. Free *out with fsdp_model_free. */
fsdp_status fsdp_ckpt_manifest_model(const fsdp_ckpt_manifest *m, const char *path,
                                     fsdp_model *out);

/* The shard files that hold each unit once: rank files 0 .. n - 1 (a
 * replicated checkpoint has world_size files, each a whole copy). */
static inline int fsdp_ckpt_n_shards(const fsdp_ckpt_manifest *m)
{
    return m->replicated ? 1 : m->shard_ranks > 0 ? m->shard_ranks : m->world_size;
}

/* First element of rank r's shard of unit u in the unit's padded buffer. */
static inline size_t fsdp_ckpt_shard_first(const fsdp_ckpt_manifest *m, int u, int r)
{
    return m->replicated ? 0 : (size_t)r * m->units[u].shard_numel;
}

/* Where shard file k of checkpoint m holds the real elements of parameter
 * p of unit u: elements [*flat, *flat + return value) of the unit's flat
 * buffer, at element *at of the file's unit arrays; 0 when it holds none.
 * Version 4 splits each parameter by rows; older versions split the unit's
 * flat buffer into equal ranges. Every file of a replicated checkpoint
 * holds everything. */
static inline size_t fsdp_ckpt_param_run(const fsdp_ckpt_manifest *m, int u,
                                         const fsdp_ckpt_param *p, int k, size_t *flat,
                                         size_t *at)
{
    if (m->replicated)
        k = 0;
    if (p->shard_rows) {
        size_t rows = p->ndim > 0 ? (size_t)p->shape[0] : 1, rn = p->numel / rows;
        size_t r0 = (size_t)k * p->shard_rows, r1 = r0 + p->shard_rows;
        *flat = p->offset + r0 * rn;
        *at = p->shard_at;
        return r0 < rows ? ((r1 < rows ? r1 : rows) - r0) * rn : 0;
    }
    size_t lo = fsdp_ckpt_shard_first(m, u, k), hi = lo + m->units[u].shard_numel;
    size_t a = p->offset > lo ? p->offset : lo, b = p->offset + p->numel;
    b = b < hi ? b : hi;
    *flat = a;
    *at = a - lo;
    return a < b ? b - a : 0;
}

#endif /* FSDP_CKPT_MANIFEST_H */
