/*
 * chat_template.c - a model's own chat template as a renderer
 * (chat_template.h): found beside the tokenizer, rendered by the Jinja
 * subset (jinja.h), then encoded with the loss mask of chat.h.
 *
 * Encoding the rendered text: the template's special tokens (found where
 * the text did not come from a message) split it; each stretch between
 * them is encoded whole with special tokens left as text, as the reference
 * library encodes a string once its special tokens are split off. Token
 * offsets come from the tokens' decoded bytes; where a normalizer changed
 * the bytes of a stretch (NFC on text that was not NFC), the stretch is
 * encoded in pieces cut at the trained ranges instead, so the mask stays
 * exact.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/log.h"
#include "data/chat_template.h"

#define TEMPLATE_MAX_BYTES ((size_t)1 << 20)
#define CONFIG_MAX_BYTES ((size_t)64 << 20)

struct fsdp_chat_tpl {
    fsdp_jinja *jinja;
    char *bos, *eos;
    int year, month, day;
    char desc[512];
};

/* ---- loading ---------------------------------------------------------------------------- */

static fsdp_status pick_date(int *year, int *month, int *day)
{
    if (*year)
        return FSDP_STATUS_OK;
    const char *env = fsdp_env_get(FSDP_ENV_CHAT_DATE);
    if (env[0]) {
        int y, m, d;
        char extra;
        if (sscanf(env, "%4d-%2d-%2d%c", &y, &m, &d, &extra) != 3 || y < 1900 || m < 1 ||
            m > 12 || d < 1 || d > 31)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "FSDP_CHAT_DATE='%s': expected a "
                                  "date YYYY-MM-DD", env);
        *year = y, *month = m, *day = d;
        return FSDP_STATUS_OK;
    }
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    *year = tm.tm_year + 1900;
    *month = tm.tm_mon + 1;
    *day = tm.tm_mday;
    return FSDP_STATUS_OK;
}

static void describe(fsdp_chat_tpl *tp, const char *source)
{
    int k = snprintf(tp->desc, sizeof tp->desc, "chat template of %s", source);
    if (fsdp_jinja_mentions(tp->jinja, "strftime_now") && k > 0 && (size_t)k < sizeof tp->desc) {
        struct tm tm = {.tm_year = tp->year - 1900, .tm_mon = tp->month - 1, .tm_mday = tp->day};
        char date[32];
        strftime(date, sizeof date, "%d %b %Y", &tm);
        snprintf(tp->desc + k, sizeof tp->desc - (size_t)k, " (strftime_now: %s; set "
                 "FSDP_CHAT_DATE=YYYY-MM-DD to pin it)", date);
    }
}

fsdp_status fsdp_chat_tpl_parse(fsdp_chat_tpl **out, const char *label, const char *text,
                                size_t n, const char *bos, const char *eos, int year,
                                int month, int day)
{
    *out = NULL;
    fsdp_chat_tpl *tp = calloc(1, sizeof *tp);
    if (!tp || (bos && !(tp->bos = strdup(bos))) || (eos && !(tp->eos = strdup(eos)))) {
        fsdp_chat_tpl_free(tp);
        return fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading %s", label);
    }
    tp->year = year, tp->month = month, tp->day = day;
    fsdp_status st = pick_date(&tp->year, &tp->month, &tp->day);
    if (st == FSDP_STATUS_OK)
        st = fsdp_jinja_parse(&tp->jinja, label, text, n);
    if (st != FSDP_STATUS_OK) {
        fsdp_chat_tpl_free(tp);
        return st;
    }
    describe(tp, label);
    *out = tp;
    return FSDP_STATUS_OK;
}

/* A special token's text in tokenizer_config.json: a string, or {"content": ...}. */
static const char *token_text(const fsdp_json *v)
{
    if (v && v->type == FSDP_JSON_OBJECT)
        v = fsdp_json_get(v, "content");
    return v && v->type == FSDP_JSON_STRING ? v->str : NULL;
}

static bool exists(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f)
        fclose(f);
    return f != NULL;
}

fsdp_status fsdp_chat_tpl_load(fsdp_chat_tpl **out, const char *tokenizer, int year, int month,
                               int day)
{
    *out = NULL;
    char dir[4096], cfg_path[4200], jinja_path[4200];
    const char *slash = strrchr(tokenizer, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - tokenizer) : 1,
             slash ? tokenizer : ".");
    if (slash == tokenizer)
        snprintf(dir, sizeof dir, "/");
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", dir);
    fsdp_json *cfg = NULL;
    char *text = NULL;
    size_t n = 0;
    fsdp_status st = FSDP_STATUS_OK;
    if (exists(cfg_path)) {
        char *raw = NULL;
        size_t rn = 0;
        st = fsdp_read_file(cfg_path, "tokenizer config", CONFIG_MAX_BYTES, &raw, &rn);
        if (st == FSDP_STATUS_OK && fsdp_json_parse(raw, rn, &cfg) != FSDP_STATUS_OK)
            st = fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' is not valid JSON: %s", cfg_path,
                                fsdp_error_msg());
        free(raw);
        if (st == FSDP_STATUS_OK && cfg->type != FSDP_JSON_OBJECT)
            st = fsdp_error_set(FSDP_STATUS_FORMAT, "'%s' is not a JSON object", cfg_path);
        if (st != FSDP_STATUS_OK)
            goto out;
    }
    const char *label = NULL;
    if (exists(jinja_path)) {
        if ((st = fsdp_read_file(jinja_path, "chat template", TEMPLATE_MAX_BYTES, &text, &n)) !=
            FSDP_STATUS_OK)
            goto out;
        label = jinja_path;
    } else if (cfg) {
        const fsdp_json *ct = fsdp_json_get(cfg, "chat_template");
        if (ct && ct->type == FSDP_JSON_ARRAY) { /* named templates: the default one */
            const fsdp_json *pick = NULL;
            for (const fsdp_json *e = ct->child; e && !pick; e = e->next) {
                const fsdp_json *name = fsdp_json_get(e, "name");
                if (name && name->type == FSDP_JSON_STRING && !strcmp(name->str, "default"))
                    pick = fsdp_json_get(e, "template");
            }
            if (!pick) {
                st = fsdp_error_set(FSDP_STATUS_FORMAT, "'%s': \"chat_template\" is a list "
                                    "without a \"default\" template", cfg_path);
                goto out;
            }
            ct = pick;
        }
        if (ct && ct->type != FSDP_JSON_STRING && ct->type != FSDP_JSON_NULL) {
            st = fsdp_error_set(FSDP_STATUS_FORMAT, "'%s': \"chat_template\" must be a string, "
                                "found %s", cfg_path, fsdp_json_type_name(ct->type));
            goto out;
        }
        if (ct && ct->type == FSDP_JSON_STRING) {
            if (!(text = malloc(ct->len + 1))) {
                st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory reading '%s'",
                                    cfg_path);
                goto out;
            }
            memcpy(text, ct->str, ct->len + 1);
            n = ct->len;
            label = cfg_path;
        }
    }
    if (label)
        st = fsdp_chat_tpl_parse(out, label, text, n,
                                 cfg ? token_text(fsdp_json_get(cfg, "bos_token")) : NULL,
                                 cfg ? token_text(fsdp_json_get(cfg, "eos_token")) : NULL,
                                 year, month, day);
out:
    free(text);
    fsdp_json_free(cfg);
    return st;
}

void fsdp_chat_tpl_free(fsdp_chat_tpl *tp)
{
    if (!tp)
        return;
    fsdp_jinja_free(tp->jinja);
    free(tp->bos);
    free(tp->eos);
    free(tp);
}

const char *fsdp_chat_tpl_describe(const fsdp_chat_tpl *tp)
{
    return tp->desc;
}

/* ---- encoding --------------------------------------------------------------------------- */

fsdp_status fsdp_chat_count_special(fsdp_hftok *t, const char *text, size_t n,
                                    uint64_t *count)
{
    size_t from = 0, b, e;
    int id;
    while (from < n) {
        FSDP_TRY(fsdp_hftok_next_special(t, text, n, from, &b, &e, &id));
        if (id < 0)
            break;
        (*count)++;
        from = e;
    }
    return FSDP_STATUS_OK;
}

typedef struct range {
    size_t b, e;
} range;

static bool overlaps(size_t b, size_t e, const range *r, int n)
{
    for (int i = 0; i < n; i++)
        if (b < r[i].e && e > r[i].b)
            return true;
    return false;
}

static bool in_data(size_t b, size_t e, const fsdp_jinja_output *o)
{
    for (int i = 0; i < o->n_spans; i++)
        if (b < o->spans[i].end && e > o->spans[i].begin)
            return true;
    return false;
}

/* The special token the template writes right after text[0..at) (whitespace may come
 * first): its id (-1: none) and its end in *end. */
static fsdp_status special_after(fsdp_hftok *t, const fsdp_jinja_output *o, size_t at,
                                 size_t *end, int *id)
{
    *id = -1;
    while (at < o->len && isspace((unsigned char)o->text[at]))
        at++;
    size_t b, e;
    int found;
    FSDP_TRY(fsdp_hftok_next_special(t, o->text, o->len, at, &b, &e, &found));
    if (found >= 0 && b == at && !in_data(b, e, o)) {
        *end = e;
        *id = found;
    }
    return FSDP_STATUS_OK;
}

/* Encode text[b, e) (no special token of the template in it) and append its tokens with
 * their flags: trained where a token overlaps a range. When the tokens' bytes are not the
 * text's (a normalizer changed them) and `whole`, the stretch is encoded again in pieces
 * cut at the ranges' ends, each piece then trained or not as a whole. */
static fsdp_status put_stretch(fsdp_hftok *t, const char *text, size_t b, size_t e,
                               const range *r, int nr, bool whole, fsdp_ids *ids,
                               fsdp_flags *trained)
{
    if (b >= e)
        return FSDP_STATUS_OK;
    int *enc = NULL;
    size_t k = 0;
    FSDP_TRY(fsdp_hftok_encode(t, text + b, e - b, FSDP_HFTOK_SPLIT_SPECIAL, &enc, &k));
    size_t total = 0;
    for (size_t i = 0; i < k; i++) {
        size_t len = 0;
        fsdp_hftok_token_bytes(t, enc[i], &len);
        total += len;
    }
    fsdp_status st = FSDP_STATUS_OK;
    bool offsets = total == e - b;
    if (!offsets && whole) {
        free(enc);
        for (size_t cut = b; cut < e && st == FSDP_STATUS_OK;) {
            size_t next = e;
            for (int i = 0; i < nr; i++) {
                if (r[i].b > cut && r[i].b < next)
                    next = r[i].b;
                if (r[i].e > cut && r[i].e < next)
                    next = r[i].e;
            }
            st = put_stretch(t, text, cut, next, r, nr, false, ids, trained);
            cut = next;
        }
        return st;
    }
    st = fsdp_ids_append(ids, enc, k);
    size_t at = b;
    for (size_t i = 0; i < k && st == FSDP_STATUS_OK; i++) {
        size_t len = 0;
        fsdp_hftok_token_bytes(t, enc[i], &len);
        bool on = offsets ? overlaps(at, at + len, r, nr) : overlaps(b, e, r, nr);
        st = fsdp_flags_fill(trained, on, 1);
        at += len;
    }
    free(enc);
    return st;
}

static int cmp_range(const void *a, const void *b)
{
    const range *x = a, *y = b;
    return (x->b > y->b) - (x->b < y->b);
}

/* The trained ranges: each assistant content through its end of turn. */
static fsdp_status trained_ranges(const fsdp_chat_tpl *tp, fsdp_hftok *t,
                                  const fsdp_jinja_msg *msgs, int n, const fsdp_jinja_output *o,
                                  range *r, int *nr)
{
    *nr = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(msgs[i].role, "assistant"))
            continue;
        size_t b = SIZE_MAX, e = 0;
        for (int s = 0; s < o->n_spans; s++)
            if (o->spans[s].msg == i) {
                b = o->spans[s].begin < b ? o->spans[s].begin : b;
                e = o->spans[s].end > e ? o->spans[s].end : e;
            }
        if (b == SIZE_MAX) {
            bool blank = true;
            for (size_t k = 0; k < msgs[i].len && blank; k++)
                blank = isspace((unsigned char)msgs[i].content[k]);
            if (blank)
                continue; /* an empty content leaves nothing to find */
            return fsdp_error_set(FSDP_STATUS_FORMAT, "%s did not put the content of message "
                                  "%d (assistant) in its text as it is (it dropped or "
                                  "transformed it), so the loss cannot find it; pass "
                                  "--chat-format with a built-in format", tp->jinja ?
                                  fsdp_chat_tpl_describe(tp) : "the chat template", i);
        }
        size_t end;
        int id;
        FSDP_TRY(special_after(t, o, e, &end, &id));
        r[(*nr)++] = (range){b, id >= 0 ? end : e};
    }
    qsort(r, (size_t)*nr, sizeof *r, cmp_range);
    return FSDP_STATUS_OK;
}

fsdp_status fsdp_chat_tpl_encode(const fsdp_chat_tpl *tp, fsdp_hftok *t,
                                 const fsdp_jinja_msg *msgs, int n, bool add_generation_prompt,
                                 fsdp_ids *ids, fsdp_flags *trained, uint64_t *n_special)
{
    fsdp_jinja_input in = {.msgs = msgs, .n_msgs = n, .bos_token = tp->bos,
                           .eos_token = tp->eos, .add_generation_prompt = add_generation_prompt,
                           .year = tp->year, .month = tp->month, .day = tp->day};
    fsdp_jinja_output o;
    FSDP_TRY(fsdp_jinja_render(tp->jinja, &in, &o));
    range *r = malloc(((size_t)n + 1) * sizeof *r);
    int nr = 0;
    fsdp_status st = r ? trained_ranges(tp, t, msgs, n, &o, r, &nr)
                       : fsdp_error_set(FSDP_STATUS_OOM, "out of host memory rendering a chat");
    for (int s = 0; s < o.n_spans && st == FSDP_STATUS_OK && n_special; s++)
        st = fsdp_chat_count_special(t, o.text + o.spans[s].begin,
                                     o.spans[s].end - o.spans[s].begin, n_special);
    size_t pos = 0, from = 0;
    while (st == FSDP_STATUS_OK) {
        size_t b = o.len, e = o.len;
        int id = -1;
        if (from < o.len && (st = fsdp_hftok_next_special(t, o.text, o.len, from, &b, &e,
                                                          &id)) != FSDP_STATUS_OK)
            break;
        if (id >= 0 && in_data(b, e, &o)) { /* special-token text in a content: text */
            from = b + 1;
            continue;
        }
        st = put_stretch(t, o.text, pos, id >= 0 ? b : o.len, r, nr, true, ids, trained);
        if (id < 0 || st != FSDP_STATUS_OK)
            break;
        if ((st = fsdp_ids_append(ids, &id, 1)) == FSDP_STATUS_OK)
            st = fsdp_flags_fill(trained, overlaps(b, e, r, nr), 1);
        pos = from = e;
    }
    free(r);
    fsdp_jinja_output_free(&o);
    return st;
}

int fsdp_chat_tpl_end_of_turn(const fsdp_chat_tpl *tp, fsdp_hftok *t)
{
    const fsdp_jinja_msg probe[2] = {{"user", "Hi", 2}, {"assistant", "Hello", 5}};
    fsdp_jinja_input in = {.msgs = probe, .n_msgs = 2, .bos_token = tp->bos,
                           .eos_token = tp->eos, .year = tp->year, .month = tp->month,
                           .day = tp->day};
    fsdp_jinja_output o;
    if (fsdp_jinja_render(tp->jinja, &in, &o) != FSDP_STATUS_OK)
        return -1;
    int id = -1;
    size_t end;
    for (int s = 0; s < o.n_spans && id < 0; s++)
        if (o.spans[s].msg == 1 && special_after(t, &o, o.spans[s].end, &end, &id) !=
                                       FSDP_STATUS_OK)
            id = -1;
    fsdp_jinja_output_free(&o);
    return id;
}
