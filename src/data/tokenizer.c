/*
 * tokenizer.c - llm.c's tokenizer file (format in tokenizer.h): decode
 * table, and a greedy longest-match encoder over the same table.
 *
 * The file is read whole (bounded at 64 MiB: GPT-2's is 0.3 MiB) and
 * walked once with every length checked against what is left, so a
 * truncated or corrupted file is a FORMAT error naming the token, never an
 * out-of-bounds read. Assumes a little-endian host, like llm.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fileio.h"
#include "data/tokenizer.h"

#define TOK_MAGIC 20240328u
#define TOK_HEADER_BYTES 1024
#define TOK_MAX_FILE ((size_t)64 << 20)
#define TOK_MAX_VOCAB (1 << 24)

struct fsdp_tokenizer {
    int vocab;
    int eot;
    uint8_t *bytes;      /* all tokens' bytes, back to back */
    uint32_t *off;       /* [vocab + 1] token i is bytes[off[i] .. off[i+1]) */
    int *sorted;         /* [vocab] ids ordered by their bytes (for encoding) */
    int max_len;
};

void fsdp_tokenizer_free(fsdp_tokenizer *t)
{
    if (!t)
        return;
    free(t->bytes);
    free(t->off);
    free(t->sorted);
    free(t);
}

int fsdp_tokenizer_vocab(const fsdp_tokenizer *t) { return t->vocab; }
int fsdp_tokenizer_eot(const fsdp_tokenizer *t) { return t->eot; }

const uint8_t *fsdp_tokenizer_decode(const fsdp_tokenizer *t, int id, size_t *len)
{
    if (id < 0 || id >= t->vocab)
        return NULL;
    *len = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

/* Compare token id's bytes with s[0..n). */
static int cmp_bytes(const fsdp_tokenizer *t, int id, const uint8_t *s, size_t n)
{
    size_t k = t->off[id + 1] - t->off[id];
    int c = memcmp(t->bytes + t->off[id], s, k < n ? k : n);
    return c ? c : (k < n ? -1 : k > n ? 1 : 0);
}

static int cmp_ids(const void *a, const void *b, void *ctx)
{
    const fsdp_tokenizer *t = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    int c = cmp_bytes(t, x, t->bytes + t->off[y], t->off[y + 1] - t->off[y]);
    return c ? c : (x < y ? -1 : x > y);
}

fsdp_status fsdp_tokenizer_parse(fsdp_tokenizer **out, const char *label, const void *data,
                                 size_t n)
{
    *out = NULL;
    const uint8_t *p = data;
    if (n < TOK_HEADER_BYTES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer file '%s' is %zu bytes, shorter than its %d-byte header; "
                              "it is truncated or not an llm.c tokenizer file",
                              label, n, TOK_HEADER_BYTES);
    uint32_t h[4];
    memcpy(h, p, sizeof h);
    if (h[0] != TOK_MAGIC)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer file '%s' has magic %u, expected %u; it is not an llm.c "
                              "tokenizer file (gpt2_tokenizer.bin)", label, h[0], TOK_MAGIC);
    if (h[1] != 1 && h[1] != 2)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer file '%s' has version %u; supported are 1 and 2", label,
                              h[1]);
    if (h[2] < 1 || h[2] > TOK_MAX_VOCAB)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer file '%s' declares %u tokens (expected 1..%d); the "
                              "header is corrupt", label, h[2], TOK_MAX_VOCAB);
    int V = (int)h[2];
    if (h[1] == 2 && h[3] >= h[2])
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer file '%s': end-of-text token %u is not below its %d "
                              "tokens", label, h[3], V);
    /* every token takes at least 2 bytes: bound the vocabulary by the size */
    if ((size_t)V * 2 > n - TOK_HEADER_BYTES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "tokenizer file '%s' declares %d tokens but has only %zu bytes "
                              "after its header; it is truncated", label, V,
                              n - TOK_HEADER_BYTES);
    fsdp_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", label);
    t->vocab = V;
    t->eot = h[1] == 2 ? (int)h[3] : -1;
    t->off = malloc(((size_t)V + 1) * sizeof *t->off);
    t->bytes = malloc(n - TOK_HEADER_BYTES);
    t->sorted = malloc((size_t)V * sizeof *t->sorted);
    fsdp_status st = FSDP_STATUS_OK;
    if (!t->off || !t->bytes || !t->sorted) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'", label);
        goto fail;
    }
    size_t at = TOK_HEADER_BYTES, used = 0;
    for (int i = 0; i < V; i++) {
        if (at >= n) {
            st = fsdp_error_set(FSDP_STATUS_FORMAT,
                                "tokenizer file '%s' ends at token %d of %d; it is truncated",
                                label, i, V);
            goto fail;
        }
        size_t len = p[at++];
        if (len == 0 || len > n - at) {
            st = fsdp_error_set(FSDP_STATUS_FORMAT,
                                "tokenizer file '%s': token %d has length %zu at byte %zu, but "
                                "%s; the file is corrupt or truncated", label, i, len, at - 1,
                                len == 0 ? "tokens are never empty" : "the file ends first");
            goto fail;
        }
        t->off[i] = (uint32_t)used;
        memcpy(t->bytes + used, p + at, len);
        used += len;
        at += len;
        if ((int)len > t->max_len)
            t->max_len = (int)len;
    }
    t->off[V] = (uint32_t)used;
    if (at != n) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "tokenizer file '%s' has %zu bytes after its %d tokens; it is "
                            "corrupt or not an llm.c tokenizer file", label, n - at, V);
        goto fail;
    }
    for (int i = 0; i < V; i++)
        t->sorted[i] = i;
    qsort_r(t->sorted, (size_t)V, sizeof *t->sorted, cmp_ids, t);
    *out = t;
    return FSDP_STATUS_OK;
fail:
    fsdp_tokenizer_free(t);
    return st;
}

fsdp_status fsdp_tokenizer_open(fsdp_tokenizer **out, const char *path)
{
    *out = NULL;
    char *buf = NULL;
    size_t n = 0;
    FSDP_TRY(fsdp_read_file(path, "tokenizer file", TOK_MAX_FILE, &buf, &n));
    fsdp_status st = fsdp_tokenizer_parse(out, path, buf, n);
    free(buf);
    return st;
}

/* Id of the token whose bytes are exactly s[0..n), or -1. */
static int find_token(const fsdp_tokenizer *t, const uint8_t *s, size_t n)
{
    int lo = 0, hi = t->vocab - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = cmp_bytes(t, t->sorted[mid], s, n);
        if (c == 0) {
            /* the lowest id among duplicates */
            while (mid > 0 && cmp_bytes(t, t->sorted[mid - 1], s, n) == 0)
                mid--;
            return t->sorted[mid];
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

fsdp_status fsdp_tokenizer_encode(const fsdp_tokenizer *t, const char *text, int **ids, int *n)
{
    size_t len = strlen(text);
    const uint8_t *s = (const uint8_t *)text;
    int *out = malloc((len + 1) * sizeof *out);
    if (!out)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory encoding a prompt");
    int k = 0;
    for (size_t i = 0; i < len;) {
        size_t most = len - i < (size_t)t->max_len ? len - i : (size_t)t->max_len;
        int id = -1;
        size_t take = most + 1;
        while (id < 0 && --take > 0)
            id = find_token(t, s + i, take);
        if (id < 0) {
            free(out);
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "the tokenizer has no token for byte 0x%02x at position %zu of "
                                  "the prompt", s[i], i);
        }
        out[k++] = id;
        i += take;
    }
    *ids = out;
    *n = k;
    return FSDP_STATUS_OK;
}
