/*
 * manifest_internal.h - what the two halves of the manifest reader share:
 * manifest.c (the file, its lines, units and parameters, the checksum) and
 * manifest_header.c (the header's keys, each parsed and bounded, and the
 * checks across them), and manifest_lex.c below both (errors, numbers,
 * names, tokens). Not part of the ckpt module's interface.
 */
#ifndef FSDP_CKPT_MANIFEST_INTERNAL_H
#define FSDP_CKPT_MANIFEST_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/manifest.h"

#define MANIFEST_MIN_LINE 32 /* bytes of the shortest unit or param line */
#define MAX_NUMEL ((uint64_t)1 << 48)     /* per unit or parameter */
#define MAX_DIM ((uint64_t)1 << 40)
#define MAX_WORLD 65536
#define MAX_SMALL (1 << 24)               /* batch, seq, vocab, ... */

/* What a version-1 manifest says about its model, held until the header
 * is complete and its lines can be checked against each other. */
typedef struct fsdp_mf_v1_model {
    char spec[FSDP_MODEL_NAME_MAX];   /* model_spec; "" for '-' */
    char gpt2[FSDP_MODEL_CONFIG_MAX]; /* the 'gpt2' line as a config key list; "" for '-' */
    int vocab_size, padded_vocab_size, max_seq_len;
    int spec_line, gpt2_line, sizes_line;
} fsdp_mf_v1_model;

/* Version 1 knew one model family; its 'gpt2' line named it. */
#define V1_FAMILY "gpt2"

typedef struct fsdp_mf_parser {
    const char *path;
    int line;
    fsdp_mf_v1_model v1;
} fsdp_mf_parser;

enum fsdp_mf_key {
    K_FORMAT, K_VERSION, K_RUN_ID, K_STEP, K_ADAM_T, K_DATA_SEQUENCES, K_SEED, K_WORLD_SIZE,
    K_SHARD, K_BATCH, K_SEQ, K_GRAD_ACCUM, K_STEPS_TOTAL, K_COMPUTE_DTYPE, K_MASTER_DTYPE,
    K_OPTIM_DTYPE, K_MODEL_NAME, K_MODEL_SPEC, K_GPT2, K_VOCAB_SIZE, K_PADDED_VOCAB_SIZE,
    K_MAX_SEQ_LEN, K_MODEL_FAMILY, K_MODEL_CONFIG, K_DATA, K_BLOCK_NUMEL, K_OPTIMIZER,
    K_OPTIM_STATE, K_SHARD_RANKS, K_TOKENIZER, K_LORA, K_FREEZE, K_BASE, K_SCHEDULE,
    K_EVAL_STANDING, K_QUANTIZE, K_CHAT_FORMAT, K_COUNT
};

/* Where the reader is: the header's `key value` lines, then (after
 * `units N`) each unit's line and its parameter lines, then `end`. */
typedef struct fsdp_mf_reader {
    fsdp_mf_parser ps;
    bool seen[K_COUNT];       /* header keys read so far */
    enum { HEADER, UNITS, END } phase;
    int unit, param;          /* UNITS: the unit being read, and its next parameter */
    size_t offset;            /* where that parameter must start in the unit */
    size_t at;                /* version 4: where its rows may start in a shard, at least */
} fsdp_mf_reader;

/* FORMAT: "<path>: line <n>: <message>" (the error is set). */
fsdp_status fsdp_mf_bad(const fsdp_mf_parser *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Strict unsigned decimal: digits only, no sign, no overflow, <= max. */
bool fsdp_mf_u64(const char *s, uint64_t max, uint64_t *out);
/* Strict decimal int in [lo, hi]. */
bool fsdp_mf_int(const char *s, int lo, int hi, int *out);
/* Exactly 16 lower-case hex digits. */
bool fsdp_mf_hex64(const char *s, uint64_t *out);
/* A name of 1..max - 1 printable characters without spaces. */
bool fsdp_mf_name_valid(const char *s, size_t max);
/* Split a line into space-separated tokens (in place). Returns the count,
 * or -1 if there are more than max. */
int fsdp_mf_tokenize(char *s, char **tok, int max);

/* The pieces above are manifest_lex.c's. A header line (manifest_header.c): `key value`, each key once, 'format'
 * and 'version' first, only the keys of that version; or `units N`, which
 * ends the header (every key of its version read, the fields checked
 * against each other, r->phase UNITS, m->units allocated). */
fsdp_status fsdp_mf_header_line(fsdp_mf_reader *r, char *line, size_t len, int lines_left,
                                fsdp_ckpt_manifest *m);

#endif /* FSDP_CKPT_MANIFEST_INTERNAL_H */
