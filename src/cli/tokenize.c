/*
 * tokenize.c - `fsdp tokenize IN OUT.bin --tokenizer tokenizer.json`: a
 * text or .jsonl corpus into llm.c token shards (uint16 tokens when the
 * vocabulary fits, uint32 otherwise), so training maps tokens instead of
 * tokenizing them every run. The work is fsdp_tokenize_file (data/shard.h);
 * this prints progress on stderr (at most every two seconds) and a summary.
 */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "core/clock.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/shard.h"

typedef struct progress {
    bool quiet;
    fsdp_progress pg;
} progress;

static void on_progress(void *arg, size_t done, size_t total, uint64_t tokens)
{
    progress *p = arg;
    double elapsed;
    if (p->quiet || done >= total || !fsdp_progress_due(&p->pg, 2.0, &elapsed))
        return;
    fprintf(stderr, "tokenize: %5.1f%% of %.1f MB, %llu tokens, %.1f MB/s\n",
            total ? 100.0 * (double)done / (double)total : 100.0, (double)total / 1e6,
            (unsigned long long)tokens, (double)done / 1e6 / elapsed);
}

int fsdp_cli_tokenize(int argc, char **argv)
{
    fsdp_tokenize_opts o = {0};
    progress p = {0};
    uint64_t shard_tokens = 0;
    int n_formats;
    const fsdp_chat_format *formats = fsdp_chat_formats(&n_formats);
    char chat_help[512];
    int k = snprintf(chat_help, sizeof chat_help,
                     "messages rows: %s = the chat_template beside the tokenizer (the default "
                     "when there is one; else the built-in format whose special tokens the "
                     "tokenizer has):", FSDP_CHAT_TEMPLATE);
    for (int i = 0; i < n_formats && k < (int)sizeof chat_help; i++)
        k += snprintf(chat_help + k, sizeof chat_help - (size_t)k, "%s %s = %s", i ? ";" : "",
                      formats[i].name, formats[i].help);
    fsdp_opt opts[] = {
        {.name = "tokenizer", .type = FSDP_OPT_STR, .dst = &o.tokenizer,
         .metavar = "tokenizer.json",
         .help = "Hugging Face byte-level BPE tokenizer (GPT-2, Llama 3, Qwen2 families; "
                 "required)"},
        {.name = "format", .type = FSDP_OPT_STR, .dst = &o.format, .metavar = "text|jsonl",
         .help = "text: IN is one document; jsonl: one row per line, {\"text\"}, "
                 "{\"prompt\",\"completion\"} or {\"messages\"} (default: by IN's extension)"},
        {.name = "chat-format", .type = FSDP_OPT_STR, .dst = &o.chat_format, .metavar = "NAME",
         .help = chat_help},
        {.name = "shard-tokens", .type = FSDP_OPT_U64, .dst = &shard_tokens, .metavar = "N",
         .help = "split into OUT_000000.bin, OUT_000001.bin, ... of at most N tokens each "
                 "(default: one file; one file holds at most 2^31-1 tokens)"},
        {.name = "quiet", .type = FSDP_OPT_FLAG, .dst = &p.quiet, .metavar = "",
         .help = "print nothing on success"},
    };
    const char *pos[2];
    int n_pos = 0;
    int rc = fsdp_args_parse("tokenize",
                             "IN OUT.bin --tokenizer tokenizer.json [options]\n\n"
                             "Each document (the text file, or a {\"text\"} row) is preceded by "
                             "the tokenizer's BOS, or its\nend-of-text token when it has no BOS; "
                             "special tokens written in the text stay text.\nPrompt/completion "
                             "and messages rows are written as training renders them: shards "
                             "keep\nno loss masks (train on the .jsonl itself for loss on "
                             "completions only).",
                             opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, pos, 2, &n_pos);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if (n_pos != 2 || !o.tokenizer) {
        fprintf(stderr, "fsdp tokenize: need IN, OUT.bin and --tokenizer tokenizer.json\n");
        return 2;
    }
    o.in = pos[0];
    o.out = pos[1];
    o.shard_tokens = shard_tokens;
    if (!*o.out)
        return fsdp_cli_usage("tokenize", "OUT is empty: give the path of OUT.bin");
    char shards[4096]; /* what --shard-tokens writes and replaces: OUT_<6 digits or more>.bin */
    snprintf(shards, sizeof shards, "%.*s_[0-9][0-9][0-9][0-9][0-9][0-9]*.bin",
             (int)fsdp_tokenize_stem_len(o.out), o.out);
    const fsdp_path_arg ins[] = {{"IN", o.in, FSDP_PATH_FILE},
                                 {"--tokenizer", o.tokenizer, FSDP_PATH_FILE}};
    const fsdp_path_arg outs[] = {shard_tokens ? (fsdp_path_arg){"OUT", shards, FSDP_PATH_GLOB}
                                               : (fsdp_path_arg){"OUT", o.out, FSDP_PATH_FILE}};
    if ((rc = fsdp_cli_check_paths("tokenize", ins, 2, outs, 1)))
        return rc;
    o.progress = on_progress;
    o.arg = &p;
    p.pg = fsdp_progress_start();
    fsdp_tokenize_result res;
    fsdp_status st = fsdp_tokenize_file(&o, &res);
    if (st != FSDP_STATUS_OK) {
        fprintf(stderr, "fsdp tokenize: error: %s\n", fsdp_error_msg());
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    }
    double sec = fsdp_now_s() - p.pg.t0;
    char first[4096], last[4096];
    if (shard_tokens) {
        fsdp_tokenize_shard_path(o.out, 0, first, sizeof first);
        fsdp_tokenize_shard_path(o.out, res.n_shards - 1, last, sizeof last);
    }
    if (!p.quiet)
        printf("wrote %llu tokens (uint%d) from %llu document%s of %s (%.1f MB) to %d shard%s "
               "(%s%s%s) in %.1f s, %.2f MB/s\n",
               (unsigned long long)res.tokens, 8 * res.token_bytes,
               (unsigned long long)res.documents, res.documents == 1 ? "" : "s", o.in,
               (double)res.bytes / 1e6, res.n_shards, res.n_shards == 1 ? "" : "s",
               shard_tokens ? first : o.out, res.n_shards > 1 ? " .. " : "",
               res.n_shards > 1 ? last : "", sec, sec > 0 ? (double)res.bytes / 1e6 / sec : 0.0);
    if (res.n_removed) { /* even with --quiet: files the user had are gone */
        fsdp_tokenize_shard_path(o.out, res.removed_lo, first, sizeof first);
        fsdp_tokenize_shard_path(o.out, res.removed_hi, last, sizeof last);
        fprintf(stderr, "fsdp tokenize: removed %d shard%s of an earlier run (%s%s%s), which "
                "'%.*s_*.bin' would also have read\n", res.n_removed,
                res.n_removed == 1 ? "" : "s", first, res.n_removed > 1 ? " .. " : "",
                res.n_removed > 1 ? last : "", (int)fsdp_tokenize_stem_len(o.out), o.out);
    }
    if (!p.quiet && res.chat[0])
        printf("chat: %s\n", res.chat);
    if (!p.quiet && res.special_text)
        printf("%llu special-token strings in the text were kept as text\n",
               (unsigned long long)res.special_text);
    return fflush(stdout) == 0 ? 0 : 1;
}
