/*
 * tokjson_pipe.h - internal to the tokenizer.json reader: the sections
 * around the BPE model (tokjson_pipe.c), read by tokjson.c.
 */
#ifndef FSDP_DATA_TOKJSON_PIPE_H
#define FSDP_DATA_TOKJSON_PIPE_H

#include "data/tokjson_read.h"

/* Each reads section `v` (absent or null: nothing to do, where the format
 * allows it) into r->t. read_pretok is called on the top-level
 * pre_tokenizer with last = true; it sets *have_bytelevel when a
 * ByteLevel step was read. */
fsdp_status tokjson_read_normalizer(tokjson_reader *r, const fsdp_json *v, const char *field);
fsdp_status tokjson_read_pretok(tokjson_reader *r, const fsdp_json *v, const char *field, bool last,
                                bool *have_bytelevel);
fsdp_status tokjson_read_post(tokjson_reader *r, const fsdp_json *v, const char *field);

#endif /* FSDP_DATA_TOKJSON_PIPE_H */
