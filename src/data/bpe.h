/*
 * bpe.h - internal to src/data: the byte-level BPE model of a Hugging Face
 * tokenizer (hftok.h): the vocabulary as raw bytes -> id, the merge rules
 * as (left id, right id) -> (rank, merged id), and the word encoder.
 *
 * Built once by the tokenizer.json reader (tokjson.c), then used by the
 * encoder (hftok.c). Encoding keeps a cache of words already seen and
 * scratch buffers, so one fsdp_bpe must not be used by two threads at once.
 */
#ifndef FSDP_DATA_BPE_H
#define FSDP_DATA_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/ids.h"
#include "fsdp/fsdp.h"

typedef struct fsdp_bpe fsdp_bpe;

fsdp_status fsdp_bpe_init(fsdp_bpe **out, size_t n_tokens_hint, size_t n_merges_hint);
void fsdp_bpe_free(fsdp_bpe *b);

/* Add vocabulary entry `bytes` -> id (id >= 0). Returns FORMAT (message
 * without the file: the caller prefixes it) if the bytes are already
 * there. */
fsdp_status fsdp_bpe_add_token(fsdp_bpe *b, const uint8_t *bytes, size_t n, int id);

/* Id of the entry whose bytes are exactly bytes[0..n), or -1. */
int fsdp_bpe_find(const fsdp_bpe *b, const uint8_t *bytes, size_t n);

/* Add the rule "left right -> merged" with priority `rank` (lower merges
 * first). A pair given twice keeps the later rule, as Hugging Face's
 * reader does. */
fsdp_status fsdp_bpe_add_merge(fsdp_bpe *b, int left, int right, int merged, uint32_t rank);

/* Done adding: every one of the 256 bytes must have a single-byte entry
 * (FORMAT naming the first missing byte otherwise). ignore_merges: a word
 * that is itself in the vocabulary is one token without merging (Llama 3). */
fsdp_status fsdp_bpe_finish(fsdp_bpe *b, bool ignore_merges);

/* Append the ids of one pre-tokenized word (raw bytes, n >= 1) to out:
 * start from one token per byte, then apply the lowest-ranked applicable
 * merge (leftmost among equals) until none applies, as Hugging Face's
 * BPE::merge_word does. A heap of candidate merges over a linked list of
 * symbols: O(n log n) per word; words seen before come from a cache. */
fsdp_status fsdp_bpe_encode_word(fsdp_bpe *b, const uint8_t *w, size_t n, fsdp_ids *out);

#endif /* FSDP_DATA_BPE_H */
