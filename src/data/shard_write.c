/*
 * shard_write.c - writing llm.c token shards (shard.h) for `fsdp tokenize`.
 *
 * The header goes first with a zero count and is rewritten with the real
 * count at the end, so tokens stream to disk as they are encoded. The file
 * lives under a temporary name until close renames it, or until the staged
 * set it was handed to is published (core/fileio.h): a crash or an error
 * never leaves a shard whose header and size disagree.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "data/shard.h"

#define BUF_TOKENS 65536

struct fsdp_shard_writer {
    fsdp_atomic_file af;
    char *path;
    int vocab;
    int token_bytes;        /* 2 or 4 */
    uint64_t count;
    bool write_ok;
    uint8_t buf[4 * BUF_TOKENS];
};

static void header(const fsdp_shard_writer *w, int32_t h[256])
{
    memset(h, 0, 256 * sizeof *h);
    h[0] = w->token_bytes == 2 ? FSDP_SHARD_MAGIC_U16 : FSDP_SHARD_MAGIC_U32;
    h[1] = w->token_bytes == 2 ? FSDP_SHARD_VERSION_U16 : FSDP_SHARD_VERSION_U32;
    h[2] = (int32_t)w->count;
}

fsdp_status fsdp_shard_writer_open(fsdp_shard_writer **out, const char *path, int vocab_size)
{
    *out = NULL;
    if (vocab_size < 1)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "token shard '%s': vocabulary size %d",
                              path, vocab_size);
    fsdp_shard_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory writing '%s'", path);
    }
    w->vocab = vocab_size;
    w->token_bytes = vocab_size <= 65536 ? 2 : 4;
    w->write_ok = true;
    fsdp_status st = fsdp_atomic_open(&w->af, w->path, "token shard");
    if (st != FSDP_STATUS_OK) {
        free(w->path);
        free(w);
        return st;
    }
    int32_t h[256];
    header(w, h);
    w->write_ok = fwrite(h, sizeof h, 1, w->af.f) == 1;
    *out = w;
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_shard_writer_add(fsdp_shard_writer *w, const int *ids, size_t n)
{
    if (n > FSDP_SHARD_MAX_TOKENS - w->count)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "token shard '%s' would pass %llu tokens, the most its header can "
                              "count; split the output (fsdp tokenize --shard-tokens N)",
                              w->path, (unsigned long long)FSDP_SHARD_MAX_TOKENS);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= w->vocab)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                  "token shard '%s': id %d is outside the vocabulary of %d",
                                  w->path, ids[i], w->vocab);
    for (size_t done = 0; done < n;) {
        size_t k = n - done < BUF_TOKENS ? n - done : BUF_TOKENS;
        for (size_t i = 0; i < k; i++) {
            uint32_t v = (uint32_t)ids[done + i];
            if (w->token_bytes == 2) {
                uint16_t s = (uint16_t)v;
                memcpy(w->buf + 2 * i, &s, 2);
            } else {
                memcpy(w->buf + 4 * i, &v, 4);
            }
        }
        if (w->write_ok)
            w->write_ok = fwrite(w->buf, (size_t)w->token_bytes, k, w->af.f) == k;
        done += k;
    }
    w->count += n;
    return w->write_ok ? FSDP_STATUS_OK
                       : fsdp_error_set(FSDP_STATUS_IO, "error writing token shard '%s' (disk "
                                        "full?)", w->path);
}

uint64_t fsdp_shard_writer_count(const fsdp_shard_writer *w) { return w->count; }

/* The final header over the zero-count one. */
static void finish_header(fsdp_shard_writer *w)
{
    int32_t h[256];
    header(w, h);
    if (w->write_ok)
        w->write_ok = fseek(w->af.f, 0, SEEK_SET) == 0 && fwrite(h, sizeof h, 1, w->af.f) == 1;
}

fsdp_status fsdp_shard_writer_close(fsdp_shard_writer *w, bool commit)
{
    if (!w)
        return FSDP_STATUS_OK;
    fsdp_status st = FSDP_STATUS_OK;
    if (commit) {
        finish_header(w);
        st = fsdp_atomic_commit(&w->af, w->write_ok);
    } else {
        fsdp_atomic_abort(&w->af);
    }
    free(w->path);
    free(w);
    return st;
}

fsdp_status fsdp_shard_writer_stage(fsdp_shard_writer *w, fsdp_staged *stage)
{
    finish_header(w);
    fsdp_status st = fsdp_staged_add(stage, &w->af, w->write_ok);
    free(w->path);
    free(w);
    return st;
}
