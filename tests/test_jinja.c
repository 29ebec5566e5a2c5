/*
 * test_jinja.c - chat templates: the Jinja subset (data/jinja.h) against
 * transformers' apply_chat_template, and the template renderer of
 * data/chat.h (loss masks, special-token text, where templates are found).
 *
 * The fixture, tests/fixtures/chat_templates.json, comes from
 * tools/gen_chat_template_fixture.py: the published chat templates of Llama
 * 3.1, Llama 3.2, Qwen2, Qwen2.5, Mistral v0.3, SmolLM2 and TinyLlama, eight
 * conversations (with and without a system message, several turns,
 * Unicode, whitespace that templates trim, special-token text inside
 * contents, a conversation a template refuses) rendered with and without
 * the generation prompt; where each assistant content landed; for four
 * templates the ids and trained flags with the small Llama 3 and Qwen2
 * tokenizers of the tokenizer fixtures; and short templates for the parts
 * of the language the model templates use lightly. Renderings must equal
 * the reference byte for byte. Runs from the repository root.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/json.h"
#include "data/chat.h"
#include "data/chat_template.h"
#include "data/jinja.h"
#include "testutil.h"

#define FIX "tests/fixtures/"

static fsdp_json *fixture(void)
{
    fsdp_json *e = NULL;
    fsdp_status st = fsdp_json_parse_file(FIX "chat_templates.json", &e);
    ck_assert_msg(st == FSDP_STATUS_OK, "%s (regenerate with tools/gen_chat_template_fixture.py)",
                  fsdp_error_msg());
    return e;
}

static const char *str(const fsdp_json *obj, const char *key)
{
    const fsdp_json *v = fsdp_json_get(obj, key);
    return v && v->type == FSDP_JSON_STRING ? v->str : NULL;
}

/* Conversation i of the fixture; *n messages (pointers into the fixture). */
static fsdp_chat_msg *conversation(const fsdp_json *fix, int i, int *n)
{
    const fsdp_json *conv = fsdp_json_at(fsdp_json_get(fix, "conversations"), (size_t)i);
    fsdp_chat_msg *m = calloc(conv->n + 1, sizeof *m);
    int k = 0;
    for (const fsdp_json *x = conv->child; x; x = x->next, k++) {
        const fsdp_json *c = fsdp_json_get(x, "content");
        m[k] = (fsdp_chat_msg){str(x, "role"), c->str, c->len};
    }
    *n = k;
    return m;
}

static const fsdp_json *template_of(const fsdp_json *fix, const char *name)
{
    for (const fsdp_json *t = fsdp_json_get(fix, "templates")->child; t; t = t->next)
        if (!strcmp(str(t, "name"), name))
            return t;
    ck_abort_msg("no template %s in the fixture", name);
    return NULL;
}

static void date_of(const fsdp_json *fix, int *y, int *m, int *d)
{
    const fsdp_json *date = fsdp_json_get(fix, "date");
    *y = (int)fsdp_json_at(date, 0)->number;
    *m = (int)fsdp_json_at(date, 1)->number;
    *d = (int)fsdp_json_at(date, 2)->number;
}

static fsdp_jinja *parse(const char *label, const char *src)
{
    fsdp_jinja *j = NULL;
    fsdp_status st = fsdp_jinja_parse(&j, label, src, strlen(src));
    ck_assert_msg(st == FSDP_STATUS_OK, "%s: %s", label, fsdp_error_msg());
    return j;
}

/* Where the first difference is, for the message. */
static size_t first_diff(const char *a, size_t na, const char *b, size_t nb)
{
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i])
        i++;
    return i;
}

static void assert_text(const char *what, const fsdp_jinja_output *o, const fsdp_json *want)
{
    size_t d = first_diff(o->text, o->len, want->str, want->len);
    ck_assert_msg(o->len == want->len && d == o->len,
                  "%s: %zu bytes, want %zu; first difference at %zu: got '%.60s' want '%.60s'",
                  what, o->len, want->len, d, o->text + d, want->str + (d < want->len ? d : 0));
}

/* Render j on `in` as the fixture's case c wants: its refusal (INVALID_ARG naming c's
 * "error"), or its "text". True, with o to free, when c wants text. */
static bool render_as_fixture(const char *what, fsdp_jinja *j, const fsdp_jinja_input *in,
                              const fsdp_json *c, fsdp_jinja_output *o)
{
    fsdp_status st = fsdp_jinja_render(j, in, o);
    if (str(c, "error")) {
        ck_assert_msg(st == FSDP_STATUS_INVALID_ARG && strstr(fsdp_error_msg(), str(c, "error")),
                      "%s: want the refusal '%s', got %d '%s'", what, str(c, "error"), st,
                      fsdp_error_msg());
        return false;
    }
    ck_assert_msg(st == FSDP_STATUS_OK, "%s: %s", what, fsdp_error_msg());
    assert_text(what, o, fsdp_json_get(c, "text"));
    return true;
}

/* ---- the model templates against the reference ------------------------------------ */

/* Case _i of the fixture: the same text (or the same refusal) and the same assistant
 * content spans. */
START_TEST(test_reference_cases)
{
    fsdp_json *fix = fixture();
    const fsdp_json *cases = fsdp_json_get(fix, "cases");
    for (const fsdp_json *c = cases->child; c; c = c->next) {
        const fsdp_json *tpl = template_of(fix, str(c, "template"));
        int ci = (int)fsdp_json_get(c, "conversation")->number, n;
        bool gen = fsdp_json_get(c, "add_generation_prompt")->boolean;
        fsdp_chat_msg *msgs = conversation(fix, ci, &n);
        char what[96];
        snprintf(what, sizeof what, "%s, conversation %d, generation prompt %d",
                 str(c, "template"), ci, gen);
        fsdp_jinja *j = parse(str(tpl, "name"), str(tpl, "template"));
        fsdp_jinja_input in = {.msgs = msgs, .n_msgs = n, .bos_token = str(tpl, "bos_token"),
                               .eos_token = str(tpl, "eos_token"), .add_generation_prompt = gen};
        date_of(fix, &in.year, &in.month, &in.day);
        fsdp_jinja_output o;
        if (render_as_fixture(what, j, &in, c, &o)) {
            const fsdp_json *spans = fsdp_json_get(c, "assistant_spans");
            const fsdp_json *want = spans->child;
            for (int m = 0; m < n; m++) {
                if (strcmp(msgs[m].role, "assistant"))
                    continue;
                size_t b = SIZE_MAX, e = 0;
                for (int s = 0; s < o.n_spans; s++)
                    if (o.spans[s].msg == m) {
                        b = o.spans[s].begin < b ? o.spans[s].begin : b;
                        e = o.spans[s].end > e ? o.spans[s].end : e;
                    }
                ck_assert_msg(want, "%s: more assistant messages than spans", what);
                ck_assert_msg(b == (size_t)fsdp_json_at(want, 0)->number &&
                                  e == (size_t)fsdp_json_at(want, 1)->number,
                              "%s: message %d's content at [%zu, %zu), want [%g, %g)", what, m,
                              b, e, fsdp_json_at(want, 0)->number, fsdp_json_at(want, 1)->number);
                want = want->next;
            }
            for (int s = 1; s < o.n_spans; s++)
                ck_assert_msg(o.spans[s].begin >= o.spans[s - 1].end, "%s: spans overlap", what);
            fsdp_jinja_output_free(&o);
        }
        fsdp_jinja_free(j);
        free(msgs);
    }
    fsdp_json_free(fix);
}
END_TEST

/* The short templates: text or refusal as jinja2 gives them. */
START_TEST(test_reference_snippets)
{
    fsdp_json *fix = fixture();
    int k = 0;
    for (const fsdp_json *s = fsdp_json_get(fix, "snippets")->child; s; s = s->next, k++) {
        int n;
        fsdp_chat_msg *msgs = conversation(fix, (int)fsdp_json_get(s, "conversation")->number,
                                           &n);
        char what[32];
        snprintf(what, sizeof what, "snippet %d", k);
        fsdp_jinja *j = parse(what, str(s, "template"));
        fsdp_jinja_input in = {.msgs = msgs, .n_msgs = n, .bos_token = "<s>", .eos_token = "</s>",
                               .year = 2024, .month = 1, .day = 1};
        fsdp_jinja_output o;
        if (render_as_fixture(what, j, &in, s, &o))
            fsdp_jinja_output_free(&o);
        fsdp_jinja_free(j);
        free(msgs);
    }
    fsdp_json_free(fix);
}
END_TEST

/* The renderer of chat.h on the tokenized cases: ids as the reference tokenizer gives
 * for the reference text, and the trained flags of the documented rule. */
START_TEST(test_reference_tokens)
{
    fsdp_json *fix = fixture();
    int checked = 0;
    int y, mo, d;
    date_of(fix, &y, &mo, &d);
    for (const fsdp_json *c = fsdp_json_get(fix, "cases")->child; c; c = c->next) {
        if (!fsdp_json_get(c, "ids"))
            continue;
        const fsdp_json *tpl = template_of(fix, str(c, "template"));
        char tok_path[128];
        snprintf(tok_path, sizeof tok_path, FIX "%s", str(c, "tokenizer"));
        fsdp_hftok *t = NULL;
        ck_assert_int_eq(fsdp_hftok_open(&t, tok_path), FSDP_STATUS_OK);
        const char *src = str(tpl, "template");
        fsdp_chat_tpl *tp = NULL;
        ck_assert_msg(fsdp_chat_tpl_parse(&tp, str(tpl, "name"), src, strlen(src),
                                          str(tpl, "bos_token"), str(tpl, "eos_token"), y, mo,
                                          d) == FSDP_STATUS_OK, "%s", fsdp_error_msg());
        int ci = (int)fsdp_json_get(c, "conversation")->number, n;
        bool gen = fsdp_json_get(c, "add_generation_prompt")->boolean;
        fsdp_chat_msg *msgs = conversation(fix, ci, &n);
        fsdp_ids ids = {0};
        fsdp_flags tr = {0};
        uint64_t special = 0;
        ck_assert_msg(fsdp_chat_tpl_encode(tp, t, msgs, n, gen, &ids, &tr, &special) ==
                          FSDP_STATUS_OK, "%s", fsdp_error_msg());
        const fsdp_json *want = fsdp_json_get(c, "ids"), *flags = fsdp_json_get(c, "trained");
        ck_assert_msg(ids.n == want->n && tr.n == ids.n, "%s conversation %d gen %d: %zu ids, "
                      "want %zu", str(c, "template"), ci, gen, ids.n, want->n);
        size_t i = 0;
        for (const fsdp_json *v = want->child, *f = flags->child; v; v = v->next, f = f->next,
                                                                      i++) {
            ck_assert_msg(ids.p[i] == (int)v->number, "%s conversation %d gen %d: id %zu is "
                          "%d, want %g", str(c, "template"), ci, gen, i, ids.p[i], v->number);
            ck_assert_msg(tr.p[i] == (int)f->number, "%s conversation %d gen %d: token %zu "
                          "(id %d) trained %d, want %g", str(c, "template"), ci, gen, i,
                          ids.p[i], tr.p[i], f->number);
        }
        ck_assert_uint_eq(special, 0);
        checked++;
        fsdp_ids_free(&ids);
        fsdp_flags_free(&tr);
        free(msgs);
        fsdp_chat_tpl_free(tp);
        fsdp_hftok_free(t);
    }
    ck_assert_int_ge(checked, 40);
    fsdp_json_free(fix);
}
END_TEST

/* Special-token text inside contents stays text, is counted, and a content cannot forge a
 * turn: Llama 3.1's template and tokenizer on conversation 4. */
START_TEST(test_special_text)
{
    fsdp_json *fix = fixture();
    const fsdp_json *tpl = template_of(fix, "llama3.1");
    fsdp_hftok *t = NULL;
    ck_assert_int_eq(fsdp_hftok_open(&t, FIX "tok_llama3.json"), FSDP_STATUS_OK);
    fsdp_chat_tpl *tp = NULL;
    const char *src = str(tpl, "template");
    ck_assert_int_eq(fsdp_chat_tpl_parse(&tp, "llama3.1", src, strlen(src), "<|begin_of_text|>",
                                         "<|eot_id|>", 2024, 9, 14), FSDP_STATUS_OK);
    int n;
    fsdp_chat_msg *msgs = conversation(fix, 4, &n);
    fsdp_ids ids = {0};
    fsdp_flags tr = {0};
    uint64_t special = 0;
    ck_assert_int_eq(fsdp_chat_tpl_encode(tp, t, msgs, n, false, &ids, &tr, &special),
                     FSDP_STATUS_OK);
    /* the user writes <|eot_id|>, the assistant <|start_header_id|>: both are specials of
     * this tokenizer; <|im_end|>, </s>, [INST] and <|im_start|> are not */
    ck_assert_uint_eq(special, 2);
    int eot = fsdp_hftok_added_id(t, "<|eot_id|>"), hdr = fsdp_hftok_added_id(t,
                                                                             "<|start_header_id|>");
    int n_eot = 0, n_hdr = 0;
    for (size_t i = 0; i < ids.n; i++)
        n_eot += ids.p[i] == eot, n_hdr += ids.p[i] == hdr;
    ck_assert_int_eq(n_eot, 3); /* system, user, assistant turns: none from the text */
    ck_assert_int_eq(n_hdr, 3);
    /* the trained tokens decode to the assistant's content and its <|eot_id|> */
    fsdp_ids kept = {0};
    for (size_t i = 0; i < ids.n; i++)
        if (tr.p[i])
            fsdp_ids_append(&kept, &ids.p[i], 1);
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(fsdp_hftok_decode(t, kept.p, kept.n, &text, &len), FSDP_STATUS_OK);
    char want[256];
    snprintf(want, sizeof want, "%.*s<|eot_id|>", (int)msgs[1].len, msgs[1].content);
    ck_assert_str_eq(text, want);
    free(text);
    fsdp_ids_free(&kept);
    fsdp_ids_free(&ids);
    fsdp_flags_free(&tr);
    free(msgs);
    fsdp_chat_tpl_free(tp);
    fsdp_hftok_free(t);
    fsdp_json_free(fix);
}
END_TEST

/* ---- errors and budgets ------------------------------------------------------------ */

static const struct {
    const char *src;
    fsdp_status st;
    const char *msg;          /* in the error */
    bool at_render;           /* parses, fails when rendered */
} BAD[] = {
    {"a\n{% macro m() %}x{% endmacro %}", FSDP_STATUS_UNSUPPORTED, "line 2: {% macro %} is not "
     "supported", false},
    {"{{ x | frobnicate }}", FSDP_STATUS_UNSUPPORTED, "line 1: the filter 'frobnicate'", false},
    {"{{ x is frobnicated }}", FSDP_STATUS_UNSUPPORTED, "the test 'frobnicated'", false},
    {"{{ 1.5 }}", FSDP_STATUS_UNSUPPORTED, "floating-point", false},
    {"{{ 3 / 2 }}", FSDP_STATUS_UNSUPPORTED, "'/'", false},
    {"\n\n{% if x %}yes", FSDP_STATUS_FORMAT, "line 3: this block is never closed", false},
    {"{% endif %}", FSDP_STATUS_FORMAT, "no block is open", false},
    {"{{ 'abc }}", FSDP_STATUS_FORMAT, "string literal is not closed", false},
    {"{{ (1 }}", FSDP_STATUS_FORMAT, "is not closed", false},
    {"{% for %}", FSDP_STATUS_FORMAT, "expected a name", false},
    {"{# open comment", FSDP_STATUS_FORMAT, "comment is not closed", false},
    {"{% set x %}y{% endset %}", FSDP_STATUS_UNSUPPORTED, "block assignments", false},
    {"{{ messages.x.y }}", FSDP_STATUS_FORMAT, "'.y' of an undefined value", true},
    {"{{ nothing + 1 }}", FSDP_STATUS_FORMAT, "undefined value", true},
    {"{{ 'a' + 1 }}", FSDP_STATUS_FORMAT, "cannot apply '+' to a string and a integer", true},
    {"\n{{ 'x'.zfill(3) }}", FSDP_STATUS_UNSUPPORTED, "line 2: the method string.zfill()", true},
    {"{{ 1 // 0 }}", FSDP_STATUS_FORMAT, "division by zero", true},
    {"{{ raise_exception('no system messages') }}", FSDP_STATUS_INVALID_ARG,
     "refused the conversation: no system messages", true},
    {"{% for i in range(1000000000) %}{% endfor %}", FSDP_STATUS_FORMAT, "steps", true},
    {"{% for a in range(9999) %}{% for b in range(9999) %}{{ loop.index }}{% endfor %}"
     "{% endfor %}", FSDP_STATUS_FORMAT, "steps", true},
    {"{% set ns = namespace(s='0123456789') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s "
     "%}{% endfor %}", FSDP_STATUS_FORMAT, "MiB", true},
    {"{{ 'x' * 4000000000 }}", FSDP_STATUS_FORMAT, "memory", true},
    {"{% set ns = namespace() %}{% set n.x = 1 %}", FSDP_STATUS_FORMAT, "not a namespace", true},
};

START_TEST(test_bad_templates)
{
    char label[32];
    snprintf(label, sizeof label, "bad%d", _i);
    fsdp_jinja *j = NULL;
    fsdp_status st = fsdp_jinja_parse(&j, label, BAD[_i].src, strlen(BAD[_i].src));
    if (BAD[_i].at_render) {
        ck_assert_msg(st == FSDP_STATUS_OK, "%s: %s", BAD[_i].src, fsdp_error_msg());
        fsdp_chat_msg m = {"user", "hi", 2};
        fsdp_jinja_input in = {.msgs = &m, .n_msgs = 1, .year = 2024, .month = 1, .day = 1,
                               .max_steps = 1000000, .max_bytes = (size_t)64 << 20};
        fsdp_jinja_output o;
        st = fsdp_jinja_render(j, &in, &o);
        ck_assert_ptr_null(o.text);
        fsdp_jinja_free(j);
    } else {
        ck_assert_ptr_null(j);
    }
    ck_assert_msg(st == BAD[_i].st && strstr(fsdp_error_msg(), BAD[_i].msg) &&
                      strstr(fsdp_error_msg(), label),
                  "%s: status %d, message '%s'; want %d with '%s'", BAD[_i].src, st,
                  fsdp_error_msg(), BAD[_i].st, BAD[_i].msg);
}
END_TEST

/* Deep nesting is an error, not a stack overflow. */
START_TEST(test_deep_nesting)
{
    size_t n = 100000;
    char *src = malloc(2 * n + 16);
    memcpy(src, "{{ ", 3);
    memset(src + 3, '(', n);
    src[3 + n] = '1';
    memset(src + 4 + n, ')', n);
    memcpy(src + 4 + 2 * n, " }}", 4);
    fsdp_jinja *j = NULL;
    ck_assert_int_eq(fsdp_jinja_parse(&j, "deep", src, strlen(src)), FSDP_STATUS_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "nesting"));
    size_t k = 0;
    for (size_t i = 0; i < 2000; i++)
        k += (size_t)sprintf(src + k, "{%% if x %%}");
    sprintf(src + k, "x");
    ck_assert_int_eq(fsdp_jinja_parse(&j, "deep", src, strlen(src)), FSDP_STATUS_UNSUPPORTED);
    free(src);
}
END_TEST

/* ---- finding the template -------------------------------------------------------- */

/* A model directory: tokenizer.json (the Qwen2 fixture) and tokenizer_config.json. */
static void model_dir(char *dir, size_t n, const char *name, const char *config)
{
    fsdp_test_mkdir(dir, n, name);
    char path[512];
    size_t len;
    char *tok = fsdp_test_read_file(FIX "tok_qwen2.json", &len);
    pathf(path, sizeof path, "%s/tokenizer.json", dir);
    fsdp_test_write_file(path, tok);
    free(tok);
    if (config) {
        pathf(path, sizeof path, "%s/tokenizer_config.json", dir);
        fsdp_test_write_file(path, config);
    }
}

static fsdp_status open_chat(const char *dir, const char *format, fsdp_chat **c)
{
    char path[512];
    pathf(path, sizeof path, "%s/tokenizer.json", dir);
    fsdp_hftok *t = NULL;
    ck_assert_int_eq(fsdp_hftok_open(&t, path), FSDP_STATUS_OK);
    fsdp_chat_opts o = {.format = format, .tokenizer = path, .year = 2024, .month = 9, .day = 14};
    fsdp_status st = fsdp_chat_open(c, t, &o);
    fsdp_hftok_free(t);
    return st;
}

START_TEST(test_template_files)
{
    char dir[512], path[600];
    fsdp_chat *c = NULL;
    /* a plain string template, with bos/eos as AddedToken objects */
    model_dir(dir, sizeof dir, "plain", "{\"chat_template\": \"{% for m in messages %}<|im_start|>"
              "{{ m.role }}\\n{{ m.content }}<|im_end|>\\n{% endfor %}\", \"bos_token\": null, "
              "\"eos_token\": {\"content\": \"<|im_end|>\", \"special\": true}}");
    ck_assert_int_eq(open_chat(dir, NULL, &c), FSDP_STATUS_OK);
    ck_assert_ptr_nonnull(strstr(fsdp_chat_describe(c), "chat template of"));
    ck_assert_ptr_nonnull(strstr(fsdp_chat_describe(c), "tokenizer_config.json"));
    ck_assert_ptr_null(fsdp_chat_builtin(c));
    fsdp_chat_free(c);
    /* --chat-format chatml overrides the template */
    ck_assert_int_eq(open_chat(dir, "chatml", &c), FSDP_STATUS_OK);
    ck_assert_str_eq(fsdp_chat_builtin(c)->name, "chatml");
    ck_assert_ptr_nonnull(strstr(fsdp_chat_describe(c), "built-in chat format chatml"));
    fsdp_chat_free(c);
    /* chat_template.jinja wins over tokenizer_config.json */
    pathf(path, sizeof path, "%s/chat_template.jinja", dir);
    fsdp_test_write_file(path, "{{ strftime_now('%d %b %Y') }}{{ messages[0].content }}\n");
    ck_assert_int_eq(open_chat(dir, FSDP_CHAT_TEMPLATE, &c), FSDP_STATUS_OK);
    ck_assert_ptr_nonnull(strstr(fsdp_chat_describe(c), "chat_template.jinja"));
    ck_assert_ptr_nonnull(strstr(fsdp_chat_describe(c), "strftime_now: 14 Sep 2024"));
    fsdp_chat_free(c);
    /* named templates: the default one */
    model_dir(dir, sizeof dir, "named", "{\"chat_template\": [{\"name\": \"tool_use\", "
              "\"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D{{ bos_token }}\"}],"
              " \"bos_token\": \"<|endoftext|>\"}");
    ck_assert_int_eq(open_chat(dir, NULL, &c), FSDP_STATUS_OK);
    pathf(path, sizeof path, "%s/tokenizer.json", dir);
    fsdp_hftok *t = NULL;
    ck_assert_int_eq(fsdp_hftok_open(&t, path), FSDP_STATUS_OK);
    fsdp_chat_msg m = {"user", "x", 1};
    fsdp_ids ids = {0};
    fsdp_flags tr = {0};
    ck_assert_int_eq(fsdp_chat_encode(c, t, &m, 1, false, &ids, &tr, NULL), FSDP_STATUS_OK);
    ck_assert_uint_eq(ids.n, 2); /* "D" and <|endoftext|> */
    ck_assert_int_eq(ids.p[1], fsdp_hftok_added_id(t, "<|endoftext|>"));
    fsdp_ids_free(&ids);
    fsdp_flags_free(&tr);
    fsdp_hftok_free(t);
    fsdp_chat_free(c);
    /* no template: the built-in format the tokenizer's specials fit, said so */
    model_dir(dir, sizeof dir, "none", "{\"eos_token\": \"<|im_end|>\"}");
    ck_assert_int_eq(open_chat(dir, NULL, &c), FSDP_STATUS_OK);
    ck_assert_str_eq(fsdp_chat_builtin(c)->name, "chatml");
    ck_assert_ptr_nonnull(strstr(fsdp_chat_describe(c), "no chat_template"));
    fsdp_chat_free(c);
    ck_assert_int_eq(open_chat(dir, FSDP_CHAT_TEMPLATE, &c), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "tokenizer_config.json"));
    ck_assert_int_eq(open_chat(dir, "vicuna", &c), FSDP_STATUS_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "template, llama3, chatml"));
    /* broken files are errors that name them */
    model_dir(dir, sizeof dir, "broken", "{\"chat_template\": 3}");
    ck_assert_int_eq(open_chat(dir, NULL, &c), FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "must be a string"));
    model_dir(dir, sizeof dir, "notjson", "{\"chat_template\": ");
    ck_assert_int_eq(open_chat(dir, NULL, &c), FSDP_STATUS_FORMAT);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "not valid JSON"));
    model_dir(dir, sizeof dir, "unsupported", "{\"chat_template\": \"{% macro x() %}{% endmacro "
              "%}\"}");
    ck_assert_int_eq(open_chat(dir, NULL, &c), FSDP_STATUS_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(fsdp_error_msg(), "tokenizer_config.json, line 1"));
}
END_TEST

/* The end of an assistant turn, for sample --chat: the template's own token. */
START_TEST(test_end_of_turn)
{
    fsdp_json *fix = fixture();
    static const struct { const char *tpl, *tok, *eot; } cases[] = {
        {"llama3.1", "tok_llama3.json", "<|eot_id|>"},
        {"llama3.2", "tok_llama3.json", "<|eot_id|>"},
        {"qwen2.5", "tok_qwen2.json", "<|im_end|>"},
        {"smollm2", "tok_qwen2.json", "<|im_end|>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const fsdp_json *tpl = template_of(fix, cases[i].tpl);
        char path[128];
        snprintf(path, sizeof path, FIX "%s", cases[i].tok);
        fsdp_hftok *t = NULL;
        ck_assert_int_eq(fsdp_hftok_open(&t, path), FSDP_STATUS_OK);
        fsdp_chat_tpl *tp = NULL;
        const char *src = str(tpl, "template");
        ck_assert_int_eq(fsdp_chat_tpl_parse(&tp, cases[i].tpl, src, strlen(src),
                                             str(tpl, "bos_token"), str(tpl, "eos_token"), 2024,
                                             9, 14), FSDP_STATUS_OK);
        ck_assert_int_eq(fsdp_chat_tpl_end_of_turn(tp, t), fsdp_hftok_added_id(t, cases[i].eot));
        fsdp_chat_tpl_free(tp);
        fsdp_hftok_free(t);
    }
    fsdp_json_free(fix);
}
END_TEST

int main(void)
{
    const fsdp_test_tcase tcases[] = {
        {"reference", 120,
         FSDP_TESTS(test_reference_cases, test_reference_snippets, test_reference_tokens,
                    test_special_text, test_end_of_turn)},
        {"errors", 60,
         FSDP_TESTS(FSDP_TEST_LOOP(test_bad_templates, (int)(sizeof BAD / sizeof *BAD)),
                    test_deep_nesting)},
        {"files", 60, .tmpdir = true, FSDP_TESTS(test_template_files)},
    };
    return fsdp_test_main("jinja", tcases, FSDP_TEST_LEN(tcases));
}
