/*
 * plot_read.c - the metrics file `fsdp plot` draws (plot.h): JSON Lines
 * into one array per series, one entry per line (metrics files are one
 * line per step: small, and bounded by plot.h's limits). Values that are
 * missing, null or non-finite leave NaN; a line where a run resumed is
 * flagged.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "core/json.h"
#include "report/plot.h"

/* ---- reading ------------------------------------------------------------------ */

/* The optional number-or-null keys of a line, and their arrays in that order. */
static const char *const optional_keys[] = {"tokens_per_s", "lr", "grad_norm", "eval_loss"};
enum { N_OPTIONAL = sizeof optional_keys / sizeof optional_keys[0] };

static void optional_arrays(fsdp_metrics *m, double **out[N_OPTIONAL])
{
    out[0] = &m->tokens_per_s;
    out[1] = &m->lr;
    out[2] = &m->grad_norm;
    out[3] = &m->eval_loss;
}

/* The arrays being filled and their capacities. */
struct metrics_fill {
    fsdp_metrics *m;
    const char *path;
    size_t cap_lines, cap_peak;
};

static fsdp_status out_of_memory(const struct metrics_fill *mf)
{
    return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading metrics file '%s'",
                          mf->path);
}

/* *p resized to cap doubles (contents kept); false, *p untouched, if the
 * memory is not there. */
static bool grow_doubles(double **p, size_t cap)
{
    double *q = realloc(*p, cap * sizeof *q);
    if (!q)
        return false;
    *p = q;
    return true;
}

/* Room for one more line in every per-line array (peak_first holds one
 * more entry than there are lines). A failed realloc leaves the arrays
 * already grown larger than cap_lines, which is harmless. */
static fsdp_status reserve_line(struct metrics_fill *mf)
{
    fsdp_metrics *m = mf->m;
    if ((size_t)m->n_steps + 2 <= mf->cap_lines)
        return FSDP_STATUS_OK;
    size_t cap = mf->cap_lines ? mf->cap_lines * 2 : 256;
    double **arrays[2 + N_OPTIONAL] = {&m->step, &m->loss};
    optional_arrays(m, arrays + 2);
    for (int k = 0; k < 2 + N_OPTIONAL; k++)
        if (!grow_doubles(arrays[k], cap))
            return out_of_memory(mf);
    int *first = realloc(m->peak_first, cap * sizeof *first);
    if (!first)
        return out_of_memory(mf);
    m->peak_first = first;
    bool *resumed = realloc(m->resumed, cap * sizeof *resumed);
    if (!resumed)
        return out_of_memory(mf);
    m->resumed = resumed;
    mf->cap_lines = cap;
    return FSDP_STATUS_OK;
}

static fsdp_status reserve_peaks(struct metrics_fill *mf, size_t more)
{
    fsdp_metrics *m = mf->m;
    size_t need = (size_t)m->peak_first[m->n_steps] + more;
    if (need <= mf->cap_peak)
        return FSDP_STATUS_OK;
    size_t cap = mf->cap_peak ? mf->cap_peak : 1024;
    while (cap < need)
        cap *= 2;
    if (!grow_doubles(&m->peak, cap))
        return out_of_memory(mf);
    mf->cap_peak = cap;
    return FSDP_STATUS_OK;
}

/* "a number", "an array": the type of v with its article ("nothing" for NULL). */
static const char *a_type(const fsdp_json *v)
{
    static const char *const names[] = {"a null",   "a boolean", "a number",
                                        "a string", "an array",  "an object"};
    if (v && v->type == FSDP_JSON_NUMBER && !isfinite(v->number))
        return "a non-finite number"; /* 1e999 */
    return v && (unsigned)v->type < sizeof names / sizeof names[0] ? names[v->type] : "nothing";
}

static fsdp_status field_error(const struct metrics_fill *mf, int line_no, const char *key,
                               const char *expected, const fsdp_json *v)
{
    return fsdp_error_set(FSDP_STATUS_FORMAT,
                          "metrics file '%s' line %d: \"%s\" must be %s, found %s; is it a "
                          "metrics file written by fsdp train --log?",
                          mf->path, line_no, key, expected, a_type(v));
}

/* obj[key] as a double: NaN when null, non-finite or (if optional) absent.
 * False when the member has another type, or is absent and required. */
static bool number_or_null(const fsdp_json *obj, const char *key, bool required, double *out)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    *out = NAN;
    if (!v)
        return !required;
    if (v->type == FSDP_JSON_NUMBER && isfinite(v->number))
        *out = v->number;
    return v->type == FSDP_JSON_NUMBER || v->type == FSDP_JSON_NULL;
}

static bool has_bytes(const char *s, size_t n, const char *word)
{
    return memmem(s, n, word, strlen(word)) != NULL;
}

static fsdp_status not_json(const struct metrics_fill *mf, fsdp_status st, int line_no,
                            const char *line, size_t len)
{
    char inner[FSDP_ERROR_MSG_MAX];
    const char *m = fsdp_error_msg();
    bool one = !strncmp(m, "line 1, ", 8); /* the parser saw one line: say only the column */
    snprintf(inner, sizeof inner, "%s", one ? m + 8 : m);
    bool bare = has_bytes(line, len, "nan") || has_bytes(line, len, "inf") ||
                has_bytes(line, len, "NaN") || has_bytes(line, len, "Inf");
    return fsdp_error_set(st, "metrics file '%s' line %d%s%s%s", mf->path, line_no,
                          one ? ", " : ": ", inner,
                          bare ? " (a non-finite value written as a bare nan/inf, which JSON "
                                 "does not allow: did the run diverge?)"
                               : "");
}

/* Append one metrics line's object to the arrays. */
static fsdp_status add_line(struct metrics_fill *mf, int line_no, const fsdp_json *obj)
{
    fsdp_metrics *m = mf->m;
    if (obj->type != FSDP_JSON_OBJECT)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "metrics file '%s' line %d: expected a JSON object, found %s; "
                              "is it a metrics file written by fsdp train --log?",
                              mf->path, line_no, a_type(obj));
    double step, loss, opt[N_OPTIONAL];
    const fsdp_json *js = fsdp_json_get(obj, "step");
    if (!js || js->type != FSDP_JSON_NUMBER || !isfinite(js->number))
        return field_error(mf, line_no, "step", "a finite number", js);
    step = js->number;
    if (!number_or_null(obj, "loss", true, &loss))
        return field_error(mf, line_no, "loss", "a number or null", fsdp_json_get(obj, "loss"));
    for (int k = 0; k < N_OPTIONAL; k++)
        if (!number_or_null(obj, optional_keys[k], false, &opt[k]))
            return field_error(mf, line_no, optional_keys[k], "a number or null",
                               fsdp_json_get(obj, optional_keys[k]));
    const fsdp_json *jr = fsdp_json_get(obj, "resumed_from");
    if (jr && jr->type != FSDP_JSON_NUMBER)
        return field_error(mf, line_no, "resumed_from", "a number", jr);
    const fsdp_json *jp = fsdp_json_get(obj, "peak_bytes");
    if (jp && jp->type != FSDP_JSON_ARRAY)
        return field_error(mf, line_no, "peak_bytes", "an array", jp);
    if (jp && jp->n > FSDP_PLOT_MAX_DEVICES)
        return fsdp_error_set(FSDP_STATUS_FORMAT,
                              "metrics file '%s' line %d: \"peak_bytes\" lists %zu devices, more "
                              "than fsdp runs (%d)",
                              mf->path, line_no, jp->n, FSDP_PLOT_MAX_DEVICES);

    FSDP_TRY(reserve_line(mf));
    int i = m->n_steps;
    if (jp)
        FSDP_TRY(reserve_peaks(mf, jp->n));
    int k = m->peak_first[i];
    for (const fsdp_json *e = jp ? jp->child : NULL; e; e = e->next, k++) {
        if (e->type != FSDP_JSON_NUMBER && e->type != FSDP_JSON_NULL)
            return fsdp_error_set(FSDP_STATUS_FORMAT,
                                  "metrics file '%s' line %d: \"peak_bytes\" element %d is "
                                  "%s; expected a number or null",
                                  mf->path, line_no, k - m->peak_first[i], a_type(e));
        m->peak[k] = e->type == FSDP_JSON_NUMBER && isfinite(e->number) ? e->number : NAN;
    }
    if (k - m->peak_first[i] > m->n_devices)
        m->n_devices = k - m->peak_first[i];
    m->step[i] = step;
    m->loss[i] = loss;
    double **arrays[N_OPTIONAL];
    optional_arrays(m, arrays);
    for (int o = 0; o < N_OPTIONAL; o++)
        (*arrays[o])[i] = opt[o];
    /* a run resumed here: it says so, or its steps start again below the last one */
    m->resumed[i] = jr || (i > 0 && step <= m->step[i - 1]);
    m->n_resumes += m->resumed[i];
    m->peak_first[i + 1] = k;
    m->n_steps = i + 1;
    return FSDP_STATUS_OK;
}

static bool blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

fsdp_status fsdp_metrics_read(const char *path, fsdp_metrics *m)
{
    memset(m, 0, sizeof *m);
    struct metrics_fill mf = {.m = m, .path = path};
    fsdp_line_reader lr;
    fsdp_status st = FSDP_STATUS_OK;
    FSDP_CHECK(fsdp_line_reader_open(&lr, path, "metrics file", FSDP_PLOT_MAX_LINE_BYTES,
                                     FSDP_PLOT_MAX_FILE_BYTES));
    FSDP_CHECK(reserve_line(&mf));
    m->peak_first[0] = 0;
    for (;;) {
        const char *line;
        size_t len;
        bool terminated;
        FSDP_CHECK(fsdp_line_reader_next(&lr, &line, &len, &terminated));
        if (!line)
            break;
        if (blank(line, len))
            continue;
        fsdp_json *obj = NULL;
        st = fsdp_json_parse(line, len, &obj);
        if (st == FSDP_STATUS_FORMAT && !terminated) {
            /* an incomplete last line: the run is still writing, or was cut */
            m->skipped_last_line = true;
            st = FSDP_STATUS_OK;
            break;
        }
        if (st != FSDP_STATUS_OK) {
            if (st == FSDP_STATUS_FORMAT)
                st = not_json(&mf, st, lr.line_no, line, len);
            goto fail;
        }
        st = add_line(&mf, lr.line_no, obj);
        fsdp_json_free(obj);
        if (st != FSDP_STATUS_OK)
            goto fail;
    }
    if (m->n_steps == 0) {
        st = fsdp_error_set(FSDP_STATUS_FORMAT,
                            "metrics file '%s' holds no %smetrics lines (write one with fsdp "
                            "train --log FILE.jsonl)",
                            path, m->skipped_last_line ? "complete " : "");
        goto fail;
    }
    fsdp_line_reader_close(&lr);
    return FSDP_STATUS_OK;
fail:
    fsdp_line_reader_close(&lr);
    fsdp_metrics_free(m);
    return st;
}

void fsdp_metrics_free(fsdp_metrics *m)
{
    free(m->step);
    free(m->loss);
    free(m->tokens_per_s);
    free(m->lr);
    free(m->grad_norm);
    free(m->eval_loss);
    free(m->resumed);
    free(m->peak_first);
    free(m->peak);
    memset(m, 0, sizeof *m);
}

