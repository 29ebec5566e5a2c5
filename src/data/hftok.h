/*
 * hftok.h - Hugging Face tokenizer.json, byte-level BPE: the tokenizers of
 * the GPT-2, Llama 3 and Qwen2 families (and others built the same way).
 *
 * What a tokenizer.json may hold (anything else is a FORMAT or UNSUPPORTED
 * error naming the file and the field):
 * - normalizer: null or NFC (Qwen2), alone or in a Sequence;
 * - pre_tokenizer: ByteLevel (its own GPT-2 regex when use_regex), or a
 *   Sequence of Split (a Regex or String pattern, behaviour Isolated or
 *   Removed), Digits and a final ByteLevel (Llama 3, Qwen2);
 * - model: BPE with vocab, merges ("a b" strings or [a, b] pairs),
 *   ignore_merges; no dropout, no byte_fallback, no subword affixes;
 * - added_tokens: matched in the text before anything else (leftmost, then
 *   longest); special ones can be left as plain text
 *   (FSDP_HFTOK_SPLIT_SPECIAL);
 * - post_processor: ByteLevel, TemplateProcessing (its special tokens
 *   around $A give the BOS/EOS ids) or a Sequence of them;
 * - decoder: ByteLevel.
 * Split patterns run on PCRE2 with Unicode properties. Input text need not
 * be valid UTF-8: invalid bytes match no pattern class, end up in pieces
 * of their own, and still encode (byte-level) and decode back.
 *
 * Encoding caches words and uses scratch buffers inside the tokenizer, so
 * one fsdp_hftok serves one thread at a time; decoding and the lookups are
 * read-only.
 */
#ifndef FSDP_DATA_HFTOK_H
#define FSDP_DATA_HFTOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

typedef struct fsdp_hftok fsdp_hftok;

/* Encode flags. */
enum {
    /* special added tokens written in the text stay text (tokenizers'
     * encode_special_tokens; llm.c's split_special_tokens): for corpora and
     * user content, where "<|endoftext|>" is just characters */
    FSDP_HFTOK_SPLIT_SPECIAL = 1u << 0,
};

/* Read tokenizer.json (at most 256 MiB). IO/FORMAT/UNSUPPORTED errors name
 * the file and the field ("model.merges[17]"). */
fsdp_status fsdp_hftok_open(fsdp_hftok **out, const char *path);

/* The same for text in memory; `label` names it in messages. */
fsdp_status fsdp_hftok_parse(fsdp_hftok **out, const char *label, const char *json, size_t n);

void fsdp_hftok_free(fsdp_hftok *t);

/* 1 + the largest id of the vocabulary and the added tokens. */
int fsdp_hftok_vocab(const fsdp_hftok *t);

/* Id of the added token whose content is exactly `content`, or -1. */
int fsdp_hftok_added_id(const fsdp_hftok *t, const char *content);

/* Id of the token spelled `content` (added tokens first, then the
 * vocabulary by its decoded bytes), or -1. */
int fsdp_hftok_token_id(const fsdp_hftok *t, const char *content);

/* The special token the post-processor puts before a sequence (Llama 3:
 * <|begin_of_text|>), or -1. */
int fsdp_hftok_bos(const fsdp_hftok *t);

/* The token that ends a document: the post-processor's token after the
 * sequence if it adds one, else the added special token <|endoftext|>
 * (GPT-2, Qwen2) or <|end_of_text|> (Llama 3), else -1. */
int fsdp_hftok_eot(const fsdp_hftok *t);

/* Consumer of encoded ids: called with the next n ids (n >= 1) whenever
 * the encoder's buffer fills and once at the end; bytes_done is how far
 * through the input text the encoder is (approximate inside normalized
 * text), for progress. A non-OK return stops the encoding with that
 * status. */
typedef fsdp_status (*fsdp_hftok_sink)(void *arg, const int *ids, size_t n, size_t bytes_done);

/* Encode text[0..len) without the post-processor's BOS/EOS (like
 * add_special_tokens=False), handing ids to sink in order. */
fsdp_status fsdp_hftok_encode_stream(fsdp_hftok *t, const char *text, size_t len,
                                     unsigned flags, fsdp_hftok_sink sink, void *arg);

/* Encode text[0..len) into *ids (malloc'd, caller frees; NULL when *n_ids
 * is 0). */
fsdp_status fsdp_hftok_encode(fsdp_hftok *t, const char *text, size_t len, unsigned flags,
                              int **ids, size_t *n_ids);

/* The first special added token in text[from..len) as encoding without
 * FSDP_HFTOK_SPLIT_SPECIAL finds it (leftmost, then longest): its id and
 * text[*begin, *end), or *id = -1 when there is none. For the chat
 * renderer (which matches special tokens in template text only) and for
 * counting special-token strings left as text. Uses t's scratch: one
 * thread at a time. */
fsdp_status fsdp_hftok_next_special(fsdp_hftok *t, const char *text, size_t len, size_t from,
                                    size_t *begin, size_t *end, int *id);

/* Bytes of token `id` as the ByteLevel decoder gives them (not
 * NUL-terminated), or NULL if no token has that id. */
const uint8_t *fsdp_hftok_token_bytes(const fsdp_hftok *t, int id, size_t *len);

/* Decode ids into *text (malloc'd, NUL-terminated, *len bytes without the
 * NUL): the tokens' bytes back to back. The result can be invalid UTF-8
 * where ids split a character (the reference library shows U+FFFD
 * there); kept raw so concatenated decodes round-trip. INVALID_ARG for an
 * id that has no token. */
fsdp_status fsdp_hftok_decode(const fsdp_hftok *t, const int *ids, size_t n, char **text,
                              size_t *len);

#endif /* FSDP_DATA_HFTOK_H */
