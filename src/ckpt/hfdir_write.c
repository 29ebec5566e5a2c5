/*
 * hfdir_write.c - writing a Hugging Face model directory (hfdir.h) that
 * transformers' AutoModelForCausalLM.from_pretrained loads.
 *
 * Layout, as transformers' save_pretrained and the reference safetensors
 * writer make it, so that a directory read and written back comes out byte
 * for byte the same: tensors are assigned to files in model order, a new
 * file starting when the next tensor would pass shard_bytes (a tensor
 * larger than that gets a file of its own); inside a file they are sorted
 * by name, with {"format": "pt"} as metadata; the index is JSON indented by
 * two spaces with sorted keys. Names are the family's mapping's, with its
 * hf_prefix.
 *
 * Atomicity: everything is written into "<path>.tmp.<pid>" next to path,
 * fsynced, and renamed to path at the end; path must not exist or be an
 * empty directory (never a file, which is never replaced). On failure the
 * temporary directory and what was written into it are removed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/hfdir.h"
#include "ckpt/safetensors.h"
#include "core/fileio.h"
#include "core/log.h"

#define COPY_CHUNK ((size_t)1 << 20)

/* Is the directory empty (nothing but . and ..)? */
static bool dir_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool empty = true;
    for (struct dirent *e; empty && (e = readdir(d));)
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* Remove the temporary directory and the plain files fsdp put in it. */
static void remove_tmp(const char *tmp)
{
    DIR *d = opendir(tmp);
    if (d) {
        char p[FSDP_CKPT_PATH_MAX + 300];
        for (struct dirent *e; (e = readdir(d));)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
                snprintf(p, sizeof p, "%s/%s", tmp, e->d_name) < (int)sizeof p)
                unlink(p);
        closedir(d);
    }
    rmdir(tmp);
}

/* Copy the regular file src to dst (created, fsynced). */
static fsdp_status copy_file(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (in < 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot open '%s': %s", src, strerror(errno));
    struct stat sb;
    if (fstat(in, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(in);
        return fsdp_error_set(FSDP_STATUS_IO, "'%s' is not a regular file", src);
    }
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    char *buf = malloc(COPY_CHUNK);
    fsdp_status st = FSDP_STATUS_OK;
    if (out < 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot create '%s': %s", dst, strerror(errno));
    else if (!buf)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory copying '%s'", src);
    for (uint64_t off = 0; st == FSDP_STATUS_OK && off < (uint64_t)sb.st_size;) {
        size_t k = (uint64_t)sb.st_size - off < COPY_CHUNK ? (size_t)((uint64_t)sb.st_size - off)
                                                           : COPY_CHUNK;
        st = fsdp_pread_all(in, buf, k, off, "file", src);
        if (st == FSDP_STATUS_OK)
            st = fsdp_pwrite_all(out, buf, k, off, "file", dst);
        off += k;
    }
    if (st == FSDP_STATUS_OK && fsync(out) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot fsync '%s': %s", dst, strerror(errno));
    if (out >= 0 && close(out) != 0 && st == FSDP_STATUS_OK)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot close '%s': %s", dst, strerror(errno));
    close(in);
    free(buf);
    return st;
}

static void note_copied(const fsdp_modelfile_write_opts *o, const char *name)
{
    if (!o->copied || !o->copied_size)
        return;
    size_t k = strlen(o->copied);
    snprintf(o->copied + k, o->copied_size - k, "%s%s", k ? ", " : "", name);
}

#define GENERATION "generation_config.json"

/* "generation_config.json (written)", or bare when copied as it was. */
static void note_generation(const fsdp_modelfile_write_opts *o, const char *what)
{
    char name[96];
    snprintf(name, sizeof name, GENERATION "%s%s%s", strcmp(what, "copied") ? " (" : "",
             strcmp(what, "copied") ? what : "", strcmp(what, "copied") ? ")" : "");
    note_copied(o, name);
}

/* The companions present in o->companions (generation_config.json as
 * o->generation says: hfdir.h), then o->tokenizer, then a
 * generation_config.json from o->generation when there was none. */
static fsdp_status copy_companions(const char *tmp, const fsdp_modelfile_write_opts *o)
{
    char src[FSDP_CKPT_PATH_MAX + 64], dst[FSDP_CKPT_PATH_MAX + 64];
    struct stat sb;
    for (int i = 0; o->companions && fsdp_hfdir_companions[i]; i++) {
        const char *name = fsdp_hfdir_companions[i];
        if (o->tokenizer && !strcmp(name, "tokenizer.json"))
            continue;
        if (snprintf(src, sizeof src, "%s/%s", o->companions, name) >= (int)sizeof src ||
            stat(src, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        snprintf(dst, sizeof dst, "%s/%s", tmp, name);
        if (o->generation && !strcmp(name, GENERATION)) {
            const char *what;
            FSDP_TRY(fsdp_hfdir_write_generation(tmp, src, o->generation, &what));
            note_generation(o, what);
            continue;
        }
        FSDP_TRY(copy_file(src, dst));
        note_copied(o, name);
    }
    if (o->tokenizer) {
        snprintf(dst, sizeof dst, "%s/tokenizer.json", tmp);
        FSDP_TRY(copy_file(o->tokenizer, dst));
        note_copied(o, "tokenizer.json");
    }
    snprintf(dst, sizeof dst, "%s/" GENERATION, tmp);
    if (o->generation && stat(dst, &sb) != 0) {
        const char *what;
        FSDP_TRY(fsdp_hfdir_write_generation(tmp, NULL, o->generation, &what));
        note_generation(o, what);
    }
    return FSDP_STATUS_OK;
}

static int cmp_out(const void *a, const void *b)
{
    return strcmp(((const fsdp_st_out *)a)->name, ((const fsdp_st_out *)b)->name);
}

void fsdp_hfdir_shard_name(char *buf, size_t n, int k, int n_shards)
{
    if (n_shards == 1)
        snprintf(buf, n, FSDP_HF_WEIGHTS);
    else
        snprintf(buf, n, "model-%05d-of-%05d.safetensors", k + 1, n_shards);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const fsdp_hfdir_entry *)a)->name, ((const fsdp_hfdir_entry *)b)->name);
}

fsdp_status fsdp_hfdir_write_index(const char *tmp, fsdp_hfdir_entry *e, int n, int n_shards,
                                   uint64_t params, uint64_t total_bytes)
{
    qsort(e, (size_t)n, sizeof *e, cmp_entry);
    fsdp_sbuf b = {0};
    fsdp_sbuf_printf(&b, "{\n  \"metadata\": {\n    \"total_parameters\": %" PRIu64 ",\n"
                     "    \"total_size\": %" PRIu64 "\n  },\n  \"weight_map\": {\n", params,
                     total_bytes);
    char file[64];
    for (int k = 0; k < n; k++) {
        fsdp_hfdir_shard_name(file, sizeof file, e[k].shard, n_shards);
        fsdp_sbuf_printf(&b, "    \"%s\": \"%s\"%s\n", e[k].name, file, k + 1 < n ? "," : "");
    }
    fsdp_sbuf_printf(&b, "  }\n}\n");
    char p[FSDP_CKPT_PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/" FSDP_HF_INDEX, tmp);
    fsdp_status st = b.oom ? fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the index")
                           : fsdp_write_file_sync(p, b.p, b.n, "index");
    free(b.p);
    return st;
}

/* The index of the float tensors out[0..n) (out[k] in file shard_of[k]). */
static fsdp_status write_index(const char *tmp, const fsdp_model *m, const fsdp_st_out *out,
                               const int *shard_of, int n, int n_shards, uint64_t total_bytes)
{
    fsdp_hfdir_entry *e = malloc((size_t)n * sizeof *e);
    if (!e)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for the index");
    uint64_t params = 0;
    for (int k = 0; k < n; k++) {
        e[k] = (fsdp_hfdir_entry){out[k].name, shard_of[k]};
        fsdp_weight_tensor t;
        m->family->safetensors->tensor(m, out[k].unit, out[k].param, &t);
        params += t.stored_numel;
    }
    fsdp_status st = fsdp_hfdir_write_index(tmp, e, n, n_shards, params, total_bytes);
    free(e);
    return st;
}

/* config.json and the weights into tmp. */
static fsdp_status write_model(const char *tmp, const fsdp_model *m, const float *const *units,
                               const fsdp_modelfile_write_opts *o, int *n_files)
{
    const fsdp_safetensors_mapping *map = m->family->safetensors;
    uint64_t limit = o->shard_bytes ? o->shard_bytes : FSDP_MODELFILE_SHARD_BYTES_DEFAULT;
    char p[FSDP_CKPT_PATH_MAX + 64];
    fsdp_sbuf cfg = {0};
    fsdp_status st = map->hf_config_write(m, o->dtype == FSDP_DTYPE_F32 ? "float32" : "bfloat16",
                                          &cfg);
    snprintf(p, sizeof p, "%s/" FSDP_HF_CONFIG, tmp);
    if (st == FSDP_STATUS_OK)
        st = cfg.oom ? fsdp_error_set(FSDP_STATUS_OOM, "out of host memory")
                     : fsdp_write_file_sync(p, cfg.p, cfg.n, "model config");
    free(cfg.p);
    FSDP_TRY(st);

    int n = 0;
    for (int u = 0; u < m->n_units; u++)
        n += m->units[u].n_params;
    fsdp_st_out *out = calloc((size_t)n + 1, sizeof *out), *part = calloc((size_t)n + 1,
                                                                           sizeof *part);
    int *shard_of = calloc((size_t)n + 1, sizeof *shard_of);
    if (!out || !part || !shard_of) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory");
        goto done;
    }
    /* files in model order, each at most `limit` bytes unless one tensor is larger */
    uint64_t used = 0, total = 0;
    int k = 0, shard = 0;
    for (int u = 0; u < m->n_units; u++)
        for (int i = 0; i < m->units[u].n_params; i++, k++) {
            fsdp_weight_tensor t;
            map->tensor(m, u, i, &t);
            out[k] = (fsdp_st_out){.unit = u, .param = i};
            snprintf(out[k].name, sizeof out[k].name, "%s%s", map->hf_prefix ? map->hf_prefix : "",
                     t.name);
            uint64_t bytes = fsdp_st_out_bytes(m, &out[k], o->dtype);
            if (used > 0 && used + bytes > limit) {
                shard++;
                used = 0;
            }
            shard_of[k] = shard;
            used += bytes;
            total += bytes;
        }
    int n_shards = shard + 1;
    char key[1][64] = {"format"}, val[1][64] = {"pt"};
    for (int s = 0; s < n_shards && st == FSDP_STATUS_OK; s++) {
        int c = 0;
        for (k = 0; k < n; k++)
            if (shard_of[k] == s)
                part[c++] = out[k];
        qsort(part, (size_t)c, sizeof *part, cmp_out);
        char name[64];
        fsdp_hfdir_shard_name(name, sizeof name, s, n_shards);
        snprintf(p, sizeof p, "%s/%s", tmp, name);
        st = fsdp_st_write_tensors(p, m, units, o->dtype, part, c, key, val, 1);
    }
    if (st == FSDP_STATUS_OK && n_shards > 1)
        st = write_index(tmp, m, out, shard_of, n, n_shards, total);
    *n_files = n_shards;
done:
    free(shard_of);
    free(part);
    free(out);
    return st;
}

fsdp_status fsdp_dir_write_begin(const char *path, const char *what, char *tmp, size_t n)
{
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return fsdp_error_set(FSDP_STATUS_IO, "'%s' exists and is not a directory; fsdp "
                                  "never replaces it: choose another output", path);
        if (!dir_empty(path))
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "'%s' exists and is not empty; write "
                                  "the %s to a new path", path, what);
    } else if (errno != ENOENT) {
        return fsdp_error_set(FSDP_STATUS_IO, "cannot use '%s': %s", path, strerror(errno));
    }
    if (snprintf(tmp, n, "%s.tmp.%d", path, (int)getpid()) >= (int)n)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "path '%.64s...' is too long", path);
    if (mkdir(tmp, 0755) != 0)
        return fsdp_error_set(FSDP_STATUS_IO, "cannot create '%s': %s%s", tmp, strerror(errno),
                              errno == EEXIST ? " (left by an interrupted write? remove it)"
                                              : "");
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_dir_write_end(const char *path, const char *tmp, fsdp_status st)
{
    char parent[FSDP_CKPT_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", path);
    const char *dir = dirname(parent);
    if (st == FSDP_STATUS_OK)
        st = fsdp_fsync_dir(tmp);
    if (st == FSDP_STATUS_OK && rename(tmp, path) != 0)
        st = fsdp_error_set(FSDP_STATUS_IO, "cannot rename '%s' to '%s': %s", tmp, path,
                            strerror(errno));
    if (st != FSDP_STATUS_OK) {
        remove_tmp(tmp);
        return st;
    }
    return fsdp_fsync_dir(dir);
}

fsdp_status fsdp_hfdir_write_as(const char *path, const fsdp_model *m,
                                const float *const *units, const fsdp_modelfile_write_opts *o,
                                fsdp_hfdir_model_writer write_weights)
{
    const fsdp_safetensors_mapping *map = m->family->safetensors;
    if (!map || !map->hf_config_write)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "%s models have no Hugging Face "
                              "config.json mapping; write '%s' as .safetensors or a checkpoint",
                              m->family->title, path);
    if (o->dtype != FSDP_DTYPE_F32 && o->dtype != FSDP_DTYPE_BF16)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "Hugging Face directories are written in "
                              "fp32 or bf16, not %s", fsdp_dtype_name(o->dtype));
    char tmp[FSDP_CKPT_PATH_MAX];
    FSDP_TRY(fsdp_dir_write_begin(path, "Hugging Face directory", tmp, sizeof tmp));
    int n_files = 0;
    fsdp_status st = (write_weights ? write_weights : write_model)(tmp, m, units, o, &n_files);
    if (st == FSDP_STATUS_OK)
        st = copy_companions(tmp, o);
    FSDP_TRY(fsdp_dir_write_end(path, tmp, st));
    FSDP_INFO(FSDP_SUB_CKPT, "wrote Hugging Face directory '%s' (%s, %d safetensors file(s), "
              "model '%s')", path, fsdp_dtype_name(o->dtype), n_files, m->name);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_hfdir_write(const char *path, const fsdp_model *m, const float *const *units,
                             const fsdp_modelfile_write_opts *o)
{
    return fsdp_hfdir_write_as(path, m, units, o, NULL);
}
