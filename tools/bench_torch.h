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

/* The interpreter: --python, else $FSDP_PYTHON, else /usr/bin/python3
 * (Debian's python3-torch), else python3. */
static inline const char *bench_torch_python(const char *arg)
{
    if (arg)
        return arg;
    const char *env = getenv("FSDP_PYTHON");
    if (env && *env)
        return env;
    if (access("/usr/bin/python3", X_OK) == 0)
        return "/usr/bin/python3";
    return "python3";
}

#endif /* FSDP_TOOLS_BENCH_TORCH_H */
