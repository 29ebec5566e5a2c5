/*
 * ids.h - internal to src/data: growing arrays of token ids and of
 * per-token flags, filled by the tokenizer, the chat renderer and the
 * data loaders.
 */
#ifndef FSDP_DATA_IDS_H
#define FSDP_DATA_IDS_H

#include <stddef.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

typedef struct fsdp_ids {
    int *p;
    size_t n, cap;
} fsdp_ids;

typedef struct fsdp_flags {
    uint8_t *p;
    size_t n, cap;
} fsdp_flags;

/* Make room for `more` elements after the n already held. OOM on failure
 * (the array is unchanged). */
fsdp_status fsdp_ids_reserve(fsdp_ids *v, size_t more);
fsdp_status fsdp_flags_reserve(fsdp_flags *v, size_t more);

/* Append n ids / n copies of flag. */
fsdp_status fsdp_ids_append(fsdp_ids *v, const int *ids, size_t n);
fsdp_status fsdp_flags_fill(fsdp_flags *v, uint8_t flag, size_t n);

void fsdp_ids_free(fsdp_ids *v);
void fsdp_flags_free(fsdp_flags *v);

#endif /* FSDP_DATA_IDS_H */
