/*
 * ckpt_base.c - hashing the base of a checkpoint's frozen parameters
 * (ckpt_base.h). Reading two MiB per file keeps it fast on a 140 GB base;
 * sizes, the safetensors headers at the start and the tensor bytes at the
 * end tell bases apart in practice (not against an adversary).
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "ckpt/ckpt_base.h"

#define BASE_SPAN ((size_t)1 << 20)

/* Fold `path`'s name, size, first and last BASE_SPAN bytes into st. */
static fsdp_status hash_file(XXH64_state_t *st, const char *path, const char *name)
{
    FILE *f = fopen(path, "rb");
    struct stat sb;
    if (!f || fstat(fileno(f), &sb) != 0) {
        if (f)
            fclose(f);
        return fsdp_error_set(FSDP_STATUS_IO, "cannot read base model file '%s'", path);
    }
    char *buf = malloc(BASE_SPAN);
    if (!buf) {
        fclose(f);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory hashing '%s'", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    XXH64_update(st, name, strlen(name) + 1);
    XXH64_update(st, &size, sizeof size);
    size_t n = fread(buf, 1, BASE_SPAN, f);
    XXH64_update(st, buf, n);
    if (size > BASE_SPAN && fseeko(f, (off_t)(size - BASE_SPAN), SEEK_SET) == 0) {
        n = fread(buf, 1, BASE_SPAN, f);
        XXH64_update(st, buf, n);
    }
    free(buf);
    bool err = ferror(f);
    fclose(f);
    return err ? fsdp_error_set(FSDP_STATUS_IO, "error reading base model file '%s'", path)
               : FSDP_STATUS_OK;
}

static bool weight_or_config(const char *name)
{
    size_t n = strlen(name);
    static const char *const ends[] = {".safetensors", ".bin", ".json"};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++) {
        size_t k = strlen(ends[i]);
        if (n > k && !strcmp(name + n - k, ends[i]))
            return true;
    }
    return false;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

fsdp_status fsdp_ckpt_base_hash(const char *model, const char *config, uint64_t seed,
                                uint64_t *out)
{
    XXH64_state_t *st = XXH64_createState();
    if (!st)
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory hashing the base model");
    XXH64_reset(st, 0);
    XXH64_update(st, config, strlen(config) + 1);
    struct stat sb;
    fsdp_status s = FSDP_STATUS_OK;
    if (model && stat(model, &sb) == 0 && S_ISREG(sb.st_mode)) {
        s = hash_file(st, model, "");
    } else if (model && stat(model, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        struct dirent **list = NULL;
        int n = scandir(model, &list, NULL, by_name);
        if (n < 0)
            s = fsdp_error_set(FSDP_STATUS_IO, "cannot list base model directory '%s'", model);
        for (int i = 0; i < n; i++) {
            if (s == FSDP_STATUS_OK && weight_or_config(list[i]->d_name)) {
                char path[4096];
                snprintf(path, sizeof path, "%s/%s", model, list[i]->d_name);
                if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode))
                    s = hash_file(st, path, list[i]->d_name);
            }
            free(list[i]);
        }
        free(list);
    } else {
        XXH64_update(st, &seed, sizeof seed); /* a shape or spec: the seed draws it */
    }
    *out = XXH64_digest(st);
    XXH64_freeState(st);
    return s;
}
