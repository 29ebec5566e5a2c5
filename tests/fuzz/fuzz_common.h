/*
 * fuzz_common.h - shared by the libFuzzer targets in tests/fuzz/: most
 * readers take a path, so each input is written to a per-process
 * temporary file first (removed at exit).
 *
 * Built only by `make fuzz` (clang -fsanitize=fuzzer,address,undefined);
 * every target must return 0 and must neither crash, leak nor read out of
 * bounds on any input.
 */
#ifndef FSDP_FUZZ_COMMON_H
#define FSDP_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static char fuzz_path[256];

static void fuzz_cleanup(void)
{
    if (fuzz_path[0])
        unlink(fuzz_path);
}

/* Write data to this process's temporary file (name ends in `suffix`,
 * which selects the reader) and return its path. */
__attribute__((unused)) static const char *fuzz_temp_file(const uint8_t *data, size_t size, const char *suffix)
{
    if (!fuzz_path[0]) {
        snprintf(fuzz_path, sizeof fuzz_path, "/tmp/fsdp_fuzz_%ld%s", (long)getpid(), suffix);
        atexit(fuzz_cleanup);
    }
    FILE *f = fopen(fuzz_path, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    if (fclose(f) != 0)
        abort();
    return fuzz_path;
}

#endif /* FSDP_FUZZ_COMMON_H */
