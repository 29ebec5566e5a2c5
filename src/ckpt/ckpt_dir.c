/*
 * ckpt_dir.c - checkpoint directories: paths, finding the newest complete
 * checkpoint, the atomic begin/commit protocol and retention, the lock
 * that keeps one run per directory (all described in ckpt_dir.h), and run
 * ids.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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

    /* retention: only now that `step` is complete; the best one stays */
    uint64_t *steps, best = 0;
    int cnt;
    bool has_best = false;
    double best_loss;
    FSDP_TRY(fsdp_ckpt_best_read(dir, &best, &best_loss, &has_best));
    FSDP_TRY(list_complete(dir, &steps, &cnt));
    int kept = 0;
    bool removed = false;
    for (int i = cnt - 1; i >= 0; i--) {
        if (steps[i] == step || kept < keep - 1) {
            kept += steps[i] != step;
            continue;
        }
        if (has_best && steps[i] == best)
            continue; /* older than the K newest: kept besides them */
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

/* ---- the best checkpoint ------------------------------------------------------ */

static fsdp_status best_path(char *out, size_t n, const char *dir, const char *suffix)
{
    int k = snprintf(out, n, "%s/" FSDP_CKPT_BEST_NAME "%s", dir, suffix);
    if (k < 0 || (size_t)k >= n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "checkpoint path under '%s' is too long",
                              dir);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_ckpt_best_write(const char *dir, uint64_t step, double loss)
{
    char path[FSDP_CKPT_PATH_MAX], tmp[FSDP_CKPT_PATH_MAX], text[96];
    FSDP_TRY(best_path(path, sizeof path, dir, ""));
    FSDP_TRY(best_path(tmp, sizeof tmp, dir, ".tmp"));
    int n = snprintf(text, sizeof text, "step %" PRIu64 "\neval_loss %.9g\n", step, loss);
    FSDP_TRY(fsdp_write_file_sync(tmp, text, (size_t)n, "best-checkpoint file"));
    if (rename(tmp, path) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot rename '%s' to '%s': %s", tmp, path,
                              errstr());
    return fsdp_fsync_dir(dir);
}

fsdp_status fsdp_ckpt_best_read(const char *dir, uint64_t *step, double *loss, bool *found)
{
    char path[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(best_path(path, sizeof path, dir, ""));
    *found = false;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return FSDP_STATUS_OK;
    char *text = NULL;
    size_t n = 0;
    FSDP_TRY(fsdp_read_file(path, "best-checkpoint file", 256, &text, &n));
    int used = 0;
    bool ok = sscanf(text, "step %" SCNu64 "\neval_loss %lf\n%n", step, loss, &used) == 2 &&
              (size_t)used == n;
    free(text);
    if (!ok)
        return fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' is not a best-checkpoint file (\"step N\" "
                              "and \"eval_loss X\" lines); remove it or restore it", path);
    *found = true;
    return FSDP_STATUS_OK;
}

/* ---- one run per directory ------------------------------------------------------- */

/* Who holds the lock whose file is open as fd: "pid P on host H, since T"
 * from the text its holder wrote. The holder writes right after it takes
 * the lock, so an empty file is read again for a moment. */
static void lock_holder(int fd, char *out, size_t n)
{
    char text[512];
    ssize_t k = 0;
    for (int tries = 0; tries < 20; tries++) {
        k = pread(fd, text, sizeof text - 1, 0);
        if (k > 0)
            break;
        usleep(5000);
    }
    if (k <= 0) {
        snprintf(out, n, "which has not written its pid yet");
        return;
    }
    text[k] = '\0';
    int pid;
    char host[256], since[64];
    if (sscanf(text, "pid %d host %255s since %63s", &pid, host, since) == 3) {
        snprintf(out, n, "pid %d on host %s, since %s", pid, host, since);
        return;
    }
    for (char *c = text; *c; c++) /* someone else's text: printable only */
        if (*c < 0x20 || *c > 0x7e)
            *c = ' ';
    snprintf(out, n, "whose lock file says '%.200s'", text);
}

/* "pid P host H since T\n" into the lock file we hold. */
static fsdp_status lock_write_holder(int fd, const char *path)
{
    char host[256] = "unknown", since[64] = "unknown", text[512];
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "unknown");
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++) /* one word, so it reads back */
        if (*c <= 0x20 || *c > 0x7e)
            *c = '_';
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm))
        strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%S%z", &tm);
    int n = snprintf(text, sizeof text, "pid %ld host %s since %s\n", (long)getpid(), host, since);
    if (ftruncate(fd, 0) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot write lock file '%s': %s", path, errstr());
    return fsdp_pwrite_all(fd, text, (size_t)n, 0, "lock file", path);
}

fsdp_status fsdp_ckpt_dir_lock(fsdp_ckpt_lock *lk, const char *dir)
{
    memset(lk, 0, sizeof *lk);
    lk->fd = -1;
    FSDP_TRY(mkdir_p(dir));
    if (snprintf(lk->path, sizeof lk->path, "%s/%s", dir, FSDP_CKPT_LOCK_NAME) >=
        (int)sizeof lk->path)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--ckpt-dir '%s' is too long", dir);
    /* each pass: open, lock, and check the path still names the file
     * locked (a holder unlinks it as it releases); a few passes at most */
    for (int pass = 0; pass < 100; pass++) {
        /* O_NONBLOCK: a FIFO planted as LOCK cannot block the open */
        int fd = open(lk->path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
        if (fd < 0)
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "cannot create lock file '%s' in the checkpoint directory: %s%s",
                                  lk->path, errstr(),
                                  errno == ELOOP ? " (it is a symbolic link: remove it)" : "");
        struct stat locked, now;
        if (fstat(fd, &locked) != 0 || !S_ISREG(locked.st_mode)) {
            close(fd);
            return fsdp_error_set(FSDP_STATUS_IO,
                                  "lock file '%s' is not a regular file; remove it (fsdp creates "
                                  "it) and run again",
                                  lk->path);
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int err = errno;
            if (err == EINTR) {
                close(fd);
                continue;
            }
            fsdp_status st;
            if (err == EWOULDBLOCK) {
                char who[384];
                lock_holder(fd, who, sizeof who);
                st = fsdp_error_set(FSDP_STATUS_IO,
                                    "checkpoint directory '%s' is in use by another fsdp run "
                                    "(%s); wait for it to finish or choose another --ckpt-dir",
                                    dir, who);
            } else {
                st = fsdp_error_set(FSDP_STATUS_IO,
                                    "cannot lock '%s': %s (does this filesystem support file "
                                    "locks? choose a --ckpt-dir on a local disk)",
                                    lk->path, strerror(err));
            }
            close(fd);
            return st;
        }
        if (stat(lk->path, &now) != 0 || now.st_dev != locked.st_dev ||
            now.st_ino != locked.st_ino) {
            close(fd); /* released and removed meanwhile: start over */
            continue;
        }
        lk->fd = fd;
        lk->held = true;
        fsdp_status st = lock_write_holder(fd, lk->path);
        if (st != FSDP_STATUS_OK)
            fsdp_ckpt_dir_unlock(lk);
        return st;
    }
    return fsdp_error_set(FSDP_STATUS_IO,
                          "cannot lock '%s': it keeps being replaced by another process", lk->path);
}

void fsdp_ckpt_dir_unlock(fsdp_ckpt_lock *lk)
{
    if (!lk->held)
        return;
    /* unlink while still holding: see fsdp_ckpt_dir_lock. Should it fail,
     * the file stays behind, which is harmless: a lock file nobody holds
     * blocks nobody */
    (void)unlink(lk->path);
    close(lk->fd);
    lk->fd = -1;
    lk->held = false;
}

/* ---- run ids --------------------------------------------------------------------- */

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
