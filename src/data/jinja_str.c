/*
 * jinja_str.c - Python's str methods on the strings of the Jinja subset
 * (jinja_str.h), for the built-in filters and methods: strip, upper/lower/
 * capitalize/title, replace, split, startswith/endswith. Whitespace is
 * Python's str.isspace(): Unicode category Zs, or bidirectional class WS,
 * B or S. Results keep the content marks only where the text is a part of
 * the input as it was (strip, split); any other change makes template text.
 */
#include <string.h>
#include <utf8proc.h>

#include "core/error.h"
#include "data/jinja_str.h"

static const jv UNDEF = {.t = JV_UNDEF};

static bool py_space(int32_t cp)
{
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

/* The code point at s[i] (1 byte for an invalid one) into *cp; returns its length. */
static size_t next_cp(const char *s, size_t n, size_t i, int32_t *cp)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                          (utf8proc_ssize_t)(n - i), &c);
    if (k <= 0) {
        *cp = -1;
        return 1;
    }
    *cp = c;
    return (size_t)k;
}

static bool in_chars(int32_t cp, const jstr *chars)
{
    for (size_t i = 0; i < chars->n;) {
        int32_t c;
        i += next_cp(chars->p, chars->n, i, &c);
        if (c == cp)
            return true;
    }
    return false;
}

/* str.strip/lstrip/rstrip: which = 3 both ends, 1 left, 2 right; chars NULL: whitespace. */
jv jstr_strip(jrender *r, jv s, int which, const jstr *chars)
{
    size_t b = 0, e = s.s->n;
    const char *p = s.s->p;
    if (which & 1)
        while (b < e) {
            int32_t cp;
            size_t k = next_cp(p, e, b, &cp);
            if (cp < 0 || !(chars ? in_chars(cp, chars) : py_space(cp)))
                break;
            b += k;
        }
    if (which & 2)
        while (e > b) {
            size_t s0 = e - 1;
            while (s0 > b && ((unsigned char)p[s0] & 0xc0) == 0x80)
                s0--;
            int32_t cp;
            if (next_cp(p, e, s0, &cp) != e - s0 || cp < 0 ||
                !(chars ? in_chars(cp, chars) : py_space(cp)))
                break;
            e = s0;
        }
    return jv_substr(r, s, b, e);
}

/* Map each code point: 'u' upper, 'l' lower, 'c' capitalize, 't' title. */
jv jstr_recase(jrender *r, jv s, char how)
{
    const char *p = s.s->p;
    size_t n = s.s->n;
    char *o = jarena_alloc(&r->a, 4 * n + 1);
    if (!o)
        return jinja_fail(r, 0, FSDP_STATUS_FORMAT, "out of render memory"), UNDEF;
    size_t k = 0;
    bool word_start = true;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t len = next_cp(p, n, i, &cp);
        if (cp < 0) {
            o[k++] = p[i];
            i += len;
            word_start = true;
            continue;
        }
        bool up = how == 'u' || (how == 'c' && i == 0) || (how == 't' && word_start);
        int32_t m = up ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        k += (size_t)utf8proc_encode_char(m, (utf8proc_uint8_t *)o + k);
        const utf8proc_property_t *pr = utf8proc_get_property(cp);
        word_start = !(pr->category >= UTF8PROC_CATEGORY_LU &&
                       pr->category <= UTF8PROC_CATEGORY_LO);
        i += len;
    }
    return jv_str(r, o, k);
}

jv jstr_replace(jrender *r, const jx *x, jv s, jv old, jv new, int64_t count)
{
    if (!jinja_want_str(r, x, old, "replace: the old text") ||
        !jinja_want_str(r, x, new, "replace: the new text"))
        return UNDEF;
    size_t n = s.s->n, on = old.s->n, nn = new.s->n;
    size_t max = n + (on ? n / on + 1 : n + 1) * nn + 1;
    char *o = jarena_alloc(&r->a, max);
    if (!o)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "out of render memory"), UNDEF;
    size_t k = 0, i = 0;
    int64_t done = 0;
    while (i <= n) {
        bool hit = (count < 0 || done < count) &&
                   (on ? i + on <= n && !memcmp(s.s->p + i, old.s->p, on) : true);
        if (hit) {
            memcpy(o + k, new.s->p, nn);
            k += nn;
            done++;
            if (on) {
                i += on;
                continue;
            }
        }
        if (i == n)
            break;
        o[k++] = s.s->p[i++];
    }
    return jv_str(r, o, k);
}

jv jstr_split(jrender *r, const jx *x, jv s, jv sep, int64_t maxsplit)
{
    jv out = jv_list(r, 4);
    const char *p = s.s->p;
    size_t n = s.s->n, i = 0;
    if (out.t != JV_LIST)
        return UNDEF;
    if (sep.t == JV_NONE || sep.t == JV_UNDEF) { /* runs of whitespace, ends dropped */
        int64_t done = 0;
        while (i < n) {
            int32_t cp;
            size_t k;
            while (i < n && (k = next_cp(p, n, i, &cp)) && cp >= 0 && py_space(cp))
                i += k;
            if (i >= n)
                break;
            size_t b = i;
            if (maxsplit >= 0 && done >= maxsplit) {
                jv_list_push(r, out, jv_substr(r, s, b, n));
                break;
            }
            while (i < n && (k = next_cp(p, n, i, &cp)) && !(cp >= 0 && py_space(cp)))
                i += k;
            jv_list_push(r, out, jv_substr(r, s, b, i));
            done++;
        }
        return out;
    }
    if (!jinja_want_str(r, x, sep, "split: the separator"))
        return UNDEF;
    if (sep.s->n == 0)
        return jinja_fail(r, x->line, FSDP_STATUS_FORMAT, "split: an empty separator"), UNDEF;
    size_t b = 0;
    int64_t done = 0;
    while (i + sep.s->n <= n) {
        if ((maxsplit < 0 || done < maxsplit) && !memcmp(p + i, sep.s->p, sep.s->n)) {
            jv_list_push(r, out, jv_substr(r, s, b, i));
            i += sep.s->n;
            b = i;
            done++;
            continue;
        }
        i++;
    }
    jv_list_push(r, out, jv_substr(r, s, b, n));
    return out;
}

/* startswith/endswith with a string or a list of them. */
jv jstr_affix(jrender *r, const jx *x, jv s, jv what, bool end)
{
    jv one[1] = {what};
    const jv *v = what.t == JV_LIST ? what.l->v : one;
    size_t n = what.t == JV_LIST ? what.l->n : 1;
    for (size_t i = 0; i < n; i++) {
        if (!jinja_want_str(r, x, v[i], end ? "endswith" : "startswith"))
            return UNDEF;
        size_t k = v[i].s->n;
        if (k <= s.s->n && !memcmp(s.s->p + (end ? s.s->n - k : 0), v[i].s->p, k))
            return jv_bool(true);
    }
    return jv_bool(false);
}
