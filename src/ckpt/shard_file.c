/*
 * shard_file.c - one rank's checkpoint shard file: block-checksummed fp32
 * arrays per unit, written block by block and read back by range (the
 * formats are described in shard_file.h).
 *
 * A shard file is checked against the layout the manifest implies before a
 * single payload byte is trusted. Assumes a little-endian host (checked at
 * compile time), as llm.c's files do.
 *
 * Checksums: version 2 uses XXH64 (libxxhash), a 64-bit hash with full
 * avalanche, so any change to a block (two sign flips included) changes
 * its sum with probability 1 - 2^-64, at memory speed. Version-1 files are
 * verified with the sum they were written with (an FNV-1a-style xor and
 * multiply over 64-bit words) and can only be read.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt_dir.h"
#include "ckpt/shard_file.h"
#include "core/error.h"
#include "core/fileio.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "checkpoint files are little-endian; add byte swapping for this host");

#define SHARD_MAGIC "FSDPCKPT"
#define V1_HEADER_BYTES 64
#define V2_HEADER_BYTES 72
#define NAME_BYTES FSDP_CKPT_ARRAY_NAME_MAX

static const char *errstr(void) { return strerror(errno); }

/* The default layout, and every version-1 file's. */
static const char *const adamw_arrays[3] = {"master", "adam_m", "adam_v"};

bool fsdp_ckpt_array_name_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= NAME_BYTES)
        return false;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return false;
    return true;
}

/* ---- checksums ------------------------------------------------------------ */

/* Version 1's block and header sum (verification of old files only). */
#define V1_OFFSET 1469598103934665603ull
#define V1_PRIME 1099511628211ull

static uint64_t v1_sum(const void *p, size_t n)
{
    const unsigned char *c = p;
    uint64_t h = V1_OFFSET;
    size_t words = n / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, c + 8 * i, 8);
        h = (h ^ w) * V1_PRIME;
    }
    size_t rest = n % 8;
    if (rest) {
        uint64_t w = 0;
        memcpy(&w, c + 8 * words, rest);
        h = (h ^ w) * V1_PRIME;
    }
    return h;
}

static uint64_t checksum(int version, const void *p, size_t n)
{
    return version == 1 ? v1_sum(p, n) : (uint64_t)XXH64(p, n, 0);
}

/* ---- layout --------------------------------------------------------------- */

/* Byte layout of a shard file, computed from its version, array count and
 * unit sizes. */
typedef struct shard_layout {
    int version;
    int n_arrays;
    size_t header_bytes;       /* the fixed header */
    size_t table_bytes;        /* header + name table + unit table + checksum table */
    size_t n_sums;
    size_t *sum0;              /* [n_units] first checksum index of the unit */
    uint64_t *payload;         /* [n_units] byte offset of the unit's first array */
    uint64_t total;            /* file size */
} shard_layout;

static size_t n_blocks(size_t numel)
{
    return (numel + FSDP_CKPT_BLOCK_NUMEL - 1) / FSDP_CKPT_BLOCK_NUMEL;
}

static void layout_free(shard_layout *l)
{
    free(l->sum0);
    free(l->payload);
    memset(l, 0, sizeof *l);
}

static fsdp_status layout_init(shard_layout *l, int version, int n_arrays, int n_units,
                               const size_t *shard_numel, const char *path)
{
    memset(l, 0, sizeof *l);
    l->version = version;
    l->n_arrays = n_arrays;
    l->header_bytes = version == 1 ? V1_HEADER_BYTES : V2_HEADER_BYTES;
    l->sum0 = calloc((size_t)n_units + 1, sizeof *l->sum0);
    l->payload = calloc((size_t)n_units + 1, sizeof *l->payload);
    if (!l->sum0 || !l->payload) {
        layout_free(l);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
    }
    uint64_t sums = 0;
    for (int u = 0; u < n_units; u++) {
        l->sum0[u] = (size_t)sums;
        sums += (uint64_t)n_arrays * (uint64_t)n_blocks(shard_numel[u]);
    }
    l->n_sums = (size_t)sums;
    uint64_t names = version == 1 ? 0 : (uint64_t)n_arrays * NAME_BYTES;
    uint64_t off = l->header_bytes + names + 16 * (uint64_t)n_units + 8 * sums;
    l->table_bytes = (size_t)off;
    off = (off + 63) / 64 * 64;
    bool ovf = false;
    for (int u = 0; u < n_units; u++) {
        l->payload[u] = off;
        uint64_t bytes;
        ovf |= __builtin_mul_overflow((uint64_t)shard_numel[u], 4 * (uint64_t)n_arrays, &bytes);
        ovf |= __builtin_add_overflow(off, bytes, &off);
    }
    if (ovf) {
        layout_free(l);
        return fsdp_error_set(FSDP_STATUS_FORMAT, "shard file '%s' would exceed 2^64 bytes", path);
    }
    l->total = off;
    return FSDP_STATUS_OK;
}

static uint64_t block_offset(const shard_layout *l, int u, size_t S, int a, size_t b)
{
    return l->payload[u] + ((uint64_t)a * S + (uint64_t)b * FSDP_CKPT_BLOCK_NUMEL) * 4;
}

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* Header field offsets (both versions agree up to H_T). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_BYTES = 12, H_RANK = 16, H_WORLD = 20, H_UNITS = 24,
    H_BLOCK = 28, H_RUN_ID = 32, H_STEP = 40, H_T = 48,
    H1_SUM = 56,                                   /* version 1 */
    H2_ARRAYS = 56, H2_ZERO = 60, H2_SUM = 64,     /* version 2 */
};

static size_t sum_field(int version) { return version == 1 ? H1_SUM : H2_SUM; }

/* The array list of a shard info, the default one when it names none. */
static int info_arrays(const fsdp_ckpt_shard_info *info, const char *const **names)
{
    if (info->n_arrays == 0) {
        *names = adamw_arrays;
        return 3;
    }
    *names = info->array_names;
    return info->n_arrays;
}

/* A valid array list: 1..MAX names, valid, unique, the first "master".
 * `bad` is the status to return otherwise (the caller's argument, or the
 * file's format). */
static fsdp_status check_array_list(int n, const char *const *names, const char *path,
                                    fsdp_status bad)
{
    if (n < 1 || n > FSDP_CKPT_MAX_ARRAYS || !names)
        return fsdp_error_set(bad, "shard file '%s': %d arrays per unit (1..%d)", path, n,
                              FSDP_CKPT_MAX_ARRAYS);
    for (int a = 0; a < n; a++) {
        if (!names[a] || !fsdp_ckpt_array_name_valid(names[a]))
            return fsdp_error_set(bad, "shard file '%s': array %d has no valid name ([a-z0-9_], "
                                  "at most %d characters)", path, a, NAME_BYTES - 1);
        for (int b = 0; b < a; b++)
            if (!strcmp(names[a], names[b]))
                return fsdp_error_set(bad, "shard file '%s': array name '%s' appears twice",
                                      path, names[a]);
    }
    if (strcmp(names[0], "master"))
        return fsdp_error_set(bad, "shard file '%s': array 0 is '%s', not 'master'", path,
                              names[0]);
    return FSDP_STATUS_OK;
}

/* "master, adam_m, adam_v" */
static const char *list_names(char *buf, size_t n, int count, const char *const *names)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int a = 0; a < count && at < n; a++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", a ? ", " : "", names[a]);
    return buf;
}

/* ---- writing -------------------------------------------------------------- */

struct fsdp_ckpt_writer {
    int fd;
    char path[FSDP_CKPT_PATH_MAX];
    fsdp_ckpt_shard_info info;
    size_t *shard_numel, *first;
    char names[FSDP_CKPT_MAX_ARRAYS][NAME_BYTES];
    shard_layout lay;
    uint64_t *sums;
    unsigned char *written;    /* [n_sums] */
};

static void writer_free(fsdp_ckpt_writer *w)
{
    if (w->fd >= 0)
        close(w->fd);
    free(w->shard_numel);
    free(w->first);
    free(w->sums);
    free(w->written);
    layout_free(&w->lay);
    free(w);
}

fsdp_status fsdp_ckpt_writer_open(fsdp_ckpt_writer **out, const char *path,
                                  const fsdp_ckpt_shard_info *info)
{
    *out = NULL;
    const char *const *names;
    int n_arrays = info_arrays(info, &names);
    FSDP_TRY(check_array_list(n_arrays, names, path, FSDP_STATUS_INVALID_ARG));
    fsdp_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
    w->fd = -1;
    snprintf(w->path, sizeof w->path, "%s", path);
    w->info = *info;
    for (int a = 0; a < n_arrays; a++)
        snprintf(w->names[a], NAME_BYTES, "%s", names[a]);
    w->info.n_arrays = n_arrays;
    w->info.array_names = NULL; /* w->names */
    size_t U = (size_t)info->n_units;
    w->shard_numel = malloc(U * sizeof(size_t) + 1);
    w->first = malloc(U * sizeof(size_t) + 1);
    fsdp_status st;
    if (!w->shard_numel || !w->first) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    memcpy(w->shard_numel, info->shard_numel, U * sizeof(size_t));
    memcpy(w->first, info->first, U * sizeof(size_t));
    w->info.shard_numel = w->shard_numel;
    w->info.first = w->first;
    FSDP_CHECK(layout_init(&w->lay, FSDP_CKPT_SHARD_VERSION, n_arrays, info->n_units,
                           w->shard_numel, path));
    w->sums = calloc(w->lay.n_sums + 1, sizeof *w->sums);
    w->written = calloc(w->lay.n_sums + 1, 1);
    if (!w->sums || !w->written) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot create checkpoint file '%s': %s", path,
                            errstr());
        goto fail;
    }
    *out = w;
    return FSDP_STATUS_OK;
fail:
    writer_free(w);
    return st;
}

fsdp_status fsdp_ckpt_writer_put(fsdp_ckpt_writer *w, int u, int a, size_t block,
                                 const float *data)
{
    FSDP_ASSERT(u >= 0 && u < w->info.n_units && a >= 0 && a < w->lay.n_arrays);
    size_t S = w->shard_numel[u], nb = n_blocks(S);
    FSDP_ASSERT(block < nb);
    size_t lo = block * FSDP_CKPT_BLOCK_NUMEL;
    size_t n = S - lo < FSDP_CKPT_BLOCK_NUMEL ? S - lo : FSDP_CKPT_BLOCK_NUMEL;
    FSDP_TRY(fsdp_pwrite_all(w->fd, data, n * 4, block_offset(&w->lay, u, S, a, block),
                             "checkpoint file", w->path));
    size_t k = w->lay.sum0[u] + (size_t)a * nb + block;
    w->sums[k] = checksum(w->lay.version, data, n * 4);
    w->written[k] = 1;
    return FSDP_STATUS_OK;
}

/* Header, name table, unit table and checksum table, with the header
 * checksum filled in (version 2). */
static unsigned char *build_tables(const fsdp_ckpt_writer *w)
{
    const fsdp_ckpt_shard_info *info = &w->info;
    const shard_layout *lay = &w->lay;
    unsigned char *h = calloc(lay->table_bytes, 1);
    if (!h)
        return NULL;
    memcpy(h + H_MAGIC, SHARD_MAGIC, 8);
    put_u32(h + H_VERSION, FSDP_CKPT_SHARD_VERSION);
    put_u32(h + H_HEADER_BYTES, V2_HEADER_BYTES);
    put_u32(h + H_RANK, (uint32_t)info->rank);
    put_u32(h + H_WORLD, (uint32_t)info->world_size);
    put_u32(h + H_UNITS, (uint32_t)info->n_units);
    put_u32(h + H_BLOCK, (uint32_t)FSDP_CKPT_BLOCK_NUMEL);
    put_u64(h + H_RUN_ID, info->run_id);
    put_u64(h + H_STEP, info->step);
    put_u64(h + H_T, info->adam_t);
    put_u32(h + H2_ARRAYS, (uint32_t)lay->n_arrays);
    unsigned char *t = h + V2_HEADER_BYTES;
    for (int a = 0; a < lay->n_arrays; a++)
        memcpy(t + (size_t)a * NAME_BYTES, w->names[a], NAME_BYTES); /* NUL-padded */
    t += (size_t)lay->n_arrays * NAME_BYTES;
    for (int u = 0; u < info->n_units; u++) {
        put_u64(t + 16 * (size_t)u, info->shard_numel[u]);
        put_u64(t + 16 * (size_t)u + 8, info->first[u]);
    }
    unsigned char *s = t + 16 * (size_t)info->n_units;
    for (size_t i = 0; i < lay->n_sums; i++)
        put_u64(s + 8 * i, w->sums[i]);
    put_u64(h + H2_SUM, checksum(lay->version, h, lay->table_bytes));
    return h;
}

fsdp_status fsdp_ckpt_writer_close(fsdp_ckpt_writer *w)
{
    fsdp_status st = FSDP_STATUS_OK;
    for (size_t i = 0; i < w->lay.n_sums; i++)
        if (!w->written[i]) {
            st = fsdp_error_set(FSDP_STATUS_INTERNAL, "shard file '%s': block %zu never written",
                                w->path, i);
            goto done;
        }
    unsigned char *h = build_tables(w);
    if (!h) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", w->path);
        goto done;
    }
    st = fsdp_pwrite_all(w->fd, h, w->lay.table_bytes, 0, "checkpoint file", w->path);
    free(h);
    /* the padding between the tables and the payload, and a file that is
     * exactly the layout's size even if some array is empty */
    if (st == FSDP_STATUS_OK && ftruncate(w->fd, (off_t)w->lay.total) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot size checkpoint file '%s': %s", w->path,
                            errstr());
    if (st == FSDP_STATUS_OK && fsync(w->fd) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot fsync checkpoint file '%s': %s", w->path,
                            errstr());
    if (close(w->fd) != 0 && st == FSDP_STATUS_OK)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot close checkpoint file '%s': %s", w->path,
                            errstr());
    w->fd = -1;
done:
    writer_free(w);
    return st;
}

void fsdp_ckpt_writer_abort(fsdp_ckpt_writer *w)
{
    if (w)
        writer_free(w);
}

/* ---- reading -------------------------------------------------------------- */

struct fsdp_ckpt_reader {
    int fd;
    char path[FSDP_CKPT_PATH_MAX];
    int n_units;
    size_t *shard_numel;
    char names[FSDP_CKPT_MAX_ARRAYS][NAME_BYTES];
    shard_layout lay;
    uint64_t *sums;
    float *block;              /* FSDP_CKPT_BLOCK_NUMEL: the last verified block */
    int cached_u;
    int cached_a;
    size_t cached_b;
};

void fsdp_ckpt_reader_close(fsdp_ckpt_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->shard_numel);
    free(r->sums);
    free(r->block);
    layout_free(&r->lay);
    free(r);
}

int fsdp_ckpt_reader_version(const fsdp_ckpt_reader *r) { return r->lay.version; }
int fsdp_ckpt_reader_n_arrays(const fsdp_ckpt_reader *r) { return r->lay.n_arrays; }

const char *fsdp_ckpt_reader_array_name(const fsdp_ckpt_reader *r, int a)
{
    return a >= 0 && a < r->lay.n_arrays ? r->names[a] : "?";
}

/* The fixed header: magic, version; for version 2 the array count. */
static fsdp_status read_header(fsdp_ckpt_reader *r, off_t size, int *version, int *n_arrays)
{
    unsigned char hd[V2_HEADER_BYTES];
    if ((uint64_t)size < V1_HEADER_BYTES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' is %lld bytes, shorter than its header "
                              "(truncated)", r->path, (long long)size);
    size_t n = (uint64_t)size < V2_HEADER_BYTES ? V1_HEADER_BYTES : V2_HEADER_BYTES;
    FSDP_TRY(fsdp_pread_all(r->fd, hd, n, 0, "checkpoint shard", r->path));
    if (memcmp(hd + H_MAGIC, SHARD_MAGIC, 8))
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "'%s' is not an fsdp checkpoint shard (bad magic)", r->path);
    uint32_t v = get_u32(hd + H_VERSION);
    if (v != 1 && v != FSDP_CKPT_SHARD_VERSION)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' has format version %u; this build reads "
                              "versions 1 and %d", r->path, v, FSDP_CKPT_SHARD_VERSION);
    *version = (int)v;
    if (v == 1) {
        *n_arrays = 3;
        return FSDP_STATUS_OK;
    }
    if (n < V2_HEADER_BYTES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' is %lld bytes, shorter than its %d-byte "
                              "header (truncated)", r->path, (long long)size, V2_HEADER_BYTES);
    uint32_t a = get_u32(hd + H2_ARRAYS);
    if (a < 1 || a > FSDP_CKPT_MAX_ARRAYS)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' declares %u arrays per unit (1..%d): the "
                              "header is corrupted", r->path, a, FSDP_CKPT_MAX_ARRAYS);
    *n_arrays = (int)a;
    return FSDP_STATUS_OK;
}

/* Version 2's name table, validated; version 1's fixed names. */
static fsdp_status read_names(fsdp_ckpt_reader *r, const unsigned char *t)
{
    int n = r->lay.n_arrays;
    for (int a = 0; a < n; a++) {
        if (r->lay.version == 1) {
            snprintf(r->names[a], NAME_BYTES, "%s", adamw_arrays[a]);
            continue;
        }
        const unsigned char *p = t + (size_t)a * NAME_BYTES;
        size_t len = strnlen((const char *)p, NAME_BYTES);
        bool padded = len < NAME_BYTES;
        for (size_t i = len; padded && i < NAME_BYTES; i++)
            padded = p[i] == 0;
        memcpy(r->names[a], p, NAME_BYTES);
        r->names[a][NAME_BYTES - 1] = '\0';
        if (!padded || !fsdp_ckpt_array_name_valid(r->names[a]))
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "checkpoint shard '%s': array %d's name is not a NUL-padded "
                                  "[a-z0-9_] name", r->path, a);
    }
    const char *list[FSDP_CKPT_MAX_ARRAYS];
    for (int a = 0; a < n; a++)
        list[a] = r->names[a];
    return check_array_list(n, list, r->path, FSDP_STATUS_FORMAT);
}

/* The arrays the caller expects (unless it takes any). */
static fsdp_status check_names(const fsdp_ckpt_reader *r, const fsdp_ckpt_shard_info *ex)
{
    if (ex->n_arrays == 0)
        return FSDP_STATUS_OK;
    bool same = ex->n_arrays == r->lay.n_arrays;
    for (int a = 0; same && a < ex->n_arrays; a++)
        same = ex->array_names[a] && !strcmp(ex->array_names[a], r->names[a]);
    if (same)
        return FSDP_STATUS_OK;
    const char *have[FSDP_CKPT_MAX_ARRAYS];
    for (int a = 0; a < r->lay.n_arrays; a++)
        have[a] = r->names[a];
    char got[256], want[256];
    list_names(got, sizeof got, r->lay.n_arrays, have);
    list_names(want, sizeof want, ex->n_arrays, ex->array_names);
    return fsdp_error_set(FSDP_STATUS_FORMAT,
                          "checkpoint shard '%s' holds the arrays (%s) per unit, the manifest "
                          "(%s)", r->path, got, want);
}

/* The header h (table_bytes of it, read from `path`) against its checksum
 * and what the manifest expects of rank ex->rank's file: FORMAT naming the
 * first field that differs. Zeroes the checksum field in h. */
static fsdp_status check_header(unsigned char *h, int version, const shard_layout *lay,
                                const fsdp_ckpt_shard_info *ex, const char *path)
{
    size_t sum_at = sum_field(version);
    uint64_t want = get_u64(h + sum_at);
    put_u64(h + sum_at, 0);
    if (checksum(version, h, lay->table_bytes) != want)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s': header checksum mismatch (the file is "
                              "corrupted)", path);
    if (version == 2 && get_u32(h + H2_ZERO) != 0)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s': a reserved header field is not zero (written "
                              "by a newer build?)", path);
    if (get_u32(h + H_HEADER_BYTES) != lay->header_bytes ||
        get_u32(h + H_BLOCK) != FSDP_CKPT_BLOCK_NUMEL ||
        get_u32(h + H_UNITS) != (uint32_t)ex->n_units)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' has %u units (block %u), the manifest %d "
                              "(block %zu)", path, get_u32(h + H_UNITS), get_u32(h + H_BLOCK),
                              ex->n_units, FSDP_CKPT_BLOCK_NUMEL);
    if (get_u64(h + H_RUN_ID) != ex->run_id || get_u64(h + H_STEP) != ex->step)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' belongs to another checkpoint (run %016"
                              PRIx64 " step %" PRIu64 ", the manifest's is run %016" PRIx64
                              " step %" PRIu64 "): files of different checkpoints were mixed",
                              path, get_u64(h + H_RUN_ID), get_u64(h + H_STEP), ex->run_id,
                              ex->step);
    if (get_u32(h + H_RANK) != (uint32_t)ex->rank ||
        get_u32(h + H_WORLD) != (uint32_t)ex->world_size)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' is rank %u of %u, expected rank %d of %d",
                              path, get_u32(h + H_RANK), get_u32(h + H_WORLD), ex->rank,
                              ex->world_size);
    if (get_u64(h + H_T) != ex->adam_t)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "checkpoint shard '%s' has optimizer step %" PRIu64 ", the manifest %"
                              PRIu64, path, get_u64(h + H_T), ex->adam_t);
    return FSDP_STATUS_OK;
}

/* Each unit's shard range in the table at t against the manifest's. */
static fsdp_status check_units(const unsigned char *t, const fsdp_ckpt_shard_info *ex,
                               const char *path)
{
    for (int u = 0; u < ex->n_units; u++) {
        uint64_t S = get_u64(t + 16 * (size_t)u), first = get_u64(t + 16 * (size_t)u + 8);
        if (S != ex->shard_numel[u] || first != ex->first[u])
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "checkpoint shard '%s' unit %d holds elements [%" PRIu64
                                  ", +%" PRIu64 "), the manifest says [%zu, +%zu)",
                                  path, u, first, S, ex->first[u], ex->shard_numel[u]);
    }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_reader_open(fsdp_ckpt_reader **out, const char *path,
                                  const fsdp_ckpt_shard_info *ex)
{
    *out = NULL;
    fsdp_status st;
    unsigned char *h = NULL;
    fsdp_ckpt_reader *r = calloc(1, sizeof *r);
    if (!r)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
    r->fd = -1;
    r->cached_u = -1;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->n_units = ex->n_units;
    r->shard_numel = malloc((size_t)ex->n_units * sizeof(size_t) + 1);
    r->block = malloc(FSDP_CKPT_BLOCK_NUMEL * sizeof(float));
    if (!r->shard_numel || !r->block) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    memcpy(r->shard_numel, ex->shard_numel, (size_t)ex->n_units * sizeof(size_t));
    struct stat pre;
    if (stat(path, &pre) != 0 && errno == ENOENT) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "cannot open checkpoint shard file '%s': %s (the "
                            "checkpoint is missing a rank's file)", path, errstr());
        goto fail;
    }
    st = fsdp_open_regular(path, "checkpoint shard file", &r->fd, NULL);
    if (st != FSDP_STATUS_OK) {
        r->fd = -1;
        goto fail;
    }
    struct stat sb;
    if (fstat(r->fd, &sb) != 0) {
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot stat checkpoint shard '%s': %s", path,
                            errstr());
        goto fail;
    }
    int version = 0, n_arrays = 0;
    FSDP_CHECK(read_header(r, sb.st_size, &version, &n_arrays));
    FSDP_CHECK(layout_init(&r->lay, version, n_arrays, ex->n_units, r->shard_numel, path));
    if ((uint64_t)sb.st_size != r->lay.total) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint shard '%s' is %lld bytes, but the manifest's layout for "
                            "rank %d with %d arrays per unit needs %" PRIu64 " (truncated, "
                            "corrupted, or not written for this checkpoint)",
                            path, (long long)sb.st_size, ex->rank, n_arrays, r->lay.total);
        goto fail;
    }
    h = malloc(r->lay.table_bytes);
    r->sums = malloc(r->lay.n_sums * sizeof *r->sums + 1);
    if (!h || !r->sums) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for shard file '%s'", path);
        goto fail;
    }
    FSDP_CHECK(fsdp_pread_all(r->fd, h, r->lay.table_bytes, 0, "checkpoint shard", path));
    FSDP_CHECK(check_header(h, version, &r->lay, ex, path));
    const unsigned char *t = h + r->lay.header_bytes;
    FSDP_CHECK(read_names(r, t));
    FSDP_CHECK(check_names(r, ex));
    if (version == 2)
        t += (size_t)n_arrays * NAME_BYTES;
    FSDP_CHECK(check_units(t, ex, path));
    const unsigned char *s = t + 16 * (size_t)ex->n_units;
    for (size_t i = 0; i < r->lay.n_sums; i++)
        r->sums[i] = get_u64(s + 8 * i);
    free(h);
    *out = r;
    return FSDP_STATUS_OK;
fail:
    free(h);
    fsdp_ckpt_reader_close(r);
    return st;
}

fsdp_status fsdp_ckpt_reader_read(fsdp_ckpt_reader *r, int u, int a, size_t first, size_t n,
                                  float *dst)
{
    FSDP_ASSERT(u >= 0 && u < r->n_units && a >= 0 && a < r->lay.n_arrays);
    size_t S = r->shard_numel[u];
    FSDP_ASSERT(first <= S && n <= S - first);
    size_t nb = n_blocks(S);
    while (n > 0) {
        size_t b = first / FSDP_CKPT_BLOCK_NUMEL, lo = b * FSDP_CKPT_BLOCK_NUMEL;
        size_t len = S - lo < FSDP_CKPT_BLOCK_NUMEL ? S - lo : FSDP_CKPT_BLOCK_NUMEL;
        if (r->cached_u != u || r->cached_a != a || r->cached_b != b) {
            r->cached_u = -1;
            FSDP_TRY(fsdp_pread_all(r->fd, r->block, len * 4, block_offset(&r->lay, u, S, a, b),
                                    "checkpoint shard", r->path));
            uint64_t want = r->sums[r->lay.sum0[u] + (size_t)a * nb + b];
            if (checksum(r->lay.version, r->block, len * 4) != want)
                return fsdp_error_set(FSDP_STATUS_FORMAT,
                                      "checkpoint shard '%s': unit %d %s elements [%zu, %zu) "
                                      "fail their checksum (the file is corrupted)",
                                      r->path, u, r->names[a], lo, lo + len);
            r->cached_u = u;
            r->cached_a = a;
            r->cached_b = b;
        }
        size_t k = first - lo, take = len - k < n ? len - k : n;
        memcpy(dst, r->block + k, take * 4);
        dst += take;
        first += take;
        n -= take;
    }
    return FSDP_STATUS_OK;
}

/* ---- test hook ------------------------------------------------------ */

static atomic_ullong stall_from;
static atomic_int stall_ms;

void fsdp_ckpt_test_set_stall(uint64_t from_step, int ms)
{
    atomic_store(&stall_from, (unsigned long long)from_step);
    atomic_store(&stall_ms, ms > 0 ? ms : 0);
}

int fsdp_ckpt_test_stall_ms(uint64_t step)
{
    int ms = atomic_load(&stall_ms);
    return ms > 0 && step >= (uint64_t)atomic_load(&stall_from) ? ms : 0;
}
