/*
 * tokenizer.h - llm.c's GPT-2 tokenizer file (gpt2_tokenizer.bin): the
 * decoding table from token id to bytes, used by `fsdp sample` to print
 * text for models with a GPT-2 vocabulary.
 *
 * Format (little-endian): uint32[256] header {magic 20240328, version (1 or
 * 2), vocab_size, eot_token (version 2 only), 0...}, then vocab_size
 * tokens, each a uint8 length (>= 1) followed by that many bytes. Nothing
 * may follow the last token.
 */
#ifndef FSDP_DATA_TOKENIZER_H
#define FSDP_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

typedef struct fsdp_tokenizer fsdp_tokenizer;

/* Read and validate a tokenizer file: magic, version, counts, every
 * token's length against the file's size. FORMAT naming the file, and the
 * token for a bad entry. */
fsdp_status fsdp_tokenizer_open(fsdp_tokenizer **out, const char *path);

/* The same for a file held in memory; `label` names it in messages. */
fsdp_status fsdp_tokenizer_parse(fsdp_tokenizer **out, const char *label, const void *data,
                                 size_t n);

void fsdp_tokenizer_free(fsdp_tokenizer *t);

int fsdp_tokenizer_vocab(const fsdp_tokenizer *t);
/* The end-of-text token (version 2 files), or -1. */
int fsdp_tokenizer_eot(const fsdp_tokenizer *t);

/* Bytes of token `id` (not NUL-terminated), or NULL if id is out of range. */
const uint8_t *fsdp_tokenizer_decode(const fsdp_tokenizer *t, int id, size_t *len);

/* Encode text by greedy longest match against the token table. This is
 * not GPT-2's BPE (the file has no merge rules), so ids can differ from
 * tiktoken's for the same text, but every id decodes back to the text.
 * *ids (caller frees) holds *n ids. INVALID_ARG if some byte has no token. */
fsdp_status fsdp_tokenizer_encode(const fsdp_tokenizer *t, const char *text, int **ids, int *n);

#endif /* FSDP_DATA_TOKENIZER_H */
