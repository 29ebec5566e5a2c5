/*
 * fuzz_jinja.c - libFuzzer target for chat templates (src/data/jinja.h): the
 * input is a template; whatever parses is rendered with a short
 * conversation under small step and memory budgets. A parse or render may
 * fail, never crash, and a rendering's content spans must lie inside its
 * text, in order, without overlapping. Seeds: the published templates and
 * the short ones of tests/fixtures/chat_templates.json
 * (tools/gen_fuzz_corpus.py).
 */
#include <string.h>

#include "data/jinja.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fsdp_jinja *t = NULL;
    if (fsdp_jinja_parse(&t, "fuzz", (const char *)data, size) != FSDP_STATUS_OK)
        return 0;
    const fsdp_jinja_msg msgs[] = {
        {"system", " Be brief. ", 11}, {"user", "What is 2+2? <|eot_id|>", 23},
        {"assistant", "4", 1}, {"user", "And \xc3\xa9?", 7}, {"assistant", "", 0},
    };
    for (int gen = 0; gen < 2; gen++) {
        fsdp_jinja_input in = {.msgs = msgs, .n_msgs = 5 - gen, .bos_token = "<s>",
                               .eos_token = "</s>", .add_generation_prompt = gen,
                               .year = 2024, .month = 2, .day = 29, .max_steps = 200000,
                               .max_bytes = (size_t)16 << 20};
        fsdp_jinja_output o;
        if (fsdp_jinja_render(t, &in, &o) != FSDP_STATUS_OK)
            continue;
        if (strlen(o.text) > o.len)
            abort();
        for (int i = 0; i < o.n_spans; i++)
            if (o.spans[i].begin >= o.spans[i].end || o.spans[i].end > o.len ||
                o.spans[i].msg < 0 || o.spans[i].msg >= in.n_msgs ||
                (i && o.spans[i].begin < o.spans[i - 1].end))
                abort(); /* a span outside the text, empty, or out of order */
        fsdp_jinja_output_free(&o);
    }
    fsdp_jinja_free(t);
    return 0;
}
