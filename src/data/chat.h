/*
 * chat.h - chat formats: how a conversation ({role, content} messages)
 * becomes tokens, and which of them a fine-tuning loss trains on.
 *
 * Two kinds of renderer (fsdp_chat), picked by fsdp_chat_open:
 * - the model's own template: the "chat_template" of the
 *   tokenizer_config.json (or chat_template.jinja) beside the
 *   tokenizer.json, run by the Jinja subset of jinja.h exactly as
 *   transformers' apply_chat_template renders it (chat_template.c);
 * - a built-in format, when the tokenizer comes without a template or
 *   --chat-format names one: one table of named formats (model families
 *   name theirs, the CLI lists the names), each four strings around every
 *   message:
 *
 *   begin                       once, before the first message
 *   header (with the role)      before the content
 *   content                     the message text (trimmed if `trim`)
 *   close                       after the content
 *   sep                         after close
 *
 * Trained tokens (the loss mask), for both: an assistant message's
 * content, and the end of its turn: whatever the rendering puts after the
 * content up to and including the first special token, when only
 * whitespace comes before that token (<|eot_id|>, <|im_end|>, </s>: the
 * model learns to answer and to stop). Everything else is context: system
 * and user turns, headers, the separator after the end-of-turn token
 * (ChatML's "\n"). A token that straddles the start of a content (a
 * header's newline merged with the content's first characters) is
 * trained.
 *
 * Special tokens are matched in the template's own text only; message
 * contents are encoded with special tokens left as text
 * (FSDP_HFTOK_SPLIT_SPECIAL), so a message cannot forge a header, and
 * each special-token string found in a content is counted for the user
 * ("N special-token strings in the text were kept as text"). A template's
 * rendering is encoded as the reference library encodes the whole string
 * (split at the template's special tokens, each stretch between them
 * encoded whole), so ids equal transformers' apply_chat_template(
 * tokenize=True) wherever contents hold no special-token text. The
 * built-in formats encode header, content and close separately (as
 * torchtune does), which differs from the reference only where a content
 * begins with a line break after a header that ends in one.
 */
#ifndef FSDP_DATA_CHAT_H
#define FSDP_DATA_CHAT_H

#include <stddef.h>

#include "data/chat_template.h"
#include "data/hftok.h"
#include "data/ids.h"
#include "data/jinja.h"

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

/* role, content (UTF-8, len bytes) */
typedef fsdp_jinja_msg fsdp_chat_msg;

/* The formats, for listing: *n entries. */
const fsdp_chat_format *fsdp_chat_formats(int *n);

/* The --chat-format values joined by sep ("template|llama3|chatml" with
 * sep "|"), for help texts and messages; truncated to fit n. Returns buf. */
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

/* ---- renderers: the model's template or a built-in format ------------------------------ */

/* --chat-format's value for the tokenizer's own template (required to exist). */
#define FSDP_CHAT_TEMPLATE "template"

typedef struct fsdp_chat fsdp_chat;

typedef struct fsdp_chat_opts {
    const char *format;        /* NULL: the template beside the tokenizer when there is one,
                                * else the built-in format whose special tokens it has;
                                * FSDP_CHAT_TEMPLATE: the template; else a built-in name */
    const char *tokenizer;     /* the tokenizer.json; tokenizer_config.json and
                                * chat_template.jinja are looked for beside it */
    int year, month, day;      /* strftime_now's date; year 0: FSDP_CHAT_DATE (YYYY-MM-DD),
                                * else today (UTC) */
} fsdp_chat_opts;

/* OK when `name` is a --chat-format value (a built-in name or FSDP_CHAT_TEMPLATE);
 * INVALID_ARG listing the known ones otherwise. */
fsdp_status fsdp_chat_check_name(const char *name);

/* Open the renderer o asks for, for tokenizer t (read for the built-ins' special tokens
 * and the template's bos/eos). With o->format NULL and nothing that fits t, OK with *out
 * NULL. INVALID_ARG for a format t lacks tokens of, or FSDP_CHAT_TEMPLATE without a
 * template; the template's own parse errors (jinja.h) name its file and line. */
fsdp_status fsdp_chat_open(fsdp_chat **out, const fsdp_hftok *t, const fsdp_chat_opts *o);

void fsdp_chat_free(fsdp_chat *c);

/* What renders, for run headers and logs: "chat template of DIR/tokenizer_config.json
 * (strftime_now: 14 Sep 2024)" or "built-in chat format llama3 (no chat_template beside
 * the tokenizer)". */
const char *fsdp_chat_describe(const fsdp_chat *c);

/* The built-in format c renders with, or NULL for a template. */
const fsdp_chat_format *fsdp_chat_builtin(const fsdp_chat *c);

/* Render msgs[0..n) (with the assistant's opening after them when add_generation_prompt)
 * and append the tokens to ids and one flag per token to trained (1 = a target of the
 * loss; chat.h's rule above). *n_special (may be NULL) grows by the special-token strings
 * found in the contents. c is read-only: one renderer serves several threads, each with
 * its own tokenizer. INVALID_ARG when the template refuses the conversation
 * (raise_exception) or a role the built-in format does not know; FORMAT when the template
 * fails or leaves an assistant content out of its text. */
fsdp_status fsdp_chat_encode(const fsdp_chat *c, fsdp_hftok *t, const fsdp_chat_msg *msgs,
                             int n, bool add_generation_prompt, fsdp_ids *ids,
                             fsdp_flags *trained, uint64_t *n_special);

/* The token that ends an assistant turn (<|eot_id|>, <|im_end|>, </s>), found as the loss
 * mask finds it, or -1 when the format has none. */
int fsdp_chat_end_of_turn(const fsdp_chat *c, fsdp_hftok *t);

/* fsdp_chat_count_special (special-token strings in a text, which both renderers count) is
 * chat_template.h's, included above. */

#endif /* FSDP_DATA_CHAT_H */
