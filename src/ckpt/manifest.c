/*
 * manifest.c - the checkpoint manifest read back (versions 1 to 4) with
 * every field validated, and its checksum (the format is described in
 * manifest.h; the header's keys are read in manifest_header.c, writing is
 * in manifest_write.c; the model part, building the recorded model and
 * checking against it, is in manifest_model.c).
 *
 * Everything read from disk is treated as hostile: the parser bounds every
 * number before it sizes an allocation or a computation (all size
 * arithmetic is overflow-checked in 64 bits), and every key must appear
 * exactly once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/manifest_internal.h"
#include "core/error.h"
#include "core/fileio.h"

#define MANIFEST_MAX_BYTES ((size_t)16 << 20)

static const char *errstr(void) { return strerror(errno); }

/* ---- manifest: freeing --------------------------------------------------------- */

void fsdp_ckpt_manifest_free(fsdp_ckpt_manifest *m)
{
    if (m->units)
        for (int u = 0; u < m->n_units; u++)
            free(m->units[u].params);
    free(m->units);
    for (int i = 0; i < m->n_tok_files; i++)
        free(m->tok_files[i].data);
    memset(m, 0, sizeof *m);
}

/* ---- manifest: parsing ---------------------------------------------------------- */

static fsdp_status parse_unit_line(const fsdp_mf_parser *ps, char *line, int index, int lines_left,
                                   const fsdp_ckpt_manifest *m, fsdp_ckpt_unit *cu)
{
    char *t[16];
    int n = fsdp_mf_tokenize(line, t, 16);
    if (n != 11 || strcmp(t[0], "unit") || strcmp(t[3], "numel") || strcmp(t[5], "padded") ||
        strcmp(t[7], "shard") || strcmp(t[9], "params"))
        return fsdp_mf_bad(
            ps, "expected 'unit <index> <name> numel <n> padded <n> shard <n> params <n>'");
    int idx;
    if (!fsdp_mf_int(t[1], 0, 1 << 30, &idx) || idx != index)
        return fsdp_mf_bad(ps, "unit index '%s' should be %d", t[1], index);
    if (!fsdp_mf_name_valid(t[2], sizeof cu->name))
        return fsdp_mf_bad(ps,
                           "unit name '%s' is empty, too long or has characters other than "
                           "[A-Za-z0-9._-]",
                           t[2]);
    snprintf(cu->name, sizeof cu->name, "%s", t[2]);
    /* With frozen parameters (a `base` line, which comes before the units) a unit may
     * train nothing: numel, padded, shard and params all 0. */
    uint64_t low = m->base[0] ? 0 : 1, numel, padded, shard;
    if (!fsdp_mf_u64(t[4], MAX_NUMEL, &numel) || numel < low)
        return fsdp_mf_bad(ps, "unit '%s' numel '%s' is not in %d..2^48", cu->name, t[4], (int)low);
    if (!fsdp_mf_u64(t[6], MAX_NUMEL, &padded) || padded < numel || (!numel && padded))
        return fsdp_mf_bad(ps, "unit '%s' padded numel '%s' is not in numel..2^48 (0 with numel 0)",
                           cu->name, t[6]);
    if (!fsdp_mf_u64(t[8], MAX_NUMEL, &shard) || (numel && !shard))
        return fsdp_mf_bad(ps, "unit '%s' shard numel '%s' is not in 1..2^48", cu->name, t[8]);
    uint64_t parts = (uint64_t)fsdp_ckpt_n_shards(m);
    if (padded % parts || padded / parts != shard)
        return fsdp_mf_bad(ps,
                           "unit '%s': shard numel %" PRIu64 " does not split padded numel %" PRIu64
                           " over %d rank(s) (world_size %d, shard %s)",
                           cu->name, shard, padded, (int)parts, m->world_size, m->shard);
    if (!fsdp_mf_int(t[10], numel ? 1 : 0, numel ? (lines_left > 0 ? lines_left : 1) : 0,
                     &cu->n_params) ||
        cu->n_params > lines_left)
        return fsdp_mf_bad(ps,
                           "unit '%s' params '%s' is not in %d..%d (the lines left in the file; 0 "
                           "exactly for a unit that trains nothing)",
                           cu->name, t[10], numel ? 1 : 0, numel ? lines_left : 0);
    cu->numel = numel;
    cu->padded_numel = padded;
    cu->shard_numel = shard;
    cu->line = ps->line;
    cu->params = calloc((size_t)cu->n_params + 1, sizeof *cu->params);
    if (!cu->params)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading manifest '%s'",
                              ps->path);
    return FSDP_STATUS_OK;
}

/* Version 4's `rows R at A`: each of the n_shards files holds R rows of
 * the parameter (the last ones fewer or none) at element A of its unit
 * arrays, after the previous parameter's span (*at_min) and inside the
 * shard. */
static fsdp_status parse_rows(const fsdp_mf_parser *ps, char **t, const fsdp_ckpt_unit *cu,
                              int n_shards, size_t *at_min, fsdp_ckpt_param *p)
{
    uint64_t rows = (uint64_t)p->shape[0], rn = p->numel / rows, R, at;
    if (!fsdp_mf_u64(t[9], MAX_NUMEL, &R) || !fsdp_mf_u64(t[11], MAX_NUMEL, &at) || R == 0 ||
        R > rows)
        return fsdp_mf_bad(ps, "parameter '%s': rows and at must be numbers up to 2^48, rows "
                           "1 to its %" PRIu64 " rows", p->name, rows);
    if (R * (uint64_t)n_shards < rows)
        return fsdp_mf_bad(ps, "parameter '%s': %" PRIu64 " rows per shard do not hold its %"
                           PRIu64 " rows in %d shard file(s)", p->name, R, rows, n_shards);
    if (at < *at_min || at + R * rn > cu->shard_numel)
        return fsdp_mf_bad(ps, "parameter '%s': its rows at %" PRIu64 "..%" PRIu64 " overlap the "
                           "previous parameter's (which end at %zu) or pass the shard's end (%zu)",
                           p->name, at, at + R * rn, *at_min, cu->shard_numel);
    p->shard_rows = (size_t)R;
    p->shard_at = (size_t)at;
    *at_min = (size_t)(at + R * rn);
    return FSDP_STATUS_OK;
}

static fsdp_status parse_param_line(const fsdp_mf_parser *ps, char *line, const fsdp_ckpt_unit *cu,
                                    size_t expect_offset, const fsdp_ckpt_manifest *m,
                                    size_t *at_min, fsdp_ckpt_param *p)
{
    char *t[16];
    int n = fsdp_mf_tokenize(line, t, 16), want = m->version >= 4 ? 12 : 8;
    if (n != want || strcmp(t[0], "param") || strcmp(t[2], "shape") || strcmp(t[4], "offset") ||
        strcmp(t[6], "numel") || (want == 12 && (strcmp(t[8], "rows") || strcmp(t[10], "at"))))
        return fsdp_mf_bad(ps,
                           "expected 'param <name> shape <d0,d1,..> offset <n> numel <n>%s' "
                           "(unit '%s' declares %d parameters)",
                           want == 12 ? " rows <n> at <n>" : "", cu->name, cu->n_params);
    if (!fsdp_mf_name_valid(t[1], sizeof p->name))
        return fsdp_mf_bad(ps,
                           "parameter name '%s' is empty, too long or has characters other than "
                           "[A-Za-z0-9._-]",
                           t[1]);
    snprintf(p->name, sizeof p->name, "%s", t[1]);
    /* shape: 1..4 positive dims, comma separated */
    char *s = t[3];
    uint64_t prod = 1;
    p->ndim = 0;
    for (;;) {
        char *comma = strchr(s, ',');
        if (comma)
            *comma = '\0';
        uint64_t d;
        if (p->ndim == 4 || !fsdp_mf_u64(s, MAX_DIM, &d) || d == 0)
            return fsdp_mf_bad(ps, "parameter '%s': shape needs 1 to 4 dimensions in 1..2^40",
                               p->name);
        if (__builtin_mul_overflow(prod, d, &prod) || prod > MAX_NUMEL)
            return fsdp_mf_bad(ps, "parameter '%s': shape has more than 2^48 elements", p->name);
        p->shape[p->ndim++] = (int64_t)d;
        if (!comma)
            break;
        s = comma + 1;
    }
    uint64_t off, numel;
    if (!fsdp_mf_u64(t[5], MAX_NUMEL, &off) || !fsdp_mf_u64(t[7], MAX_NUMEL, &numel))
        return fsdp_mf_bad(ps, "parameter '%s': offset and numel must be numbers up to 2^48",
                           p->name);
    if (numel != prod)
        return fsdp_mf_bad(
            ps, "parameter '%s': numel %" PRIu64 " is not the product of its shape (%" PRIu64 ")",
            p->name, numel, prod);
    if (off != expect_offset)
        return fsdp_mf_bad(ps,
                           "parameter '%s': offset %" PRIu64 " should be %zu (parameters tile the "
                           "unit's flat buffer in order)",
                           p->name, off, expect_offset);
    if (off + numel > cu->numel)
        return fsdp_mf_bad(ps, "parameter '%s' ends at %" PRIu64 ", past unit '%s''s numel %zu",
                           p->name, off + numel, cu->name, cu->numel);
    p->numel = numel;
    p->offset = off;
    p->line = ps->line;
    return want == 12 ? parse_rows(ps, t, cu, fsdp_ckpt_n_shards(m), at_min, p) : FSDP_STATUS_OK;
}

/* The manifest's bytes into *text (NUL-terminated, *size bytes before the
 * NUL; the caller frees it): a regular file of at most MANIFEST_MAX_BYTES.
 * FORMAT when it is missing, not a regular file or too large; IO when it
 * cannot be read. */
static fsdp_status read_text(const char *path, char **text, size_t *size)
{
    /* O_NONBLOCK: a FIFO must not hang the open; it is refused below */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return fsdp_error_set(errno == ENOENT ? FSDP_STATUS_FORMAT : FSDP_STATUS_IO,
                              "cannot open checkpoint manifest '%s': %s", path, errstr());
    struct stat sb;
    fsdp_status st = FSDP_STATUS_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        st = fsdp_error_set(FSDP_STATUS_FORMAT, "checkpoint manifest '%s' is not a regular file",
                            path);
    else if ((uint64_t)sb.st_size > MANIFEST_MAX_BYTES)
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "checkpoint manifest '%s' is %lld bytes, more than the %zu MiB a "
                            "manifest can be", path, (long long)sb.st_size,
                            MANIFEST_MAX_BYTES >> 20);
    else if (!(*text = malloc((size_t)sb.st_size + 1)))
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading manifest '%s'", path);
    if (st == FSDP_STATUS_OK) {
        *size = (size_t)sb.st_size;
        st = fsdp_pread_all(fd, *text, *size, 0, "checkpoint manifest", path);
        if (st == FSDP_STATUS_OK)
            (*text)[*size] = '\0';
        else
            free(*text);
    }
    close(fd);
    return st;
}

/* A line is at most FSDP_CKPT_MANIFEST_LINE_MAX characters of plain text, ended by
 * LF alone. */
static fsdp_status check_line(const fsdp_mf_parser *ps, const char *line, size_t len)
{
    if (len > FSDP_CKPT_MANIFEST_LINE_MAX)
        return fsdp_mf_bad(ps, "line is longer than %d characters", FSDP_CKPT_MANIFEST_LINE_MAX);
    if (len > 0 && line[len - 1] == '\r')
        return fsdp_mf_bad(ps, "the line ends in a carriage return (CRLF line endings); a manifest "
                               "uses LF line endings only");
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
            return fsdp_mf_bad(ps,
                               "control character 0x%02x at column %zu (a manifest is plain text)",
                               (unsigned char)line[i], i + 1);
    return FSDP_STATUS_OK;
}


/* A line after `units N`: the next unit's line, one of its parameters'
 * (which tile the unit in order), or `end` after the last unit. */
static fsdp_status units_line(fsdp_mf_reader *r, char *line, int lines_left, fsdp_ckpt_manifest *m)
{
    if (r->unit < m->n_units && r->param == 0 && !m->units[r->unit].params) {
        r->offset = 0;
        r->at = 0;
        FSDP_TRY(parse_unit_line(&r->ps, line, r->unit, lines_left, m, &m->units[r->unit]));
        if (!m->units[r->unit].n_params) /* a unit that trains nothing: no param lines */
            r->unit++;
        return FSDP_STATUS_OK;
    }
    if (r->unit == m->n_units) {
        if (strcmp(line, "end"))
            return fsdp_mf_bad(&r->ps, "expected 'end' after the %d units", m->n_units);
        r->phase = END;
        return FSDP_STATUS_OK;
    }
    fsdp_ckpt_unit *cu = &m->units[r->unit];
    FSDP_TRY(parse_param_line(&r->ps, line, cu, r->offset, m, &r->at, &cu->params[r->param]));
    r->offset += cu->params[r->param].numel;
    if (++r->param == cu->n_params) {
        if (r->offset != cu->numel)
            return fsdp_mf_bad(&r->ps, "unit '%s''s parameters hold %zu elements, its numel is %zu",
                               cu->name, r->offset, cu->numel);
        r->param = 0;
        r->unit++;
    }
    return FSDP_STATUS_OK;
}

/* Every line of text (size bytes, modified in place), in order. */
static fsdp_status parse_lines(fsdp_mf_reader *r, char *text, size_t size, fsdp_ckpt_manifest *m)
{
    char *cur = text, *end = text + size;
    while (cur < end) {
        char *nl = memchr(cur, '\n', (size_t)(end - cur));
        char *line = cur;
        size_t len = nl ? (size_t)(nl - cur) : (size_t)(end - cur);
        cur += len + (nl ? 1 : 0);
        line[len] = '\0';
        r->ps.line++;
        FSDP_TRY(check_line(&r->ps, line, len));
        if (len == 0 || line[0] == '#')
            continue;
        /* declared counts are bounded by the lines the rest of the file can
         * hold, so a hostile count cannot size a large allocation */
        int lines_left = (int)((size_t)(end - cur) / MANIFEST_MIN_LINE);
        if (r->phase == END)
            return fsdp_mf_bad(&r->ps, "text after 'end'");
        FSDP_TRY(r->phase == HEADER ? fsdp_mf_header_line(r, line, len, lines_left, m)
                                    : units_line(r, line, lines_left, m));
    }
    if (r->phase == END)
        return FSDP_STATUS_OK;
    r->ps.line++;
    return r->phase == HEADER ? fsdp_mf_bad(&r->ps, "the file ends before 'units' (truncated?)")
                              : fsdp_mf_bad(&r->ps, "the file ends before 'end' (truncated?)");
}

/* Version 3's last line, `checksum <16 hex digits>`: XXH64 (seed 0) of
 * every byte before it (manifest.h). Taken from the text before it is
 * parsed (parsing edits the text in place); the lines before it parse as
 * in version 2. */
typedef struct checksum_line {
    size_t body;     /* bytes before the checksum line (all of them when there is none) */
    int line;        /* its line number, or the line after the last when there is none */
    bool found;      /* the last line is a `checksum` line */
    bool valid;      /* ... with 16 lower-case hex digits, in sum */
    uint64_t sum;    /* as written */
    uint64_t digest; /* XXH64 of the body */
} checksum_line;

static void checksum_split(const char *text, size_t size, checksum_line *c)
{
    static const char key[] = "checksum ";
    const size_t kn = sizeof key - 1;
    memset(c, 0, sizeof *c);
    size_t end = size > 0 && text[size - 1] == '\n' ? size - 1 : size, start = end;
    while (start > 0 && text[start - 1] != '\n')
        start--;
    c->found = end - start >= kn && !memcmp(text + start, key, kn);
    c->body = c->found ? start : size;
    if (c->found && end - start - kn == 16) {
        char hex[17];
        memcpy(hex, text + start + kn, 16);
        hex[16] = '\0';
        c->valid = fsdp_mf_hex64(hex, &c->sum);
    }
    c->line = 1;
    for (size_t i = 0; i < c->body; i++)
        c->line += text[i] == '\n';
    c->digest = (uint64_t)XXH64(text, c->body, 0);
}

/* Version 3 must end with a checksum that matches; versions 1 and 2 have
 * none (the shard files are their only check). */
static fsdp_status checksum_check(const char *path, const checksum_line *c, int version)
{
    fsdp_mf_parser ps = {.path = path, .line = c->line};
    if (version < 3)
        return c->found ? fsdp_mf_bad(&ps, "key 'checksum' is not part of a version-%d manifest",
                                      version)
                        : FSDP_STATUS_OK;
    if (!c->found)
        return fsdp_mf_bad(&ps, "the file ends without its 'checksum' line (truncated?)");
    if (!c->valid)
        return fsdp_mf_bad(&ps, "checksum is not 16 lower-case hex digits");
    if (c->sum != c->digest)
        return fsdp_mf_bad(&ps,
                           "checksum %016" PRIx64
                           " does not match the text before it (XXH64 %016" PRIx64
                           "): the manifest was edited or is corrupt, and may describe "
                           "another model than its shard files hold; restore the original",
                           c->sum, c->digest);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_manifest_read(const char *path, fsdp_ckpt_manifest *m)
{
    memset(m, 0, sizeof *m);
    char *text = NULL;
    size_t size = 0;
    FSDP_TRY(read_text(path, &text, &size));
    checksum_line sum;
    checksum_split(text, size, &sum);
    fsdp_mf_reader r = {.ps = {.path = path, .line = 0}, .phase = HEADER};
    fsdp_status st = parse_lines(&r, text, sum.body, m);
    free(text);
    if (st == FSDP_STATUS_OK) { /* the recorded model builds, and the unit lines are its units */
        fsdp_model model;
        st = fsdp_ckpt_manifest_model(m, path, &model);
        if (st == FSDP_STATUS_OK)
            fsdp_model_free(&model);
    }
    if (st == FSDP_STATUS_OK) /* last: a field's own error says more than a checksum does */
        st = checksum_check(path, &sum, m->version);
    if (st != FSDP_STATUS_OK)
        fsdp_ckpt_manifest_free(m);
    return st;
}
