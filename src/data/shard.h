/*
 * shard.h - llm.c token shard files: their two layouts, and a writer.
 *
 * A shard is a 256 x int32 header {magic, version, token count, 0...}
 * followed by the tokens, little-endian:
 *   magic 20240520, version 1: uint16 tokens (llm.c's GPT-2 shards);
 *   magic 20240801, version 7: uint32 tokens (llm.c's Llama 3 shards, for
 *   vocabularies past 65536 ids such as Llama 3's 128256).
 * The token count is an int32, so one shard holds at most 2^31 - 1 tokens.
 */
#ifndef FSDP_DATA_SHARD_H
#define FSDP_DATA_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/fileio.h"
#include "fsdp/fsdp.h"

#define FSDP_SHARD_HEADER_BYTES 1024
#define FSDP_SHARD_MAGIC_U16 20240520
#define FSDP_SHARD_VERSION_U16 1
#define FSDP_SHARD_MAGIC_U32 20240801
#define FSDP_SHARD_VERSION_U32 7
#define FSDP_SHARD_MAX_TOKENS ((uint64_t)INT32_MAX)

typedef struct fsdp_shard_writer fsdp_shard_writer;

/* Start writing `path` atomically (a temporary name, renamed at close)
 * for token ids below vocab_size: uint16 tokens when vocab_size <= 65536,
 * else uint32. */
fsdp_status fsdp_shard_writer_open(fsdp_shard_writer **out, const char *path, int vocab_size);

/* Append n ids. INVALID_ARG for an id outside 0..vocab_size-1, or when
 * the shard would pass FSDP_SHARD_MAX_TOKENS (nothing is appended then). */
fsdp_status fsdp_shard_writer_add(fsdp_shard_writer *w, const int *ids, size_t n);

/* Tokens written so far. */
uint64_t fsdp_shard_writer_count(const fsdp_shard_writer *w);

/* Finish: with commit, write the final header, fsync and rename into
 * place; without, remove the temporary file. Frees w (NULL is a no-op). */
fsdp_status fsdp_shard_writer_close(fsdp_shard_writer *w, bool commit);

/* Finish without putting the shard in place: write the final header,
 * close, and hand the temporary file to `stage` (core/fileio.h), which
 * renames it when published. Frees w. */
fsdp_status fsdp_shard_writer_stage(fsdp_shard_writer *w, fsdp_staged *stage);

/* ---- tokenizing a corpus into shards (tokenize.c) ---------------------------------- */

typedef struct fsdp_tokenize_opts {
    const char *in;            /* a text file (one document) or a .jsonl file (jsonl.h) */
    const char *out;           /* OUT.bin */
    const char *tokenizer;     /* tokenizer.json */
    const char *format;        /* "text", "jsonl", or NULL: by IN's extension */
    const char *chat_format;   /* messages rows; NULL: from the tokenizer (chat.h) */
    uint64_t shard_tokens;     /* 0: one file OUT; else OUT_000000.bin, OUT_000001.bin, ...
                                * ("OUT" without ".bin") of at most this many tokens */
    /* called now and then with how far it is (may be NULL) */
    void (*progress)(void *arg, size_t bytes_done, size_t bytes_total, uint64_t tokens);
    void *arg;
} fsdp_tokenize_opts;

typedef struct fsdp_tokenize_result {
    uint64_t tokens;           /* written, separators included */
    uint64_t documents;        /* the text file, or the rows */
    size_t bytes;              /* of IN */
    int n_shards;
    int token_bytes;           /* 2 or 4 */
    int n_removed;             /* shards of an earlier run removed (numbers >= n_shards) */
    int removed_lo, removed_hi;/* the lowest and highest number removed */
    uint64_t special_text;     /* special-token strings in rows' text, kept as text */
    char chat[320];            /* how messages rows were rendered (chat.h), or "" */
} fsdp_tokenize_result;

/* Tokenize IN into llm.c shards: each document (the whole text file, or a
 * {"text"} row) preceded by the tokenizer's document token (data.h) unless
 * it begins with it; prompt/completion and messages rows exactly as
 * training renders them (the same tokens, without masks since shards have
 * none: a chat template's own BOS, if it writes one, and nothing added);
 * special tokens in the text stay text. Outputs appear only when every
 * shard is complete, all together (one sync): on failure no file at any
 * output path has changed and none of this call's temporary files remain.
 * With shard_tokens, the shards OUT_<k>.bin of an earlier run with
 * k >= n_shards are removed afterwards (res->n_removed), so the glob
 * OUT_*.bin reads this run's shards only. INVALID_ARG for an empty OUT. */
fsdp_status fsdp_tokenize_file(const fsdp_tokenize_opts *o, fsdp_tokenize_result *res);

/* The length of OUT without a final ".bin": the shards' common stem. */
size_t fsdp_tokenize_stem_len(const char *out);

/* The name of shard k of OUT: OUT_<k>.bin, k in at least 6 digits ("OUT"
 * without its ".bin"). INVALID_ARG when it does not fit n. */
fsdp_status fsdp_tokenize_shard_path(const char *out, int k, char *buf, size_t n);

#endif /* FSDP_DATA_SHARD_H */
