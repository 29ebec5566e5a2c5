/*
 * outputs.c - checking a run's outputs before step 1, and the metrics file
 * with every write checked (outputs.h).
 *
 * A probe is a real creation: permission bits say little to root, and a
 * read-only or full filesystem, /proc or a missing parent only show when a
 * file is made. Probe files are named ".fsdp-probe-XXXXXX" and removed at
 * once.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "train/outputs.h"

/* Create a file in dir and remove it again. */
static fsdp_status probe_dir(const char *dir, const char *what, const char *path)
{
    char tmpl[4096];
    int n = snprintf(tmpl, sizeof tmpl, "%s/.fsdp-probe-XXXXXX", dir);
    if (n < 0 || (size_t)n >= sizeof tmpl)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s '%s': the path is too long", what,
                              path);
    int fd = mkstemp(tmpl);
    if (fd < 0)
        return fsdp_error_set(FSDP_STATUS_IO,
                              "%s '%s': cannot create files in '%s': %s; choose a writable "
                              "location (this is checked before step 1)",
                              what, path, dir, strerror(errno));
    close(fd);
    unlink(tmpl);
    return FSDP_STATUS_OK;
}

void fsdp_output_process_path(const char *path, int q, char *out, size_t n)
{
    const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
    if (q == 0)
        snprintf(out, n, "%s", path);
    else if (dot && dot > (slash ? slash + 1 : path))
        snprintf(out, n, "%.*s.%d%s", (int)(dot - path), path, q, dot);
    else
        snprintf(out, n, "%s.%d", path, q);
}

void fsdp_output_flight_path(const char *log_path, int q, char *out, size_t n)
{
    char base[4096 + 16];
    if (!log_path) {
        snprintf(base, sizeof base, "fsdp_flight.json");
    } else {
        const char *slash = strrchr(log_path, '/'), *dot = strrchr(log_path, '.');
        int keep = dot && dot > (slash ? slash + 1 : log_path) ? (int)(dot - log_path)
                                                                : (int)strlen(log_path);
        snprintf(base, sizeof base, "%.*s.flight.json", keep, log_path);
    }
    fsdp_output_process_path(base, q, out, n);
}

fsdp_status fsdp_output_dir_check(const char *dir, const char *what)
{
    char p[4096];
    int n = snprintf(p, sizeof p, "%s", dir);
    if (n <= 0 || (size_t)n >= sizeof p)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s '%s': empty or too long a path", what,
                              dir);
    /* mkdir -p */
    for (char *s = p + 1;; s++) {
        bool end = *s == '\0';
        if (*s != '/' && !end)
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "%s '%s': cannot create directory '%s': %s; choose a writable "
                                  "location (this is checked before step 1)",
                                  what, dir, p, strerror(errno));
        if (end)
            break;
        *s = '/';
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return fsdp_error_set(FSDP_STATUS_IO, "%s '%s' exists and is not a directory", what, dir);
    return probe_dir(dir, what, dir);
}

fsdp_status fsdp_output_file_check(const char *path, const char *what)
{
    if (!*path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s: empty path", what);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode))
            return fsdp_error_set(FSDP_STATUS_IO, "%s '%s' is a directory; give a file name",
                                  what, path);
        if (access(path, W_OK) != 0)
            return fsdp_error_set(FSDP_STATUS_IO, "%s '%s' cannot be written: %s", what, path,
                                  strerror(errno));
        return FSDP_STATUS_OK;
    }
    if (errno != ENOENT)
        return fsdp_error_set(FSDP_STATUS_IO, "%s '%s': %s", what, path, strerror(errno));
    char dir[4096];
    int n = snprintf(dir, sizeof dir, "%s", path);
    if (n < 0 || (size_t)n >= sizeof dir)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s '%s': the path is too long", what,
                              path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    return probe_dir(dir, what, path);
}

/* ---- the metrics file ------------------------------------------------------ */

fsdp_status fsdp_metrics_open(fsdp_metrics_file *m, const char *path, bool append, fsdp_world *w)
{
    *m = (fsdp_metrics_file){.path = path, .world = w};
    m->f = fopen(path, append ? "a" : "w");
    if (!m->f)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open metrics file '%s' for writing: %s",
                              path, strerror(errno));
    return FSDP_STATUS_OK;
}

/* A JSON number, or null when v is not finite. */
static void num(fsdp_sbuf *b, const char *key, const char *fmt, double v)
{
    fsdp_sbuf_printf(b, ",\"%s\":", key);
    if (isfinite(v))
        fsdp_sbuf_printf(b, fmt, v);
    else
        fsdp_sbuf_printf(b, "null");
}

fsdp_status fsdp_metrics_write(fsdp_metrics_file *m, const fsdp_metrics_record *r)
{
    if (m->failed)
        return fsdp_error_set(FSDP_STATUS_IO, "metrics file '%s' failed earlier", m->path);
    fsdp_sbuf b = {0};
    fsdp_sbuf_printf(&b, "{\"step\":%d", r->step);
    num(&b, "loss", "%.9g", r->loss);
    num(&b, "lr", "%.9g", r->lr);
    num(&b, "grad_norm", "%.9g", r->grad_norm);
    num(&b, "tokens", "%.0f", r->tokens);
    num(&b, "tokens_per_s", "%.6g", r->tokens_per_s);
    num(&b, "step_ms", "%.6g", r->step_ms);
    num(&b, "mfu", "%.6g", r->mfu >= 0 ? r->mfu : NAN);
    static const char *const keys[4] = {"peak_bytes", "comm_bytes", "host_bytes", "inter_bytes"};
    for (int k = 0; k < (r->inter ? 4 : 3); k++) {
        fsdp_sbuf_printf(&b, ",\"%s\":[", keys[k]);
        for (int d = 0; d < r->n_ranks; d++) {
            const fsdp_rank_stats *s = &r->stats[d];
            size_t v = k == 0   ? s->peak_bytes
                       : k == 1 ? s->comm_recv_bytes
                       : k == 2 ? s->host_peak_bytes
                                : s->inter_recv_bytes;
            fsdp_sbuf_printf(&b, "%s%zu", d ? "," : "", v);
        }
        fsdp_sbuf_printf(&b, "]");
    }
    if (r->skipped)
        fsdp_sbuf_printf(&b, ",\"skipped\":true");
    if (r->has_eval) {
        num(&b, "eval_loss", "%.9g", r->eval_loss);
        num(&b, "eval_ppl", "%.9g", exp(r->eval_loss));
    }
    if (r->resumed_from > 0)
        fsdp_sbuf_printf(&b, ",\"resumed_from\":%d", r->resumed_from);
    fsdp_sbuf_printf(&b, "}\n");
    fsdp_status st = FSDP_STATUS_OK;
    if (b.oom) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory formatting a metrics record");
    } else if (m->world && fsdp_world_fault_hit(m->world, FSDP_FAULT_WRITE, 0)) {
        st = fsdp_error_set(FSDP_STATUS_IO, "rank 0: injected write failure (metrics file '%s', "
                            "step %d)", m->path, r->step);
    } else {
        errno = 0;
        bool ok = fwrite(b.p, 1, b.n, m->f) == b.n;
        ok = ok && fflush(m->f) == 0;
        if (!ok)
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot write metrics file '%s' at step %d: %s",
                                m->path, r->step, errno ? strerror(errno) : "write error");
    }
    free(b.p);
    m->failed = st != FSDP_STATUS_OK;
    return st;
}

fsdp_status fsdp_metrics_close(fsdp_metrics_file *m)
{
    if (!m->f)
        return FSDP_STATUS_OK;
    errno = 0;
    bool ok = !ferror(m->f);
    ok = fclose(m->f) == 0 && ok;
    m->f = NULL;
    if (!ok && !m->failed)
        return fsdp_error_set(FSDP_STATUS_IO, "error writing metrics file '%s': %s", m->path,
                              errno ? strerror(errno) : "write error");
    return FSDP_STATUS_OK;
}
