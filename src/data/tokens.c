/*
 * tokens.c - file-backed token sources: llm.c token shards and byte-level
 * text.
 *
 * llm.c shard (written by llm.c's dev/data scripts): int32[256] header
 * (magic 20240520, version 1, token count), then the tokens as uint16.
 * Integers are little-endian; like llm.c we assume a little-endian host. A
 * .txt file is its bytes, one token per byte.
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
#include "data/source.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_BYTES 1024 /* 256 x int32 */

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
    if (magic != SHARD_MAGIC)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' has magic %d, expected %d; it is not an llm.c "
                              "token shard (make one with llm.c's dev/data/*.py, or pass a .txt "
                              "file)",
                              f->path, (int)magic, SHARD_MAGIC);
    if (version != SHARD_VERSION)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' has version %d, only version %d (uint16 tokens) "
                              "is supported",
                              f->path, (int)version, SHARD_VERSION);
    if (count < 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "token shard '%s' has a negative token count %d",
                              f->path, (int)count);
    uint64_t expected = SHARD_HEADER_BYTES + 2 * (uint64_t)count;
    if ((uint64_t)f->map_bytes != expected)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "token shard '%s' is %zu bytes but its header says %d tokens, "
                              "which needs %llu bytes; the file is truncated or corrupt",
                              f->path, f->map_bytes, (int)count, (unsigned long long)expected);
    f->tokens = f->map + SHARD_HEADER_BYTES;
    f->token_bytes = 2;
    f->n_tokens = (uint64_t)count;
    return FSDP_STATUS_OK;
}

static void use_text(fsdp_data_file *f)
{
    f->tokens = f->map;
    f->token_bytes = 1;
    f->n_tokens = f->map_bytes;
}

/* Scan every token: the largest goes to *max_tok; one >= vocab_size (when
 * vocab_size > 0) is a FORMAT error naming its byte offset. */
static fsdp_status check_tokens(const fsdp_data_file *f, int vocab_size, int *max_tok)
{
    int mx = *max_tok;
    size_t header = (size_t)(f->tokens - f->map);
    if (f->token_bytes == 2) {
        for (uint64_t i = 0; i < f->n_tokens; i++) {
            uint16_t t;
            memcpy(&t, f->tokens + 2 * i, 2);
            if (vocab_size > 0 && t >= vocab_size)
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "token shard '%s': token %u at byte offset %llu is not "
                                      "below the vocabulary size %d; the shard was made with "
                                      "another tokenizer, or pass a larger vocabulary",
                                      f->path, (unsigned)t,
                                      (unsigned long long)(header + 2 * i), vocab_size);
            if (t > mx)
                mx = t;
        }
    } else {
        for (uint64_t i = 0; i < f->n_tokens; i++) {
            uint8_t t = f->tokens[i];
            if (vocab_size > 0 && t >= vocab_size)
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "text file '%s': byte %u at offset %llu is not below the "
                                      "vocabulary size %d; byte-level text needs a vocabulary "
                                      "of 256",
                                      f->path, (unsigned)t, (unsigned long long)i, vocab_size);
            if (t > mx)
                mx = t;
        }
    }
    *max_tok = mx;
    return FSDP_STATUS_OK;
}

static void unmap_file(fsdp_data_file *f)
{
    if (f->map)
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
        if (f->token_bytes == 2) {
            const uint8_t *src = f->tokens + 2 * at;
            for (uint64_t i = 0; i < run; i++) {
                uint16_t t;
                memcpy(&t, src + 2 * i, 2);
                dst[i] = t;
            }
        } else {
            const uint8_t *src = f->tokens + at;
            for (uint64_t i = 0; i < run; i++)
                dst[i] = src[i];
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
