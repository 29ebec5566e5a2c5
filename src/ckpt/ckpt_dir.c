/*
 * ckpt_dir.c - checkpoint directories: paths, finding the newest complete
 * checkpoint, the atomic begin/commit protocol and retention (described in
 * ckpt_dir.h), and run ids.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_dir.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "core/rng.h"

static const char *errstr(void) { return strerror(errno); }

/* ---- directories ------------------------------------------------------------- */

fsdp_status fsdp_ckpt_step_path(char *out, size_t n, const char *dir, uint64_t step,
                                const char *suffix)
{
    int k = snprintf(out, n, "%s/step_%08" PRIu64 "%s", dir, step, suffix ? suffix : "");
    if (k < 0 || (size_t)k >= n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoint path under '%s' is too long",
                              dir);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_rank_path(char *out, size_t n, const char *ckpt, int rank)
{
    int k = snprintf(out, n, "%s/rank_%05d.bin", ckpt, rank);
    if (k < 0 || (size_t)k >= n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoint path under '%s' is too long",
                              ckpt);
    return FSDP_STATUS_OK;
}

bool fsdp_ckpt_is_complete(const char *ckpt)
{
    char p[FSDP_CKPT_PATH_MAX];
    struct stat sb;
    if (snprintf(p, sizeof p, "%s/DONE", ckpt) >= (int)sizeof p)
        return false;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* "step_<digits><suffix>" -> step; false for any other name. */
static bool parse_entry(const char *name, const char *suffix, uint64_t *step)
{
    if (strncmp(name, "step_", 5))
        return false;
    const char *d = name + 5, *e = d;
    while (*e >= '0' && *e <= '9')
        e++;
    if (e == d || e - d > 19 || strcmp(e, suffix))
        return false;
    char digits[24];
    memcpy(digits, d, (size_t)(e - d));
    digits[e - d] = '\0';
    errno = 0;
    unsigned long long v = strtoull(digits, NULL, 10);
    if (errno)
        return false; /* beyond 2^64 - 1 */
    *step = (uint64_t)v;
    return true;
}

/* Every complete checkpoint's step in dir, ascending (caller frees). */
static fsdp_status list_complete(const char *dir, uint64_t **steps, int *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return FSDP_STATUS_OK;
        return fsdp_error_set(FSDP_STATUS_IO, "cannot list checkpoint directory '%s': %s", dir,
                              errstr());
    }
    int cap = 0;
    struct dirent *de;
    fsdp_status st = FSDP_STATUS_OK;
    while ((de = readdir(d))) {
        uint64_t s;
        char p[FSDP_CKPT_PATH_MAX];
        if (!parse_entry(de->d_name, "", &s))
            continue;
        if (fsdp_ckpt_step_path(p, sizeof p, dir, s, "") != FSDP_STATUS_OK ||
            !fsdp_ckpt_is_complete(p))
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *q = realloc(*steps, (size_t)cap * sizeof *q);
            if (!q) {
                st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory listing '%s'", dir);
                break;
            }
            *steps = q;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (st != FSDP_STATUS_OK) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return st;
    }
    /* insertion sort: a handful of entries */
    for (int i = 1; i < *n; i++)
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
            uint64_t t = (*steps)[j];
            (*steps)[j] = (*steps)[j - 1];
            (*steps)[j - 1] = t;
        }
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_latest(const char *dir, uint64_t *step, bool *found)
{
    uint64_t *steps;
    int n;
    *found = false;
    FSDP_TRY(list_complete(dir, &steps, &n));
    if (n > 0) {
        *step = steps[n - 1];
        *found = true;
    }
    free(steps);
    return FSDP_STATUS_OK;
}

/* Remove a checkpoint directory we wrote: its files, then itself. Our
 * checkpoints hold only regular files; anything else makes this fail. */
static fsdp_status remove_ckpt_dir(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? FSDP_STATUS_OK
                               : fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s' to remove it: %s",
                                                path, errstr());
    struct dirent *de;
    fsdp_status st = FSDP_STATUS_OK;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        char p[FSDP_CKPT_PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", path, de->d_name) >= (int)sizeof p ||
            unlink(p) != 0) {
            st = fsdp_error_set(FSDP_STATUS_IO, "cannot remove '%s/%s': %s", path, de->d_name,
                                errstr());
            break;
        }
    }
    closedir(d);
    if (st == FSDP_STATUS_OK && rmdir(path) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot remove directory '%s': %s", path, errstr());
    return st;
}

static fsdp_status mkdir_p(const char *dir)
{
    char p[FSDP_CKPT_PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--ckpt-dir '%s' is too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return fsdp_error_set(FSDP_STATUS_IO, "cannot create checkpoint directory '%s': %s",
                                      p, errstr());
            *s = c;
            if (!c)
                break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return fsdp_error_set(FSDP_STATUS_IO, "--ckpt-dir '%s' is not a directory", dir);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_begin(const char *dir, uint64_t step)
{
    FSDP_TRY(mkdir_p(dir));
    /* leftovers of interrupted saves and deletions */
    DIR *d = opendir(dir);
    if (!d)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot list checkpoint directory '%s': %s", dir,
                              errstr());
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t s;
        if (!parse_entry(de->d_name, ".tmp", &s) && !parse_entry(de->d_name, ".old", &s))
            continue;
        char p[FSDP_CKPT_PATH_MAX];
        if (snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p)
            continue;
        if (remove_ckpt_dir(p) != FSDP_STATUS_OK)
            FSDP_WARN(FSDP_SUB_CKPT, "leaving an incomplete checkpoint behind: %s",
                      fsdp_error_msg());
    }
    closedir(d);
    char tmp[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(fsdp_ckpt_step_path(tmp, sizeof tmp, dir, step, ".tmp"));
    if (mkdir(tmp, 0755) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot create checkpoint directory '%s': %s", tmp,
                              errstr());
    return fsdp_fsync_dir(dir);
}

fsdp_status fsdp_ckpt_commit(const char *dir, uint64_t step, int keep)
{
    char tmp[FSDP_CKPT_PATH_MAX], fin[FSDP_CKPT_PATH_MAX], old[FSDP_CKPT_PATH_MAX];
    char done[FSDP_CKPT_PATH_MAX + 8];
    FSDP_TRY(fsdp_ckpt_step_path(tmp, sizeof tmp, dir, step, ".tmp"));
    FSDP_TRY(fsdp_ckpt_step_path(fin, sizeof fin, dir, step, ""));
    FSDP_TRY(fsdp_ckpt_step_path(old, sizeof old, dir, step, ".old"));
    snprintf(done, sizeof done, "%s/DONE", tmp);
    char text[96];
    int n = snprintf(text, sizeof text, "fsdp checkpoint step %" PRIu64 " complete\n", step);
    FSDP_TRY(fsdp_write_file_sync(done, text, (size_t)n, "checkpoint file"));
    FSDP_TRY(fsdp_fsync_dir(tmp));
    /* a complete checkpoint of the same step (a restarted run) is moved
     * aside first: rename() cannot replace a non-empty directory */
    struct stat sb;
    bool replaced = false;
    if (stat(fin, &sb) == 0) {
        if (rename(fin, old) != 0)
            return fsdp_error_set(FSDP_STATUS_IO, "cannot move the earlier '%s' aside: %s", fin,
                                  errstr());
        replaced = true;
    }
    if (rename(tmp, fin) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot rename '%s' to '%s': %s", tmp, fin,
                              errstr());
    FSDP_TRY(fsdp_fsync_dir(dir));
    if (replaced && remove_ckpt_dir(old) != FSDP_STATUS_OK)
        FSDP_WARN(FSDP_SUB_CKPT, "%s", fsdp_error_msg());
    if (keep <= 0)
        return FSDP_STATUS_OK;

    /* retention: only now that `step` is complete */
    uint64_t *steps;
    int cnt;
    FSDP_TRY(list_complete(dir, &steps, &cnt));
    int kept = 0;
    bool removed = false;
    for (int i = cnt - 1; i >= 0; i--) {
        if (steps[i] == step || kept < keep - 1) {
            kept += steps[i] != step;
            continue;
        }
        char p[FSDP_CKPT_PATH_MAX], q[FSDP_CKPT_PATH_MAX];
        if (fsdp_ckpt_step_path(p, sizeof p, dir, steps[i], "") != FSDP_STATUS_OK ||
            fsdp_ckpt_step_path(q, sizeof q, dir, steps[i], ".old") != FSDP_STATUS_OK)
            continue;
        /* rename first, so a crash mid-removal leaves no half checkpoint
         * under a complete-looking name */
        if (rename(p, q) != 0)
            FSDP_WARN(FSDP_SUB_CKPT, "cannot remove old checkpoint '%s': %s", p, errstr());
        else if (remove_ckpt_dir(q) != FSDP_STATUS_OK)
            FSDP_WARN(FSDP_SUB_CKPT, "%s", fsdp_error_msg());
        removed = true;
    }
    free(steps);
    return removed ? fsdp_fsync_dir(dir) : FSDP_STATUS_OK;
}

uint64_t fsdp_ckpt_new_run_id(void)
{
    static atomic_ullong counter;
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        v = fsdp_rng_mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                         ((uint64_t)getpid() << 16) ^ atomic_fetch_add(&counter, 1));
    }
    return v ? v : 1;
}
