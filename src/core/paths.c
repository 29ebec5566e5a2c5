/*
 * paths.c - the files a command's path arguments name, and whether an
 * output is one of its inputs or another output (paths.h).
 *
 * Every argument is expanded into the files it names (a glob through
 * glob(3), a tree by listing up to TREE_DEPTH levels), each with its
 * identity: device and inode when it exists, else its absolute path with
 * the directory resolved. The lists are small (a model directory holds a
 * few files, a checkpoint one per rank), and TREE_MAX_FILES bounds a huge
 * one, so the pairwise comparison costs nothing next to what the command
 * then reads.
 */
#include <dirent.h>
#include <glob.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/paths.h"

#define TREE_DEPTH 2          /* a checkpoint directory: DIR/step_N/rank_K.bin */
#define TREE_MAX_FILES 65536  /* per tree */

/* One file an argument names. */
typedef struct named {
    const fsdp_path_arg *arg;
    char *file;               /* as listed, for messages */
    bool exists, is_dir;
    dev_t dev;
    ino_t ino;
    char *canon;              /* !exists: the absolute path, directory resolved */
} named;

typedef struct list {
    named *v;
    int n, cap;
    bool oom;
} list;

/* The absolute path of a file that does not exist: its directory through
 * realpath, then its name; the path as given when the directory does not
 * exist either. */
static char *canonical(const char *path)
{
    char *d = strdup(path), *b = strdup(path), *out = NULL;
    if (d && b) {
        char *real = realpath(dirname(d), NULL);
        if (!real)
            out = strdup(path);
        else if (asprintf(&out, "%s/%s", strcmp(real, "/") ? real : "", basename(b)) < 0)
            out = NULL;
        free(real);
    }
    free(d);
    free(b);
    return out;
}

/* Add `file` (named by a); an input that does not exist is left out. */
static void add_file(list *l, const fsdp_path_arg *a, const char *file, bool input)
{
    struct stat sb;
    named e = {.arg = a};
    if (stat(file, &sb) == 0) {
        e.exists = true;
        e.is_dir = S_ISDIR(sb.st_mode);
        e.dev = sb.st_dev;
        e.ino = sb.st_ino;
    } else if (input) {
        return;
    } else if (!(e.canon = canonical(file))) {
        l->oom = true;
        return;
    }
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        named *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v) {
            free(e.canon);
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    if (!(e.file = strdup(file))) {
        free(e.canon);
        l->oom = true;
        return;
    }
    l->v[l->n++] = e;
}

/* dir itself, and its files down to `depth` more levels; *left bounds the
 * files listed. */
static void add_tree(list *l, const fsdp_path_arg *a, const char *dir, int depth, int *left)
{
    add_file(l, a, dir, true);
    DIR *dh = opendir(dir);
    if (!dh)
        return; /* not a directory, or unreadable: its reader says so */
    for (struct dirent *e; *left > 0 && !l->oom && (e = readdir(dh));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *p = NULL;
        if (asprintf(&p, "%s/%s", dir, e->d_name) < 0) {
            l->oom = true;
            break;
        }
        struct stat sb;
        (*left)--;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            if (depth > 0)
                add_tree(l, a, p, depth - 1, left);
        } else {
            add_file(l, a, p, true);
        }
        free(p);
    }
    closedir(dh);
}

static void expand(list *l, const fsdp_path_arg *a, bool input)
{
    if (!a->path)
        return;
    if (a->kind == FSDP_PATH_GLOB) {
        glob_t g;
        if (glob(a->path, 0, NULL, &g) == 0)
            for (size_t i = 0; i < g.gl_pathc; i++)
                add_file(l, a, g.gl_pathv[i], true); /* outputs that exist: what is replaced */
        globfree(&g);
    } else if (a->kind == FSDP_PATH_TREE) {
        int left = TREE_MAX_FILES;
        add_tree(l, a, a->path, TREE_DEPTH - 1, &left);
    } else {
        add_file(l, a, a->path, input);
    }
}

static bool same(const named *x, const named *y)
{
    if (x->exists && y->exists)
        return x->dev == y->dev && x->ino == y->ino;
    return !x->exists && !y->exists && !strcmp(x->canon, y->canon);
}

static void list_free(list *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->v[i].file);
        free(l->v[i].canon);
    }
    free(l->v);
}

/* The message for output o meeting x (an input when is_input). */
static fsdp_status clash(const named *o, const named *x, bool is_input)
{
    const fsdp_path_arg *oa = o->arg, *xa = x->arg;
    if (!is_input)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s '%s' and %s '%s' name the same file; give each output its own "
                              "path", xa->flag, xa->path, oa->flag, oa->path);
    if (!strcmp(x->file, xa->path))
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "%s '%s' is the %s that %s reads; writing it would destroy that "
                              "input: give %s another path", oa->flag, oa->path,
                              x->is_dir ? "directory" : "file", xa->flag, oa->flag);
    return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                          "%s '%s' is '%s', a file that %s '%s' reads; writing it would destroy "
                          "that input: give %s another path", oa->flag, oa->path, x->file,
                          xa->flag, xa->path, oa->flag);
}

fsdp_status fsdp_paths_check_disjoint(const fsdp_path_arg *in, int n_in, const fsdp_path_arg *out,
                                      int n_out)
{
    list ins = {0}, outs = {0};
    for (int i = 0; i < n_in; i++)
        expand(&ins, &in[i], true);
    for (int i = 0; i < n_out; i++)
        expand(&outs, &out[i], false);
    fsdp_status st = FSDP_STATUS_OK;
    if (ins.oom || outs.oom)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory listing the command's files");
    for (int i = 0; i < outs.n && st == FSDP_STATUS_OK; i++) {
        for (int k = 0; k < ins.n && st == FSDP_STATUS_OK; k++)
            if (same(&outs.v[i], &ins.v[k]))
                st = clash(&outs.v[i], &ins.v[k], true);
        for (int k = 0; k < i && st == FSDP_STATUS_OK; k++)
            if (outs.v[k].arg != outs.v[i].arg && same(&outs.v[i], &outs.v[k]))
                st = clash(&outs.v[i], &outs.v[k], false);
    }
    list_free(&ins);
    list_free(&outs);
    return st;
}

bool fsdp_paths_same_file(const char *a, const char *b)
{
    struct stat x, y;
    return a && b && stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev &&
           x.st_ino == y.st_ino;
}
