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
 * Every file is mapped read-only and validated completely at open (header,
 * size against token count, every token against the vocabulary), so a bad
 * file is an error that names it, never a crash later. The mappings are
 * shared by all rank threads; memory stays at what the page cache holds.
 * Not defended: a file truncated by another process while we have it mapped
 * (reads then fault); token files are expected to be immutable while
 * training.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "data/shard.h"
#include "data/source.h"

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

/* Map path read-only into f (f->map stays NULL for an empty file). */
static fsdp_status map_file(fsdp_data_file *f, const char *path)
{
    f->path = strdup(path);
    if (!f->path)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of memory opening '%s'", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
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
    f->map_bytes = (size_t)sb.st_size;
    if (f->map_bytes > 0) {
        void *p = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return fsdp_error_set(FSDP_STATUS_IO, "cannot map data file '%s' (%zu bytes): %s",
                                  path, f->map_bytes, strerror(e));
        }
        f->map = p;
    }
    close(fd);
    return FSDP_STATUS_OK;
}

static int32_t header_i32(const uint8_t *map, int i)
{
    int32_t v;
    memcpy(&v, map + 4 * (size_t)i, 4);
    return v;
}

/* Validate an llm.c shard's header and size; sets tokens and n_tokens. */
static fsdp_status check_shard(fsdp_data_file *f)
{
    if (f->map_bytes < SHARD_HEADER_BYTES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' is %zu bytes, shorter than the %d-byte header; "
                              "the file is truncated or not an llm.c token shard",
                              f->path, f->map_bytes, SHARD_HEADER_BYTES);
    int32_t magic = header_i32(f->map, 0), version = header_i32(f->map, 1);
    int32_t count = header_i32(f->map, 2);
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
    if ((uint64_t)f->map_bytes != expected)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' is %zu bytes but its header says %d tokens of %d "
                              "bytes, which needs %llu bytes; the file is truncated or corrupt",
                              f->path, f->map_bytes, (int)count, bytes,
                              (unsigned long long)expected);
    f->tokens = f->map + SHARD_HEADER_BYTES;
    f->token_bytes = bytes;
    f->n_tokens = (uint64_t)count;
    return FSDP_STATUS_OK;
}

static void use_text(fsdp_data_file *f)
{
    f->tokens = f->map;
    f->token_bytes = 1;
    f->n_tokens = f->map_bytes;
}

/* Token i of f (0 <= i < f->n_tokens). */
static uint32_t token_at(const fsdp_data_file *f, uint64_t i)
{
    if (f->token_bytes == 1)
        return f->tokens[i];
    if (f->token_bytes == 2) {
        uint16_t t;
        memcpy(&t, f->tokens + 2 * i, 2);
        return t;
    }
    uint32_t t;
    memcpy(&t, f->tokens + 4 * i, 4);
    return t;
}

/* Scan every token: the largest goes to *max_tok; one >= vocab_size (when
 * vocab_size > 0), or past what an int holds, is a FORMAT error naming its
 * byte offset. */
static fsdp_status check_tokens(const fsdp_data_file *f, int vocab_size, int *max_tok)
{
    uint32_t mx = *max_tok < 0 ? 0 : (uint32_t)*max_tok;
    uint32_t limit = vocab_size > 0 ? (uint32_t)vocab_size : (uint32_t)INT32_MAX;
    size_t header = f->map ? (size_t)(f->tokens - f->map) : 0;
    for (uint64_t i = 0; i < f->n_tokens; i++) {
        uint32_t t = token_at(f, i);
        if (t >= limit) {
            unsigned long long off = header + (unsigned long long)f->token_bytes * i;
            if (f->token_bytes == 1)
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "text file '%s': byte %u at offset %llu is not below the "
                                      "vocabulary size %d; byte-level text needs a vocabulary "
                                      "of 256", f->path, (unsigned)t, off, vocab_size);
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "token shard '%s': token %u at byte offset %llu is not below "
                                  "the vocabulary size %d; the shard was made with another "
                                  "tokenizer, or pass a larger vocabulary",
                                  f->path, (unsigned)t, off,
                                  vocab_size > 0 ? vocab_size : INT32_MAX);
        }
        if (t > mx)
            mx = t;
    }
    if (f->n_tokens > 0 && (int)mx > *max_tok)
        *max_tok = (int)mx;
    return FSDP_STATUS_OK;
}

static void unmap_file(fsdp_data_file *f)
{
    if (f->owned)
        free(f->owned);
    else if (f->map)
        munmap((void *)f->map, f->map_bytes);
    free(f->path);
    memset(f, 0, sizeof *f);
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
        FSDP_CHECK(map_file(f, path_list_get(&pl, i)));
        if (d->kind == FSDP_DATA_SHARDS)
            FSDP_CHECK(check_shard(f));
        else
            use_text(f);
        FSDP_CHECK(check_tokens(f, vocab_size, &max_tok));
        if (f->n_tokens == 0) { /* nothing to read: drop it from the list */
            unmap_file(f);
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
        unmap_file(&d->files[i]);
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

void fsdp_data_files_read(const fsdp_data *d, uint64_t pos, size_t n, int *dst)
{
    FSDP_ASSERT(pos < d->n_tokens);
    int fi = file_of(d, pos);
    while (n > 0) {
        const fsdp_data_file *f = &d->files[fi];
        uint64_t at = pos - f->first;
        uint64_t run = f->n_tokens - at;
        if (run > n)
            run = n;
        if (f->token_bytes == 1) {
            const uint8_t *src = f->tokens + at;
            for (uint64_t i = 0; i < run; i++)
                dst[i] = src[i];
        } else if (f->token_bytes == 2) {
            const uint8_t *src = f->tokens + 2 * at;
            for (uint64_t i = 0; i < run; i++) {
                uint16_t t;
                memcpy(&t, src + 2 * i, 2);
                dst[i] = t;
            }
        } else {
            memcpy(dst, f->tokens + 4 * at, run * 4); /* checked < 2^31 at open */
        }
        dst += run;
        n -= run;
        pos += run;
        if (++fi == d->n_files) { /* past the last token: wrap to the first */
            fi = 0;
            pos = 0;
        }
    }
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
    f->owned = tokens;
    f->tokens = (const uint8_t *)tokens;
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
