/*
 * tokjson_pipe.c - the sections of tokenizer.json around the BPE model:
 * normalizer, pre-tokenizer steps, post-processor and their checks
 * (tokjson_pipe.h). What is accepted is listed in hftok.h; everything else is
 * UNSUPPORTED naming the field, so a tokenizer is never read as something
 * that would encode differently from the reference.
 */
#include <stdio.h>
#include <string.h>

#include "data/tokjson_pipe.h"

/* GPT-2's byte-level split (tokenizers' ByteLevel with use_regex). */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+"
                                   "| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- normalizer, pre-tokenizer, post-processor, decoder ------------------------------ */

/* The sections that may hold a "Sequence" of their own kind, and the key
 * of its list. */
enum seq_section { SEQ_NORMALIZER, SEQ_PRETOK, SEQ_POST };
static const char *const seq_key[] = {"normalizers", "pretokenizers", "processors"};

/* A "Sequence" of section sec: v[key] must be an array (FORMAT naming
 * field.key); each item is read as "field.key[i]" in order, stopping at the
 * first error. A pre-tokenizer item is last only as the last item of a last
 * Sequence. */
static fsdp_status read_sequence(tokjson_reader *r, enum seq_section sec, const fsdp_json *v,
                                 const char *field, bool last, bool *have_bytelevel)
{
    char f[160];
    snprintf(f, sizeof f, "%s.%s", field, seq_key[sec]);
    const fsdp_json *list = fsdp_json_get(v, seq_key[sec]);
    FSDP_TRY(tokjson_want(r, list, FSDP_JSON_ARRAY, f));
    size_t i = 0;
    for (const fsdp_json *c = list->child; c; c = c->next, i++) {
        snprintf(f, sizeof f, "%s.%s[%zu]", field, seq_key[sec], i);
        if (sec == SEQ_NORMALIZER)
            FSDP_TRY(tokjson_read_normalizer(r, c, f));
        else if (sec == SEQ_PRETOK)
            FSDP_TRY(tokjson_read_pretok(r, c, f, last && !c->next, have_bytelevel));
        else
            FSDP_TRY(tokjson_read_post(r, c, f));
    }
    return FSDP_STATUS_OK;
}

fsdp_status tokjson_read_normalizer(tokjson_reader *r, const fsdp_json *v, const char *field)
{
    if (!v || v->type == FSDP_JSON_NULL)
        return FSDP_STATUS_OK;
    const char *type;
    FSDP_TRY(tokjson_type_of(r, v, field, &type));
    if (!strcmp(type, "NFC")) {
        r->t->nfc = true;
        return FSDP_STATUS_OK;
    }
    if (!strcmp(type, "Sequence"))
        return read_sequence(r, SEQ_NORMALIZER, v, field, true, NULL);
    char what[96];
    snprintf(what, sizeof what, "normalizer '%.40s' (null and NFC are)", type);
    return tokjson_unsupported(r, field, what);
}

static fsdp_status add_step(tokjson_reader *r, const char *field, hftok_step **out)
{
    if (r->t->n_steps == HFTOK_MAX_STEPS)
        return tokjson_bad(r, FSDP_STATUS_UNSUPPORTED, field, "more than %d pre-tokenizer steps",
                           HFTOK_MAX_STEPS);
    *out = &r->t->steps[r->t->n_steps++];
    return FSDP_STATUS_OK;
}

static fsdp_status compile_step(tokjson_reader *r, hftok_step *s, const char *field,
                                const char *pat, size_t len, bool literal)
{
    FSDP_TRY(fsdp_hftok_compile(r->t, field, pat, len, literal, true, &s->re));
    if (!(s->md = pcre2_match_data_create_from_pattern(s->re, NULL)) ||
        !(s->pattern = strndup(pat, len)) || !(s->field = strdup(field)))
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for a pattern");
    return FSDP_STATUS_OK;
}

static fsdp_status read_split(tokjson_reader *r, const fsdp_json *v, const char *field)
{
    char f[160];
    hftok_step *s = NULL;
    FSDP_TRY(add_step(r, field, &s));
    snprintf(f, sizeof f, "%s.pattern", field);
    const fsdp_json *p = fsdp_json_get(v, "pattern");
    FSDP_TRY(tokjson_want(r, p, FSDP_JSON_OBJECT, f));
    const fsdp_json *re = fsdp_json_get(p, "Regex"), *lit = fsdp_json_get(p, "String");
    const fsdp_json *pat = re ? re : lit;
    snprintf(f, sizeof f, "%s.pattern.%s", field, re ? "Regex" : "String");
    FSDP_TRY(tokjson_want(r, pat, FSDP_JSON_STRING, f));
    if (pat->len == 0)
        return tokjson_bad(r, FSDP_STATUS_FORMAT, f, "the pattern is empty");
    FSDP_TRY(compile_step(r, s, f, pat->str, pat->len, !re));
    snprintf(f, sizeof f, "%s.behavior", field);
    const fsdp_json *b = fsdp_json_get(v, "behavior");
    FSDP_TRY(tokjson_want(r, b, FSDP_JSON_STRING, f));
    if (!fsdp_json_name(b))
        return tokjson_bad(r, FSDP_STATUS_FORMAT, f, "holds \\u0000 (a NUL character)");
    if (!strcmp(b->str, "Isolated"))
        s->behavior = HFTOK_ISOLATED;
    else if (!strcmp(b->str, "Removed"))
        s->behavior = HFTOK_REMOVED;
    else
        return tokjson_bad(r, FSDP_STATUS_UNSUPPORTED, f,
                   "split behaviour '%.40s' is not supported (Isolated and Removed are)", b->str);
    bool invert;
    snprintf(f, sizeof f, "%s.invert", field);
    FSDP_TRY(tokjson_get_bool(r, v, "invert", f, false, &invert));
    return invert ? tokjson_unsupported(r, f, "an inverted split") : FSDP_STATUS_OK;
}

fsdp_status tokjson_read_pretok(tokjson_reader *r, const fsdp_json *v, const char *field, bool last,
                                bool *have_bytelevel)
{
    const char *type;
    char f[160];
    FSDP_TRY(tokjson_type_of(r, v, field, &type));
    if (!strcmp(type, "Sequence"))
        return read_sequence(r, SEQ_PRETOK, v, field, last, have_bytelevel);
    if (*have_bytelevel)
        return tokjson_bad(r, FSDP_STATUS_UNSUPPORTED, field,
                   "a pre-tokenizer after ByteLevel is not supported (ByteLevel must come last)");
    hftok_step *s = NULL;
    if (!strcmp(type, "Split"))
        return read_split(r, v, field);
    if (!strcmp(type, "Digits")) {
        bool single;
        snprintf(f, sizeof f, "%s.individual_digits", field);
        FSDP_TRY(tokjson_get_bool(r, v, "individual_digits", f, false, &single));
        FSDP_TRY(add_step(r, field, &s));
        const char *pat = single ? "\\p{N}" : "\\p{N}+";
        return compile_step(r, s, field, pat, strlen(pat), false);
    }
    if (!strcmp(type, "ByteLevel")) {
        if (!last)
            return tokjson_bad(r, FSDP_STATUS_UNSUPPORTED, field,
                       "a pre-tokenizer after ByteLevel is not supported (ByteLevel must come "
                               "last)");
        *have_bytelevel = true;
        FSDP_TRY(add_step(r, field, &s));
        snprintf(f, sizeof f, "%s.add_prefix_space", field);
        const fsdp_json *aps = fsdp_json_get(v, "add_prefix_space");
        FSDP_TRY(tokjson_want(r, aps, FSDP_JSON_BOOL, f));
        s->prefix_space = aps->boolean;
        bool regex;
        snprintf(f, sizeof f, "%s.use_regex", field);
        FSDP_TRY(tokjson_get_bool(r, v, "use_regex", f, true, &regex));
        if (regex)
            FSDP_TRY(compile_step(r, s, field, GPT2_PATTERN, strlen(GPT2_PATTERN), false));
        return FSDP_STATUS_OK;
    }
    char what[96];
    snprintf(what, sizeof what, "pre-tokenizer '%.40s' (Split, Digits, ByteLevel are)", type);
    return tokjson_unsupported(r, field, what);
}

/* TemplateProcessing: the special tokens before and after $A. */
static fsdp_status read_template(tokjson_reader *r, const fsdp_json *v, const char *field)
{
    char f[160];
    snprintf(f, sizeof f, "%s.single", field);
    const fsdp_json *single = fsdp_json_get(v, "single");
    FSDP_TRY(tokjson_want(r, single, FSDP_JSON_ARRAY, f));
    snprintf(f, sizeof f, "%s.special_tokens", field);
    const fsdp_json *specials = fsdp_json_get(v, "special_tokens");
    FSDP_TRY(tokjson_want(r, specials, FSDP_JSON_OBJECT, f));
    bool after = false;
    size_t i = 0;
    for (const fsdp_json *p = single->child; p; p = p->next, i++) {
        snprintf(f, sizeof f, "%s.single[%zu]", field, i);
        FSDP_TRY(tokjson_want(r, p, FSDP_JSON_OBJECT, f));
        const fsdp_json *tok = fsdp_json_get(p, "SpecialToken");
        if (!tok) {
            if (!fsdp_json_get(p, "Sequence"))
                return tokjson_bad(r, FSDP_STATUS_FORMAT, f, "expected SpecialToken or Sequence");
            after = true;
            continue;
        }
        const fsdp_json *name = fsdp_json_get(tok, "id");
        FSDP_TRY(tokjson_want(r, name, FSDP_JSON_STRING, f));
        const fsdp_json *sp = fsdp_json_get(fsdp_json_get(specials, name->str), "ids");
        int *slot = after ? &r->t->eos : &r->t->bos;
        if (!sp || sp->type != FSDP_JSON_ARRAY || sp->n != 1 || *slot >= 0)
            return tokjson_bad(r, FSDP_STATUS_UNSUPPORTED, f,
                               "only one special token of one id before and after the sequence is "
                               "supported ('%.64s')", name->str);
        FSDP_TRY(tokjson_as_id(r, sp->child, f, slot));
    }
    return FSDP_STATUS_OK;
}

fsdp_status tokjson_read_post(tokjson_reader *r, const fsdp_json *v, const char *field)
{
    if (!v || v->type == FSDP_JSON_NULL)
        return FSDP_STATUS_OK;
    const char *type;
    FSDP_TRY(tokjson_type_of(r, v, field, &type));
    if (!strcmp(type, "ByteLevel"))
        return FSDP_STATUS_OK; /* offsets only */
    if (!strcmp(type, "TemplateProcessing"))
        return read_template(r, v, field);
    if (!strcmp(type, "Sequence"))
        return read_sequence(r, SEQ_POST, v, field, true, NULL);
    char what[128];
    snprintf(what, sizeof what, "post-processor '%.40s' (ByteLevel, TemplateProcessing are)",
             type);
    return tokjson_unsupported(r, field, what);
}

