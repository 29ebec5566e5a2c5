/*
 * args.c - long-option parsing for the fsdp subcommands.
 */
#include <errno.h>
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

void fsdp_args_help(const char *cmd, const char *synopsis, const fsdp_opt *opts, int n_opts)
{
    printf("usage: fsdp %s %s\n\n", cmd, synopsis);
    for (int i = 0; i < n_opts; i++) {
        char head[64];
        if (opts[i].type == FSDP_OPT_FLAG)
            snprintf(head, sizeof head, "--%s", opts[i].name);
        else
            snprintf(head, sizeof head, "--%s %s", opts[i].name, opts[i].metavar);
        printf("  %-30s %s\n", head, opts[i].help);
    }
    printf("  %-30s %s\n", "--help", "show this help");
}

static int set_value(const char *cmd, fsdp_opt *o, const char *v)
{
    char *end = NULL;
    errno = 0;
    switch (o->type) {
    case FSDP_OPT_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < -2147483647L || x > 2147483647L)
            goto bad;
        *(int *)o->dst = (int)x;
        return 0;
    }
    case FSDP_OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end || errno || *v == '-')
            goto bad;
        *(uint64_t *)o->dst = (uint64_t)x;
        return 0;
    }
    case FSDP_OPT_FLOAT: {
        float x = strtof(v, &end);
        if (end == v || *end || errno)
            goto bad;
        *(float *)o->dst = x;
        return 0;
    }
    case FSDP_OPT_SIZE:
        if (fsdp_parse_bytes(v, (size_t *)o->dst) != FSDP_STATUS_OK) {
            fprintf(stderr, "fsdp %s: --%s: %s\n", cmd, o->name, fsdp_error_msg());
            return 2;
        }
        return 0;
    case FSDP_OPT_STR:
        *(const char **)o->dst = v;
        return 0;
    case FSDP_OPT_FLAG:
        break;
    }
bad:
    fprintf(stderr, "fsdp %s: --%s: bad value '%s' (expected %s)\n", cmd, o->name, v, o->metavar);
    return 2;
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
                fprintf(stderr, "fsdp %s: --%s needs a value (%s)\n", cmd, name, o->metavar);
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
