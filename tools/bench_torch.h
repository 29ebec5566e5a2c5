/*
 * bench_torch.h - what the benchmarks that compare with PyTorch share:
 * finding their Python script and the interpreter that has torch.
 * Header-only: each tool is one .c file linked against build/libfsdp.a.
 */
#ifndef FSDP_TOOLS_BENCH_TORCH_H
#define FSDP_TOOLS_BENCH_TORCH_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Path of tools/NAME: relative to the repository root when run from there,
 * else found from this executable's path (BUILD/tools/bench_x -> tools/).
 * Returns false if neither exists. */
static inline bool bench_torch_script(const char *name, char *path, size_t size)
{
    snprintf(path, size, "tools/%s", name);
    if (access(path, R_OK) == 0)
        return true;
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return false;
    exe[len] = '\0';
    for (int up = 0; up < 3; up++) { /* drop the executable, tools, build */
        char *slash = strrchr(exe, '/');
        if (!slash)
            return false;
        *slash = '\0';
    }
    snprintf(path, size, "%s/tools/%s", exe, name);
    return access(path, R_OK) == 0;
}

/* Whether `python` can import torch (its own output discarded). */
static inline bool bench_torch_importable(const char *python)
{
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import torch' >/dev/null 2>&1", python);
    return system(cmd) == 0;
}

/* The interpreter: --python, else $FSDP_PYTHON (both taken as given), else
 * the first of python3 on PATH and /usr/bin/python3 that imports torch,
 * else python3 (whose error then says what is missing). */
static inline const char *bench_torch_python(const char *arg)
{
    if (arg)
        return arg;
    const char *env = getenv("FSDP_PYTHON");
    if (env && *env)
        return env;
    static const char *const candidates[] = {"python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++)
        if (bench_torch_importable(candidates[i]))
            return candidates[i];
    return "python3";
}

#endif /* FSDP_TOOLS_BENCH_TORCH_H */
