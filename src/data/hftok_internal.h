/*
 * hftok_internal.h - internal to src/data: the tokenizer object shared by
 * its reader (tokjson.c, which fills it from tokenizer.json) and its
 * encoder/decoder (hftok.c). Nothing else includes this.
 */
#ifndef FSDP_DATA_HFTOK_INTERNAL_H
#define FSDP_DATA_HFTOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/bpe.h"
#include "data/hftok.h"

#define HFTOK_MAX_STEPS 8          /* pre-tokenizer steps */
#define HFTOK_MAX_ID (1 << 24)     /* largest accepted id + 1 (real vocabularies: < 2^18) */

/* How a split step keeps what its pattern matched (tokenizers'
 * SplitDelimiterBehavior): Isolated keeps matches and the text between
 * them as pieces; Removed keeps only the text between matches. */
typedef enum hftok_behavior {
    HFTOK_ISOLATED = 0,
    HFTOK_REMOVED,
} hftok_behavior;

/* One pre-tokenizer step. Each piece from the step before is split by re
 * (NULL: kept whole), after a leading space is added to it when
 * prefix_space is set and it does not start with one (ByteLevel's
 * add_prefix_space). */
typedef struct hftok_step {
    pcre2_code *re;                /* compiled by fsdp_hftok_compile(..., split = true) */
    pcre2_match_data *md;
    char *pattern;                 /* the pattern's text and the tokenizer.json field it came */
    char *field;                   /* from, for messages */
    hftok_behavior behavior;
    bool prefix_space;
    uint8_t *buf;                  /* prefix_space: the piece with its space */
    size_t buf_cap;
} hftok_step;

typedef struct hftok_added {
    char *content;                 /* UTF-8, len bytes */
    size_t len;
    int id;
    bool special;
} hftok_added;

struct fsdp_hftok {
    char *label;                   /* the file, for messages */
    fsdp_bpe *bpe;
    bool nfc;                      /* normalizer: Unicode NFC (Qwen2) */
    hftok_step steps[HFTOK_MAX_STEPS];
    int n_steps;
    hftok_added *added;            /* [n_added] */
    int n_added;
    /* added tokens as one alternation, longest first, each marked with its
     * index in added[]: [0] every token, [1] the non-special ones (NULL
     * when there are none) */
    pcre2_code *added_re[2];
    pcre2_match_data *added_md;
    int vocab;                     /* 1 + largest id */
    uint8_t *dec_bytes;            /* every token's decoded bytes, back to back */
    uint32_t *dec_off;             /* [vocab + 1]; an id without a token has length 0 */
    int bos, eos;                  /* post-processor: around $A, or -1 */
    int eot;                       /* end of a document (hftok.h), or -1 */
    /* encoding state (one thread at a time) */
    pcre2_match_context *mctx;     /* the split steps' limits (hftok.c), made at the first encode */
    double match_t0;               /* when this text's encode began (hftok.c: split_find) */
    double match_budget_s;         /* ... the seconds it may take */
    unsigned match_calls;          /* split matches since the last look at the clock */
    fsdp_ids out;
    fsdp_hftok_sink sink;
    void *sink_arg;
    const char *seg_base;          /* the segment being pre-tokenized, for progress */
    size_t seg_len, seg_start, seg_src_len;
};

/* Compile a pattern for the encoder: UTF-8, Unicode properties, invalid
 * UTF-8 in subjects allowed, JIT when available. Oniguruma's \s (what
 * tokenizers uses) is Unicode White_Space; PCRE2's misses U+0085 (NEL), so
 * \s and \S are rewritten to include it. A split step's pattern (split)
 * is also compiled for windowed matching (an offset limit, JIT for hard
 * partial matches: hftok.c). FORMAT naming `field` when the pattern does
 * not compile. */
fsdp_status fsdp_hftok_compile(const fsdp_hftok *t, const char *field, const char *pattern,
                               size_t len, bool literal, bool split, pcre2_code **out);

#endif /* FSDP_DATA_HFTOK_INTERNAL_H */
