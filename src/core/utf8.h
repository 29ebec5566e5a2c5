/*
 * utf8.h - bytes to valid UTF-8, a piece at a time: what `fsdp sample`
 * prints as tokens arrive. A token's bytes may end inside a character that
 * the next token completes, so a character's leading bytes wait for the
 * rest; bytes that can never form a character become U+FFFD. Each maximal
 * prefix of a well-formed sequence that breaks off counts as one error, as
 * the Unicode standard recommends (its "substitution of maximal subparts")
 * and as Python's errors="replace" and Rust's from_utf8_lossy (the
 * `tokenizers` decoders') do, so the text printed is the reference
 * library's decode of the same ids, however they are split.
 */
#ifndef FSDP_CORE_UTF8_H
#define FSDP_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A stream's state: the leading bytes of a character still open. */
typedef struct fsdp_utf8_stream {
    uint8_t pend[3];
    int n_pend;
} fsdp_utf8_stream;

/* The most bytes fsdp_utf8_lossy writes for n input bytes. */
#define FSDP_UTF8_LOSSY_MAX(n) (3 * ((size_t)(n) + 3))

/* The next n bytes of the stream s as valid UTF-8 into out (room for
 * FSDP_UTF8_LOSSY_MAX(n) bytes, not NUL-terminated); returns the bytes
 * written. A character left open at the end waits in s, or with `end`
 * becomes U+FFFD (s is then empty again). */
size_t fsdp_utf8_lossy(fsdp_utf8_stream *s, const uint8_t *in, size_t n, bool end, uint8_t *out);

#endif /* FSDP_CORE_UTF8_H */
