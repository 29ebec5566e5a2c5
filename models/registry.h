/*
 * registry.h - the model families this build knows, and the one way a
 * model spec becomes a model.
 *
 * A spec is either a named shape ("tiny", "gpt2-xl"; names are unique
 * across families) or "<family>:<config>" ("gpt2:layers=4,heads=4"); a
 * family may keep an older prefix as an alias ("custom:..." is GPT-2).
 * Everything above models/ goes through these functions and the
 * fsdp_model's family pointer, never through a family's own header.
 */
#ifndef FSDP_MODELS_REGISTRY_H
#define FSDP_MODELS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "models/family.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The registered families, in --help order. */
int fsdp_model_family_count(void);
const fsdp_model_family *fsdp_model_family_at(int i);
/* By name ("gpt2"); NULL if this build has no such family. */
const fsdp_model_family *fsdp_model_family_find(const char *name);

/* Does `value` read as a spec: a named shape, or a registered family's
 * prefix (or alias) followed by ':'? (Whether it parses is another matter:
 * fsdp_model_from_spec says.) */
bool fsdp_model_is_spec(const char *value);

/* Build the model a spec names. INVALID_ARG for an unknown name or family
 * and for a config the family refuses, the message saying what is wrong
 * and what is accepted. On failure *m is zeroed. Free with fsdp_model_free. */
fsdp_status fsdp_model_from_spec(const char *spec, fsdp_model *m);

/* Build family f's model of `config` (as recorded in a checkpoint or
 * worked out from a weight file); sets m->family, m->config, m->name. */
fsdp_status fsdp_model_build(const fsdp_model_family *f, const char *config, fsdp_model *m);

/* The spec that rebuilds m: "<family>:<canonical config>". */
void fsdp_model_spec_of(const fsdp_model *m, char *buf, size_t n);

/* The --model help text for specs, from the registry: every named shape
 * once, every family's grammar and doc line, e.g. "tiny|small|... (GPT-2),
 * or gpt2:layers=L,... (any GPT-2: ...; also spelled custom:...)". Returns
 * the length (truncated to n - 1). */
size_t fsdp_model_spec_help(char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_MODELS_REGISTRY_H */
