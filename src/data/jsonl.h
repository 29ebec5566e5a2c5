/*
 * jsonl.h - internal to src/data: the text files people bring, read and
 * turned into tokens with a tokenizer.json tokenizer.
 *
 * A .jsonl file holds one JSON object per line (blank lines are skipped),
 * of one of three kinds:
 *   {"text": "..."}                                  a document
 *   {"prompt": "...", "completion": "..."}           an example
 *   {"messages": [{"role": "...", "content": "..."}, ...]}  a conversation
 * Other keys are ignored. A bad row is an error naming the file and the
 * line: not JSON, not an object, no known key (or two kinds at once), a
 * key of the wrong type, an empty text or completion, a conversation with
 * no messages or no assistant message, a role the built-in chat format
 * does not know, a conversation the chat template refuses.
 */
#ifndef FSDP_DATA_JSONL_H
#define FSDP_DATA_JSONL_H

#include <stddef.h>
#include <stdint.h>

#include "data/chat.h"
#include "data/hftok.h"
#include "data/ids.h"

typedef enum fsdp_row_kind {
    FSDP_ROW_TEXT = 0,   /* a document: every token is trained */
    FSDP_ROW_PROMPT,     /* prompt/completion: the completion is trained */
    FSDP_ROW_CHAT,       /* messages: assistant turns are trained */
} fsdp_row_kind;

typedef struct fsdp_row_ctx {
    fsdp_hftok *tok;
    const char *tok_label;          /* the tokenizer's file, for messages */
    const char *chat_format;        /* messages rows: --chat-format (chat.h), or NULL */
    fsdp_chat *chat;                /* the renderer: opened at the first messages row unless
                                     * the caller did; the caller frees it (fsdp_chat_free) */
    const char *path;               /* the data file, for messages */
    uint64_t n_special;             /* special-token strings met in the rows' text (kept as
                                     * text), counted by fsdp_row_render */
} fsdp_row_ctx;

/* Render one line (line_no counts from 1) into tokens:
 *   text:        the text's tokens (no document separator: the caller adds it);
 *   prompt:      [BOS] prompt completion EOT, the completion and EOT trained
 *                (BOS when the tokenizer's post-processor adds one; EOT is
 *                fsdp_hftok_eot, required);
 *   chat:        the conversation rendered by c->chat (chat.h).
 * Contents are encoded with special tokens left as text (counted in
 * c->n_special). Appends to ids
 * and, one flag per token, to trained. *kind says which row it was. */
fsdp_status fsdp_row_render(fsdp_row_ctx *c, const char *line, size_t len, uint64_t line_no,
                            fsdp_row_kind *kind, fsdp_ids *ids, fsdp_flags *trained);

/* A whole file mapped read-only (data NULL when empty). */
typedef struct fsdp_text_file {
    const char *data;
    size_t len;
} fsdp_text_file;

fsdp_status fsdp_text_file_map(fsdp_text_file *f, const char *path);
void fsdp_text_file_unmap(fsdp_text_file *f);

/* Call fn for each line of f that is not blank (line_no from 1; the line
 * without its "\n" or "\r\n"; done = bytes of f consumed after it). Stops
 * at the first non-OK status and returns it. */
typedef fsdp_status (*fsdp_line_fn)(void *arg, const char *line, size_t len, uint64_t line_no,
                                    size_t done);
fsdp_status fsdp_text_file_lines(const fsdp_text_file *f, fsdp_line_fn fn, void *arg);

#endif /* FSDP_DATA_JSONL_H */
