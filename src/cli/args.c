/*
 * args.c - long-option parsing and --help for the fsdp subcommands, and the
 * option-list builders.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "core/error.h"

int fsdp_args_find(const fsdp_opt *opts, int n_opts, const char *name)
{
    for (int i = 0; i < n_opts; i++)
        if (!strcmp(opts[i].name, name))
            return i;
    return -1;
}

/* The metavar of o: its own, or "a|b|c" from its name table. */
static const char *metavar(const fsdp_opt *o, char *buf, size_t n)
{
    if (o->type == FSDP_OPT_NAME && o->names)
        return fsdp_names_join(o->names, o->allow, "|", "|", buf, n);
    return o->metavar ? o->metavar : "";
}

static bool name_allowed(const fsdp_opt *o, int value)
{
    return !o->allow || (value >= 0 && value < 32 && (o->allow & FSDP_NAME_BIT(value)));
}

/* "--name METAVAR" of o into buf. */
static const char *help_head(const fsdp_opt *o, char *buf, size_t n)
{
    char meta[128];
    if (o->type == FSDP_OPT_FLAG)
        snprintf(buf, n, "--%s", o->name);
    else
        snprintf(buf, n, "--%s %s", o->name, metavar(o, meta, sizeof meta));
    return buf;
}

void fsdp_args_help(const char *cmd, const char *synopsis, const fsdp_opt *opts, int n_opts)
{
    enum { MIN_W = 24, MAX_W = 34 }; /* heads longer than MAX_W overflow their column */
    char head[160];
    int w = MIN_W;
    for (int i = 0; i < n_opts; i++) {
        int len = (int)strlen(help_head(&opts[i], head, sizeof head));
        if (len > w && len <= MAX_W)
            w = len;
    }
    printf("usage: fsdp %s %s\n\n", cmd, synopsis);
    for (int i = 0; i < n_opts; i++) {
        const fsdp_opt *o = &opts[i];
        printf("  %-*s  %s", w, help_head(o, head, sizeof head), o->help ? o->help : "");
        if (o->type != FSDP_OPT_NAME || !o->names) {
            printf("\n");
            continue;
        }
        const fsdp_name *def = fsdp_names_of(o->names, *(const int *)o->dst);
        if (def && name_allowed(o, def->value))
            printf(" (default %s)", def->name);
        printf("\n");
        int nw = 0;
        for (int k = 0; k < o->names->n; k++)
            if (name_allowed(o, o->names->v[k].value) && (int)strlen(o->names->v[k].name) > nw)
                nw = (int)strlen(o->names->v[k].name);
        for (int k = 0; k < o->names->n; k++) {
            const fsdp_name *e = &o->names->v[k];
            if (e->help && name_allowed(o, e->value))
                printf("  %-*s    %-*s  %s\n", w, "", nw, e->name, e->help);
        }
    }
    printf("  %-*s  %s\n", w, "--help", "show this help");
}

static int bad_value(const char *cmd, const fsdp_opt *o, const char *v, const char *why)
{
    char meta[128];
    fprintf(stderr, "fsdp %s: --%s: bad value '%s' (expected %s%s)\n", cmd, o->name, v,
            metavar(o, meta, sizeof meta), why);
    return 2;
}

static int set_value(const char *cmd, fsdp_opt *o, const char *v)
{
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case FSDP_OPT_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < INT_MIN || x > INT_MAX)
            return bad_value(cmd, o, v, ", an integer");
        if (o->hi > o->lo && (x < o->lo || x > o->hi)) {
            if (o->hi >= INT_MAX)
                fprintf(stderr, "fsdp %s: --%s: %ld is out of range (expected >= %ld)\n", cmd,
                        o->name, x, o->lo);
            else
                fprintf(stderr, "fsdp %s: --%s: %ld is out of range (expected %ld..%ld)\n", cmd,
                        o->name, x, o->lo, o->hi);
            return 2;
        }
        *(int *)o->dst = (int)x;
        return 0;
    }
    case FSDP_OPT_U64: {
        /* strtoull skips spaces and negates "-1" into 2^64 - 1: digits only */
        if (*v < '0' || *v > '9')
            return bad_value(cmd, o, v, ", an unsigned integer");
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end || errno)
            return bad_value(cmd, o, v, ", an unsigned integer below 2^64");
        *(uint64_t *)o->dst = (uint64_t)x;
        return 0;
    }
    case FSDP_OPT_FLOAT: {
        float x = strtof(v, &end);
        if (end == v || *end || errno || !isfinite(x))
            return bad_value(cmd, o, v, ", a finite number");
        if (o->fhi > o->flo && (x < o->flo || (o->flo_open && x == o->flo) || x > o->fhi)) {
            fprintf(stderr, "fsdp %s: --%s: %g is out of range (expected %s %g and <= %g)\n",
                    cmd, o->name, (double)x, o->flo_open ? ">" : ">=", o->flo, o->fhi);
            return 2;
        }
        *(float *)o->dst = x;
        return 0;
    }
    case FSDP_OPT_SIZE: {
        size_t x = 0;
        if (fsdp_parse_bytes(v, &x) != FSDP_STATUS_OK) {
            fprintf(stderr, "fsdp %s: --%s: %s\n", cmd, o->name, fsdp_error_msg());
            return 2;
        }
        if (x == 0) { /* a cap of 0 bytes fits nothing; "no cap" is leaving the option out */
            fprintf(stderr, "fsdp %s: --%s: '%s' is 0 bytes (expected at least 1 byte; leave "
                            "--%s out for none)\n", cmd, o->name, v, o->name);
            return 2;
        }
        *(size_t *)o->dst = x;
        return 0;
    }
    case FSDP_OPT_STR:
        *(const char **)o->dst = v;
        return 0;
    case FSDP_OPT_NAME:
        if (fsdp_names_parse(o->names, o->allow, v, (int *)o->dst) != FSDP_STATUS_OK) {
            fprintf(stderr, "fsdp %s: --%s: %s\n", cmd, o->name, fsdp_error_msg());
            return 2;
        }
        return 0;
    case FSDP_OPT_FLAG:
        break;
    }
    return bad_value(cmd, o, v, "");
}

int fsdp_args_parse(const char *cmd, const char *synopsis, fsdp_opt *opts, int n_opts, int argc,
                    char **argv, const char **pos, int max_pos, int *n_pos)
{
    if (n_pos)
        *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fsdp_args_help(cmd, synopsis, opts, n_opts);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (!n_pos || *n_pos >= max_pos) {
                fprintf(stderr, "fsdp %s: unexpected argument '%s' (see fsdp %s --help)\n", cmd, a,
                        cmd);
                return 2;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        char name[64];
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof name)
            len = sizeof name - 1;
        memcpy(name, a + 2, len);
        name[len] = '\0';
        int k = fsdp_args_find(opts, n_opts, name);
        if (k < 0) {
            fprintf(stderr, "fsdp %s: unknown option '--%s' (see fsdp %s --help)\n", cmd, name,
                    cmd);
            return 2;
        }
        fsdp_opt *o = &opts[k];
        o->seen = true;
        if (o->type == FSDP_OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "fsdp %s: --%s takes no value\n", cmd, name);
                return 2;
            }
            *(bool *)o->dst = true;
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc) {
                char meta[128];
                fprintf(stderr, "fsdp %s: --%s needs a value (%s)\n", cmd, name,
                        metavar(o, meta, sizeof meta));
                return 2;
            }
            v = argv[++i];
        }
        int rc = set_value(cmd, o, v);
        if (rc)
            return rc;
    }
    return FSDP_ARGS_OK;
}

/* ---- building an option list ------------------------------------------------ */

fsdp_opt *fsdp_opt_add(fsdp_opt_list *l, const char *name, fsdp_opt_type type, void *dst,
                       const char *metavar, const char *help)
{
    FSDP_ASSERT(l->n < FSDP_OPT_LIST_MAX && fsdp_args_find(l->v, l->n, name) < 0);
    fsdp_opt *o = &l->v[l->n++];
    *o = (fsdp_opt){.name = name, .type = type, .dst = dst, .metavar = metavar, .help = help};
    return o;
}

fsdp_opt *fsdp_opt_add_int(fsdp_opt_list *l, const char *name, int *dst, long lo, long hi,
                           const char *metavar, const char *help)
{
    fsdp_opt *o = fsdp_opt_add(l, name, FSDP_OPT_INT, dst, metavar, help);
    o->lo = lo;
    o->hi = hi;
    return o;
}

fsdp_opt *fsdp_opt_add_float(fsdp_opt_list *l, const char *name, float *dst, double lo,
                             bool lo_open, double hi, const char *metavar, const char *help)
{
    fsdp_opt *o = fsdp_opt_add(l, name, FSDP_OPT_FLOAT, dst, metavar, help);
    o->flo = lo;
    o->flo_open = lo_open;
    o->fhi = hi;
    return o;
}

fsdp_opt *fsdp_opt_add_name(fsdp_opt_list *l, const char *name, int *dst,
                            const fsdp_name_table *t, const char *help)
{
    fsdp_opt *o = fsdp_opt_add(l, name, FSDP_OPT_NAME, dst, NULL, help);
    o->names = t;
    return o;
}

void fsdp_opt_remove(fsdp_opt_list *l, const char *name)
{
    int k = fsdp_args_find(l->v, l->n, name);
    if (k < 0)
        return;
    memmove(&l->v[k], &l->v[k + 1], (size_t)(l->n - k - 1) * sizeof l->v[0]);
    l->n--;
}

fsdp_opt *fsdp_opt_get(fsdp_opt_list *l, const char *name)
{
    int k = fsdp_args_find(l->v, l->n, name);
    return k < 0 ? NULL : &l->v[k];
}
