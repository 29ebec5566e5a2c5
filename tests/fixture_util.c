/*
 * fixture_util.c - finding and reading the generated fixtures
 * (fixture_util.h).
 */
#include "fixture_util.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

void fixture_path(char *path, size_t n, const char *rel, const char *regen)
{
    const char *slash = strrchr(__FILE__, '/'); /* this file sits beside the suites */
    for (int k = 0; k < 3; k++) {
        if (k == 0 && getenv("FSDP_FIXTURES"))
            snprintf(path, n, "%s/%s", getenv("FSDP_FIXTURES"), rel);
        else if (k == 1)
            snprintf(path, n, "tests/fixtures/%s", rel);
        else if (k == 2 && slash)
            snprintf(path, n, "%.*s/fixtures/%s", (int)(slash - __FILE__), __FILE__, rel);
        else
            continue;
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            return;
        }
    }
    ck_abort_msg("cannot find fixture %s; regenerate with %s", rel, regen);
}

unsigned char *fixture_read(const char *rel, const char *regen, size_t *size, char *path,
                            size_t path_n)
{
    fixture_path(path, path_n, rel, regen);
    return (unsigned char *)fsdp_test_read_file(path, size);
}
