/*
 * fixture_util.h - where the suites that read generated fixtures (golden
 * files under tests/fixtures: test_model, test_llama, test_ops_llama) find
 * them: $FSDP_FIXTURES, tests/fixtures (runs from the repository root, as
 * make test does) or fixtures/ beside the test sources (runs from
 * elsewhere).
 */
#ifndef FSDP_TESTS_FIXTURE_UTIL_H
#define FSDP_TESTS_FIXTURE_UTIL_H

#include <stddef.h>

/* The path of fixture `rel` (e.g. "llama_tiny/config.json") into
 * path[0..n): the first of the three places where it opens. Fails the
 * test, naming the tool that regenerates it (`regen`), when none does. */
void fixture_path(char *path, size_t n, const char *rel, const char *regen);

/* Fixture rel read whole (malloc'd, NUL-terminated; fixture_path's
 * failure when missing); its size in *size, its path in path[0..path_n). */
unsigned char *fixture_read(const char *rel, const char *regen, size_t *size, char *path,
                            size_t path_n);

#endif /* FSDP_TESTS_FIXTURE_UTIL_H */
