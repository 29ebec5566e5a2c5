/*
 * chat_template.h - internal to src/data: the renderer that runs a model's
 * own chat template (chat.h's first kind), for chat.c's fsdp_chat, and
 * the special-token count both kinds of renderer report.
 *
 * Below chat.h, which includes it: it renders by chat.h's rule (the loss
 * mask, special tokens in contents) but knows nothing of fsdp_chat or the
 * built-in formats. Messages are jinja.h's (chat.h's fsdp_chat_msg is the
 * same type).
 */
#ifndef FSDP_DATA_CHAT_TEMPLATE_H
#define FSDP_DATA_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/hftok.h"
#include "data/ids.h"
#include "data/jinja.h"

typedef struct fsdp_chat_tpl fsdp_chat_tpl;

/* The template that comes with `tokenizer` (a tokenizer.json path): chat_template.jinja
 * beside it, else the "chat_template" of tokenizer_config.json beside it (a string, or
 * the list of named templates: "default"), with that file's bos_token and eos_token.
 * OK with *out NULL when there is none. FORMAT for a malformed tokenizer_config.json, and
 * the parser's errors for a template outside the subset. The date is strftime_now's
 * (year 0: FSDP_CHAT_DATE, else today, UTC). */
fsdp_status fsdp_chat_tpl_load(fsdp_chat_tpl **out, const char *tokenizer, int year, int month,
                               int day);

/* A template given as text, for tests: label names it; bos/eos may be NULL. */
fsdp_status fsdp_chat_tpl_parse(fsdp_chat_tpl **out, const char *label, const char *text,
                                size_t n, const char *bos, const char *eos, int year,
                                int month, int day);

void fsdp_chat_tpl_free(fsdp_chat_tpl *tp);

/* "chat template of PATH" and, when the template reads the date, "(strftime_now: 14 Sep
 * 2024)". */
const char *fsdp_chat_tpl_describe(const fsdp_chat_tpl *tp);

/* fsdp_chat_encode for a template. */
fsdp_status fsdp_chat_tpl_encode(const fsdp_chat_tpl *tp, fsdp_hftok *t,
                                 const fsdp_jinja_msg *msgs, int n, bool add_generation_prompt,
                                 fsdp_ids *ids, fsdp_flags *trained, uint64_t *n_special);

/* fsdp_chat_end_of_turn for a template. */
int fsdp_chat_tpl_end_of_turn(const fsdp_chat_tpl *tp, fsdp_hftok *t);

/* Add to *count the special-token strings of t in text[0..n) (they stay text in contents:
 * chat.h). */
fsdp_status fsdp_chat_count_special(fsdp_hftok *t, const char *text, size_t n,
                                    uint64_t *count);

#endif /* FSDP_DATA_CHAT_TEMPLATE_H */
