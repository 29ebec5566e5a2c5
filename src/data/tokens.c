/*
 * tokens.c - file-backed token sources: llm.c token shards and byte-level
 * text; and in-memory token sequences (tokenized text) read the same way.
 *
 * llm.c shard (written by llm.c's dev/data scripts or `fsdp tokenize`):
 * int32[256] header, then the tokens as uint16 (magic 20240520, version 1)
 * or uint32 (magic 20240801, version 7); shard.h. Integers are
 * little-endian; like llm.c we assume a little-endian host. A .txt file is
 * its bytes, one token per byte.
 *
 * Every file is opened once and validated completely (header, size against
 * token count, every token against the vocabulary), so a bad file is an
 * error that names it, never a crash later. Reads are positional (pread)
 * on descriptors shared by all rank threads, never mappings: a file
 * truncated by another process while we train gives a short read, an error
 * naming the file, where a mapping would kill the process with SIGBUS.
 * Every token read is checked against the vocabulary again (a file
 * rewritten in place must not index past the embedding), and
 * fsdp_data_files_check tells whether a file changed since it was opened
 * (size or modification time), so the trainer can stop between steps.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "data/data_internal.h"
#include "data/shard.h"

#define SHARD_HEADER_BYTES FSDP_SHARD_HEADER_BYTES

/* The list of paths a spec names: itself, or its glob expansion (sorted). */
typedef struct path_list {
    glob_t g;
    bool globbed;
    const char *single;
} path_list;

static bool spec_is_glob(const char *spec) { return strpbrk(spec, "*?[") != NULL; }

static fsdp_status path_list_init(path_list *pl, const char *spec)
{
    memset(pl, 0, sizeof *pl);
    if (!spec_is_glob(spec)) {
        pl->single = spec;
        return FSDP_STATUS_OK;
    }
    int rc = glob(spec, GLOB_ERR, NULL, &pl->g);
    if (rc == GLOB_NOMATCH) {
        globfree(&pl->g);
        return fsdp_error_set(FSDP_STATUS_IO,
                              "no files match '%s'; check the path and quote the pattern so "
                              "the shell does not expand it",
                              spec);
    }
    if (rc == GLOB_NOSPACE) {
        globfree(&pl->g);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of memory expanding '%s'", spec);
    }
    if (rc != 0) {
        globfree(&pl->g);
        return fsdp_error_set(FSDP_STATUS_IO, "cannot read the directory of '%s': %s", spec,
                              strerror(errno));
    }
    pl->globbed = true;
    return FSDP_STATUS_OK;
}

static size_t path_list_count(const path_list *pl) { return pl->globbed ? pl->g.gl_pathc : 1; }

static const char *path_list_get(const path_list *pl, size_t i)
{
    return pl->globbed ? pl->g.gl_pathv[i] : pl->single;
}

static void path_list_free(path_list *pl)
{
    if (pl->globbed)
        globfree(&pl->g);
}

/* Open path for reading into f: a regular file only (opened non-blocking,
 * so a FIFO without a writer is refused instead of waited for). */
static fsdp_status open_file(fsdp_data_file *f, const char *path)
{
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of memory opening '%s'", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open data file '%s': %s", path,
                              strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return fsdp_error_set(FSDP_STATUS_IO, "cannot stat data file '%s': %s", path,
                              strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return fsdp_error_set(FSDP_STATUS_IO, "data file '%s' is not a regular file", path);
    }
    f->fd = fd;
    f->bytes = (uint64_t)sb.st_size;
    f->mtime = sb.st_mtim;
    return FSDP_STATUS_OK;
}

/* Exactly n bytes of f at byte off. A short read means the file shrank
 * after it was validated. */
static fsdp_status read_at(const fsdp_data_file *f, void *buf, size_t n, uint64_t off)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t got = pread(f->fd, p, n, (off_t)off);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot read data file '%s' at byte %llu: %s",
                                  f->path, (unsigned long long)off, strerror(errno));
        if (got == 0)
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "data file '%s' ends at byte %llu, but it held %llu bytes when "
                                  "training started: it was truncated or replaced in place while "
                                  "training; restore it, then resume from the last checkpoint",
                                  f->path, (unsigned long long)off,
                                  (unsigned long long)f->bytes);
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return FSDP_STATUS_OK;
}

static int32_t header_i32(const uint8_t *h, int i)
{
    int32_t v;
    memcpy(&v, h + 4 * (size_t)i, 4);
    return v;
}

/* Validate an llm.c shard's header and size; sets token_bytes, first_byte
 * and n_tokens. */
static fsdp_status check_shard(fsdp_data_file *f)
{
    if (f->bytes < SHARD_HEADER_BYTES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' is %llu bytes, shorter than the %d-byte header; "
                              "the file is truncated or not an llm.c token shard",
                              f->path, (unsigned long long)f->bytes, SHARD_HEADER_BYTES);
    uint8_t h[12];
    FSDP_TRY(read_at(f, h, sizeof h, 0));
    int32_t magic = header_i32(h, 0), version = header_i32(h, 1);
    int32_t count = header_i32(h, 2);
    int bytes;
    if (magic == FSDP_SHARD_MAGIC_U16 && version == FSDP_SHARD_VERSION_U16)
        bytes = 2;
    else if (magic == FSDP_SHARD_MAGIC_U32 && version == FSDP_SHARD_VERSION_U32)
        bytes = 4;
    else if (magic == FSDP_SHARD_MAGIC_U16 || magic == FSDP_SHARD_MAGIC_U32)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' has magic %d with version %d; supported are "
                              "magic %d version %d (uint16 tokens) and magic %d version %d "
                              "(uint32 tokens)",
                              f->path, (int)magic, (int)version, FSDP_SHARD_MAGIC_U16,
                              FSDP_SHARD_VERSION_U16, FSDP_SHARD_MAGIC_U32,
                              FSDP_SHARD_VERSION_U32);
    else
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' has magic %d, expected %d or %d; it is not an "
                              "llm.c token shard (make one with `fsdp tokenize` or llm.c's "
                              "dev/data/*.py, or pass a .txt file)",
                              f->path, (int)magic, FSDP_SHARD_MAGIC_U16, FSDP_SHARD_MAGIC_U32);
    if (count < 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "token shard '%s' has a negative token count %d",
                              f->path, (int)count);
    uint64_t expected = SHARD_HEADER_BYTES + (uint64_t)bytes * (uint64_t)count;
    if (f->bytes != expected)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' is %llu bytes but its header says %d tokens of %d "
                              "bytes, which needs %llu bytes; the file is truncated or corrupt",
                              f->path, (unsigned long long)f->bytes, (int)count, bytes,
                              (unsigned long long)expected);
    f->first_byte = SHARD_HEADER_BYTES;
    f->token_bytes = bytes;
    f->n_tokens = (uint64_t)count;
    return FSDP_STATUS_OK;
}

static void use_text(fsdp_data_file *f)
{
    f->first_byte = 0;
    f->token_bytes = 1;
    f->n_tokens = f->bytes;
}

/* Decode n tokens of width `bytes` from src into dst. */
static void decode(const uint8_t *src, int bytes, size_t n, uint32_t *dst)
{
    if (bytes == 1) {
        for (size_t i = 0; i < n; i++)
            dst[i] = src[i];
    } else if (bytes == 2) {
        for (size_t i = 0; i < n; i++) {
            uint16_t t;
            memcpy(&t, src + 2 * i, 2);
            dst[i] = t;
        }
    } else {
        memcpy(dst, src, n * 4);
    }
}

/* The first token of src[0..n) that is >= limit, or n. */
static size_t first_at_or_above(const uint32_t *src, size_t n, uint32_t limit)
{
    for (size_t i = 0; i < n; i++)
        if (src[i] >= limit)
            return i;
    return n;
}

/* The error for token t at index i of f that is not below `limit`. */
static fsdp_status bad_token(const fsdp_data_file *f, uint64_t i, uint32_t t, int limit,
                             const char *when)
{
    unsigned long long off = f->first_byte + (unsigned long long)f->token_bytes * i;
    if (f->token_bytes == 1)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "text file '%s': byte %u at offset %llu is not below the "
                              "vocabulary size %d; byte-level text needs a vocabulary of 256%s",
                              f->path, (unsigned)t, off, limit, when);
    return fsdp_error_set(FSDP_STATUS_FORMAT,
                          "token shard '%s': token %u at byte offset %llu is not below the "
                          "vocabulary size %d; the shard was made with another tokenizer, or "
                          "pass a larger vocabulary%s",
                          f->path, (unsigned)t, off, limit, when);
}

enum { READ_CHUNK = 4096 }; /* tokens per pread */

/* Scan every token of a file: the largest goes to *max_tok; one >= vocab_size
 * (when vocab_size > 0), or past what an int holds, is a FORMAT error naming
 * its byte offset. In-memory sources are scanned in place. */
static fsdp_status check_tokens(const fsdp_data_file *f, int vocab_size, int *max_tok)
{
    uint32_t mx = *max_tok < 0 ? 0 : (uint32_t)*max_tok;
    uint32_t limit = vocab_size > 0 ? (uint32_t)vocab_size : (uint32_t)INT32_MAX;
    uint8_t raw[READ_CHUNK * 4];
    uint32_t tok[READ_CHUNK];
    for (uint64_t i = 0; i < f->n_tokens;) {
        size_t n = f->n_tokens - i < READ_CHUNK ? (size_t)(f->n_tokens - i) : READ_CHUNK;
        if (f->owned) {
            decode((const uint8_t *)f->owned + 4 * i, 4, n, tok);
        } else {
            FSDP_TRY(read_at(f, raw, n * (size_t)f->token_bytes,
                             f->first_byte + (uint64_t)f->token_bytes * i));
            decode(raw, f->token_bytes, n, tok);
        }
        size_t k = first_at_or_above(tok, n, limit);
        if (k < n)
            return bad_token(f, i + k, tok[k], vocab_size > 0 ? vocab_size : INT32_MAX, "");
        for (size_t j = 0; j < n; j++)
            if (tok[j] > mx)
                mx = tok[j];
        i += n;
    }
    if (f->n_tokens > 0 && (int)mx > *max_tok)
        *max_tok = (int)mx;
    return FSDP_STATUS_OK;
}

static void close_file(fsdp_data_file *f)
{
    free(f->owned);
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

fsdp_status fsdp_data_files_open(fsdp_data *d, const char *spec, int vocab_size)
{
    fsdp_status st;
    path_list pl;
    FSDP_TRY(path_list_init(&pl, spec));
    size_t n = path_list_count(&pl);
    d->files = calloc(n, sizeof *d->files);
    if (!d->files) {
        path_list_free(&pl);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of memory listing %zu data files", n);
    }
    int max_tok = -1;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        fsdp_data_file *f = &d->files[d->n_files];
        d->n_files++; /* counted before filling, so close frees a partial entry */
        FSDP_CHECK(open_file(f, path_list_get(&pl, i)));
        if (d->kind == FSDP_DATA_SHARDS)
            FSDP_CHECK(check_shard(f));
        else
            use_text(f);
        FSDP_CHECK(check_tokens(f, vocab_size, &max_tok));
        if (f->n_tokens == 0) { /* nothing to read: drop it from the list */
            close_file(f);
            d->n_files--;
            continue;
        }
        f->first = total;
        total += f->n_tokens;
    }
    if (total == 0) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' holds no tokens (%zu file%s, all empty)",
                            spec, n, n == 1 ? "" : "s");
        goto fail;
    }
    d->n_tokens = total;
    d->vocab = d->kind == FSDP_DATA_SHARDS ? max_tok + 1 : 256;
    FSDP_INFO(FSDP_SUB_DATA, "data: '%s': %d file%s, %llu tokens, vocab %d", spec, d->n_files,
              d->n_files == 1 ? "" : "s", (unsigned long long)total, d->vocab);
    path_list_free(&pl);
    return FSDP_STATUS_OK;
fail:
    path_list_free(&pl);
    return st;
}

void fsdp_data_files_close(fsdp_data *d)
{
    for (int i = 0; i < d->n_files; i++)
        close_file(&d->files[i]);
    free(d->files);
    d->files = NULL;
    d->n_files = 0;
}

/* Index of the file holding token pos (< d->n_tokens): the last file whose
 * first token is at or before pos (no file is empty). */
static int file_of(const fsdp_data *d, uint64_t pos)
{
    int lo = 0, hi = d->n_files - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (d->files[mid].first <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

fsdp_status fsdp_data_files_read(const fsdp_data *d, uint64_t pos, size_t n, int *dst)
{
    FSDP_ASSERT(pos < d->n_tokens);
    int fi = file_of(d, pos);
    uint8_t raw[READ_CHUNK * 4];
    uint32_t tok[READ_CHUNK];
    while (n > 0) {
        const fsdp_data_file *f = &d->files[fi];
        uint64_t at = pos - f->first;
        uint64_t run = f->n_tokens - at;
        if (run > n)
            run = n;
        if (run > READ_CHUNK)
            run = READ_CHUNK;
        if (f->owned) {
            memcpy(dst, (const int *)f->owned + at, run * sizeof *dst); /* checked at adopt */
        } else {
            FSDP_TRY(read_at(f, raw, run * (size_t)f->token_bytes,
                             f->first_byte + (uint64_t)f->token_bytes * at));
            decode(raw, f->token_bytes, run, tok);
            /* validated at open; a file rewritten in place since must not
             * index past the model's embedding */
            size_t k = first_at_or_above(tok, run, (uint32_t)d->vocab);
            if (k < run)
                return bad_token(f, at + k, tok[k], d->vocab,
                                 " (the file changed while training: restore it and resume "
                                 "from the last checkpoint)");
            for (uint64_t i = 0; i < run; i++)
                dst[i] = (int)tok[i];
        }
        dst += run;
        n -= run;
        pos += run;
        if (pos == f->first + f->n_tokens && ++fi == d->n_files) { /* wrap to the first */
            fi = 0;
            pos = 0;
        }
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_data_files_check(const fsdp_data *d)
{
    for (int i = 0; i < d->n_files; i++) {
        const fsdp_data_file *f = &d->files[i];
        if (f->fd < 0)
            continue;
        struct stat sb;
        if (fstat(f->fd, &sb) != 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot stat data file '%s': %s", f->path,
                                  strerror(errno));
        if ((uint64_t)sb.st_size != f->bytes)
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "data file '%s' changed while training: it held %llu bytes, "
                                  "now %llu (truncated, emptied or appended to); restore it, then "
                                  "resume from the last checkpoint",
                                  f->path, (unsigned long long)f->bytes,
                                  (unsigned long long)sb.st_size);
        if (sb.st_mtim.tv_sec != f->mtime.tv_sec || sb.st_mtim.tv_nsec != f->mtime.tv_nsec)
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "data file '%s' changed while training (it was written to "
                                  "since it was opened); restore it, then resume from the last "
                                  "checkpoint", f->path);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_data_files_adopt(fsdp_data *d, const char *label, int *tokens, uint64_t n)
{
    d->files = calloc(1, sizeof *d->files);
    if (!d->files || !(d->files[0].path = strdup(label))) {
        free(tokens);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory holding '%s'", label);
    }
    fsdp_data_file *f = &d->files[0];
    d->n_files = 1;
    f->fd = -1;
    f->owned = tokens;
    f->token_bytes = 4;
    f->n_tokens = n;
    if (n == 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' holds no tokens", label);
    int max_tok = -1;
    FSDP_TRY(check_tokens(f, 0, &max_tok));
    d->n_tokens = n;
    d->vocab = max_tok + 1;
    return FSDP_STATUS_OK;
}
