/*
 * chat.h - chat formats: how a conversation ({role, content} messages)
 * becomes tokens, and which of them a fine-tuning loss trains on.
 *
 * One table of named formats; model families name theirs, the CLI lists
 * the names (--chat-format), and fsdp_chat_format_for picks the first one
 * whose special tokens a tokenizer has. A format is four strings around
 * each message:
 *
 *   begin                       once, before the first message
 *   header (with the role)      before the content
 *   content                     the message text (trimmed if `trim`)
 *   close                       after the content
 *   sep                         after close
 *
 * Trained tokens: an assistant message's content and its close (the model
 * learns to answer and to stop); everything else is context. Template
 * strings are encoded with special-token matching, contents with special
 * tokens left as text (FSDP_HFTOK_SPLIT_SPECIAL), so a message cannot
 * forge a header. Header, content and close are encoded separately (as
 * torchtune does), which keeps the trained span exact; the reference
 * library, encoding the whole rendered string, splits the same way except
 * where a content begins with a line break after a header that ends in
 * one (both newlines then form one pre-token there).
 */
#ifndef FSDP_DATA_CHAT_H
#define FSDP_DATA_CHAT_H

#include <stddef.h>

#include "data/hftok.h"
#include "data/ids.h"

#define FSDP_CHAT_MAX_ROLES 4

typedef struct fsdp_chat_format {
    const char *name;          /* "llama3", "chatml" */
    const char *help;          /* one line for --help */
    const char *begin;
    const char *header;        /* "%s" stands for the role */
    const char *close;
    const char *sep;
    bool trim;                 /* strip leading and trailing whitespace of contents */
    const char *roles[FSDP_CHAT_MAX_ROLES];      /* accepted roles */
    const char *specials[FSDP_CHAT_MAX_ROLES];   /* added tokens the tokenizer must have */
} fsdp_chat_format;

typedef struct fsdp_chat_msg {
    const char *role;
    const char *content;       /* UTF-8, len bytes */
    size_t len;
} fsdp_chat_msg;

/* The formats, for listing: *n entries. */
const fsdp_chat_format *fsdp_chat_formats(int *n);

/* The format names joined by sep ("llama3|chatml" with sep "|"), for
 * help texts and messages; truncated to fit n. Returns buf. */
const char *fsdp_chat_format_names(char *buf, size_t n, const char *sep);

/* The format named `name`, or NULL. */
const fsdp_chat_format *fsdp_chat_format_find(const char *name);

/* The first format whose special tokens are all added tokens of t, or
 * NULL. */
const fsdp_chat_format *fsdp_chat_format_for(const fsdp_hftok *t);

/* Check that t has every special token f uses: INVALID_ARG naming the
 * missing token and the tokenizer's label `tok_label` otherwise. */
fsdp_status fsdp_chat_format_check(const fsdp_chat_format *f, const fsdp_hftok *t,
                                   const char *tok_label);

/* Index of role in f->roles, or -1. */
int fsdp_chat_role(const fsdp_chat_format *f, const char *role);

/* Append the tokens of msgs[0..n) rendered with f to ids, and to trained
 * one flag per token (1 = a target of the loss). Roles must be accepted by
 * f (INVALID_ARG naming the message otherwise). */
fsdp_status fsdp_chat_render(fsdp_hftok *t, const fsdp_chat_format *f, const fsdp_chat_msg *msgs,
                             int n, fsdp_ids *ids, fsdp_flags *trained);

#endif /* FSDP_DATA_CHAT_H */
