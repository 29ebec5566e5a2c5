/*
 * utf8.c - the lossy UTF-8 stream (contract in utf8.h), after the Unicode
 * standard's table of well-formed byte sequences (chapter 3, table 3-7).
 */
#include <string.h>

#include "core/utf8.h"

/* A character that starts with lead byte c: its length in *len and the
 * range [*lo, *hi] its second byte must fall in (the later ones are 80-BF);
 * false if c starts none. */
static bool lead_byte(uint8_t c, int *len, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80, *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        *len = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        *len = 3, *lo = c == 0xE0 ? 0xA0 : 0x80, *hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        *len = 4, *lo = c == 0xF0 ? 0x90 : 0x80, *hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return false;
    return true;
}

static size_t put_replacement(uint8_t *out)
{
    out[0] = 0xEF, out[1] = 0xBF, out[2] = 0xBD; /* U+FFFD */
    return 3;
}

size_t fsdp_utf8_lossy(fsdp_utf8_stream *s, const uint8_t *in, size_t n, bool end, uint8_t *out)
{
    /* the open character's bytes, then the new ones, read as one sequence */
    uint8_t buf[3 + 64];
    size_t w = 0;
    do { /* the open character and up to 64 new bytes at a time */
        size_t take = n < sizeof buf - (size_t)s->n_pend ? n : sizeof buf - (size_t)s->n_pend;
        size_t m = (size_t)s->n_pend;
        memcpy(buf, s->pend, m);
        if (take) { /* in may be NULL at the end */
            memcpy(buf + m, in, take);
            m += take, in += take, n -= take;
        }
        s->n_pend = 0;
        size_t i = 0;
        while (i < m) {
            uint8_t c = buf[i], lo, hi;
            int len;
            if (c < 0x80) {
                out[w++] = c, i++;
                continue;
            }
            if (!lead_byte(c, &len, &lo, &hi)) {
                w += put_replacement(out + w), i++;
                continue;
            }
            int k = 1; /* bytes of the character that are well formed so far */
            while (k < len && i + (size_t)k < m) {
                uint8_t b = buf[i + (size_t)k];
                if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF))
                    break;
                k++;
            }
            if (k == len) { /* a whole character */
                memcpy(out + w, buf + i, (size_t)len);
                w += (size_t)len, i += (size_t)len;
            } else if (i + (size_t)k == m) { /* open at the end of buf: wait for the rest */
                memcpy(s->pend, buf + i, (size_t)k);
                s->n_pend = k;
                i = m;
            } else { /* broken off by buf[i + k]: one error for the prefix */
                w += put_replacement(out + w), i += (size_t)k;
            }
        }
    } while (n > 0);
    if (end && s->n_pend > 0) {
        w += put_replacement(out + w);
        s->n_pend = 0;
    }
    return w;
}
