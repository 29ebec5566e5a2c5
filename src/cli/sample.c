/*
 * sample.c - `fsdp sample`: generate text from a model file, greedily or
 * with temperature sampling.
 *
 * How text becomes tokens, by what the model comes with:
 * - a Hugging Face tokenizer.json (--tokenizer, or the model directory's
 *   own, or the one a checkpoint carries): the prompt is encoded as
 *   transformers encodes it (with the tokenizer's BOS when it adds one)
 *   and the output decoded; generation stops at the end-of-text token.
 *   With --chat the prompt is a user message (after an optional --system
 *   one) rendered as training renders chats (data/chat.h: the model's own
 *   chat template, else a built-in format) with the generation prompt
 *   after it, and generation stops at the end of the assistant's turn.
 * - byte-level models (vocabulary 256): the prompt's bytes.
 * - llm.c's tokenizer file (gpt2_tokenizer.bin, --tokenizer): decoded
 *   output, and a prompt encoded by greedy longest match over its table
 *   (valid ids, not always the ids GPT-2's BPE would choose).
 * - nothing, or --ids: the prompt is a list of token ids and so is the
 *   output.
 * With no prompt, generation starts from a newline (byte-level), the BOS
 * or end-of-text token.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_tok.h"
#include "cli/cli.h"
#include "cli/infer_opts.h"
#include "ckpt/modelfile.h"
#include "core/fileio.h"
#include "core/utf8.h"
#include "data/chat.h"
#include "data/hftok.h"
#include "data/tokenizer.h"

typedef enum { TEXT_IDS = 0, TEXT_BYTES, TEXT_LLMC, TEXT_HF } text_kind;

/* How the prompt is read and the output printed. */
struct text_io {
    text_kind kind;
    fsdp_tokenizer *llmc;
    fsdp_hftok *hf;
    const char *tok_path;
    const int *stop; /* tokens that end the generation: not printed */
    int n_stop;
    int n;          /* tokens printed (ids: separators) */
    bool ids_asked; /* --ids: ids whatever tokenizer there is */
    fsdp_utf8_stream utf8; /* text: a character split across tokens waits here */
};

/* Text bytes to stdout as valid UTF-8 (utf8.h: what the tokenizers library's
 * decode shows); `end` closes a character left open as U+FFFD. */
static void print_text(struct text_io *io, const uint8_t *b, size_t len, bool end)
{
    uint8_t out[FSDP_UTF8_LOSSY_MAX(256)];
    do {
        size_t k = len < 256 ? len : 256;
        len -= k;
        fwrite(out, 1, fsdp_utf8_lossy(&io->utf8, b, k, end && len == 0, out), stdout);
        if (k)
            b += k; /* b is NULL at the end */
    } while (len > 0);
}

struct chat_opts {
    bool on;
    const char *system, *format;
};

/* Print one token as it is generated (rank 0's thread). */
static void print_token(void *arg, int id)
{
    struct text_io *io = arg;
    size_t len = 0;
    const uint8_t *b = NULL;
    for (int i = 0; i < io->n_stop; i++)
        if (id == io->stop[i])
            return;
    switch (io->kind) {
    case TEXT_BYTES: {
        uint8_t byte = (uint8_t)id;
        print_text(io, &byte, 1, false);
        break;
    }
    case TEXT_HF:
        b = fsdp_hftok_token_bytes(io->hf, id, &len);
        if (b)
            print_text(io, b, len, false);
        else
            printf("<%d>", id);
        break;
    case TEXT_LLMC:
        b = fsdp_tokenizer_decode(io->llmc, id, &len);
        if (!b)
            printf("<%d>", id);
        else if (!(len == 1 && b[0] < 0x20 && b[0] != '\n' && b[0] != '\t'))
            print_text(io, b, len, false); /* control bytes alone are dropped, as llm.c does */
        break;
    default: printf("%s%d", io->n ? " " : "", id); break;
    }
    io->n++;
    fflush(stdout);
}

/* "15496, 11 995" -> ids; false if it is not such a list. */
static bool parse_ids(const char *s, int **ids, int *n)
{
    size_t len = strlen(s);
    int *out = malloc((len / 2 + 2) * sizeof *out);
    int k = 0;
    if (!out)
        return false;
    while (*s) {
        while (*s == ' ' || *s == ',')
            s++;
        if (!*s)
            break;
        char *end = NULL;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > (1 << 30) || (*end && *end != ' ' && *end != ',')) {
            free(out);
            return false;
        }
        out[k++] = (int)v;
        s = end;
    }
    if (k == 0) {
        free(out);
        return false;
    }
    *ids = out;
    *n = k;
    return true;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* The tokenizer: --tokenizer, else the model directory's tokenizer.json or
 * the one a checkpoint carries (checked against its manifest), else bytes
 * (V = 256) or ids; ids whatever there is with --ids. */
static fsdp_status open_text_io(struct text_io *io, const char *tokenizer, const char *model,
                                int V, bool ids, char *found, size_t found_size)
{
    memset(io, 0, sizeof *io);
    io->ids_asked = ids;
    if (ids)
        return FSDP_STATUS_OK;
    bool has_own = false; /* a Hugging Face directory's or a checkpoint's */
    if (!tokenizer)
        FSDP_TRY(fsdp_ckpt_tok_for_model(model, found, found_size, &has_own));
    if (has_own)
        tokenizer = found;
    io->tok_path = tokenizer;
    if (tokenizer && has_suffix(tokenizer, ".json")) {
        FSDP_TRY(fsdp_hftok_open(&io->hf, tokenizer));
        io->kind = TEXT_HF;
        if (fsdp_hftok_vocab(io->hf) > V)
            return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "tokenizer '%s' has %d tokens but "
                                  "the model's vocabulary is %d: it is another model's "
                                  "tokenizer", tokenizer, fsdp_hftok_vocab(io->hf), V);
    } else if (V == 256) {
        io->kind = TEXT_BYTES; /* a tokenizer file is not needed (nor used) */
    } else if (tokenizer) {
        FSDP_TRY(fsdp_tokenizer_open(&io->llmc, tokenizer));
        io->kind = TEXT_LLMC;
        if (fsdp_tokenizer_vocab(io->llmc) < V)
            fprintf(stderr, "fsdp sample: warning: tokenizer '%s' has %d tokens, the model %d; "
                            "ids past the table print as <id>\n",
                    tokenizer, fsdp_tokenizer_vocab(io->llmc), V);
    }
    return FSDP_STATUS_OK;
}

static void close_text_io(struct text_io *io)
{
    fsdp_tokenizer_free(io->llmc);
    fsdp_hftok_free(io->hf);
}

/* The prompt as a chat: [system,] user, then the assistant's opening (the
 * generation prompt); the end of the turn (<|eot_id|>, <|im_end|>) stops
 * the generation. The renderer is the training one (data/chat.h): the
 * model's own template when its tokenizer has one. */
static fsdp_status encode_chat(struct text_io *io, const struct chat_opts *co, const char *prompt,
                               fsdp_ids *ids, int *stop, int *n_stop)
{
    fsdp_chat *chat = NULL;
    fsdp_chat_opts o = {.format = co->format, .tokenizer = io->tok_path};
    FSDP_TRY(fsdp_chat_open(&chat, io->hf, &o));
    char names[96];
    if (!chat)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG, "tokenizer '%s' has no chat template "
                              "beside it and the special tokens of no chat format fsdp knows "
                              "(%s)", io->tok_path, fsdp_chat_format_names(names, sizeof names,
                                                                           ", "));
    fsdp_chat_msg msgs[2];
    int n = 0;
    if (co->system)
        msgs[n++] = (fsdp_chat_msg){"system", co->system, strlen(co->system)};
    msgs[n++] = (fsdp_chat_msg){"user", prompt ? prompt : "", prompt ? strlen(prompt) : 0};
    fsdp_flags trained = {0};
    fsdp_status st = fsdp_chat_encode(chat, io->hf, msgs, n, true, ids, &trained, NULL);
    fsdp_flags_free(&trained);
    int eot = fsdp_chat_end_of_turn(chat, io->hf);
    if (eot >= 0)
        stop[(*n_stop)++] = eot;
    fsdp_chat_free(chat);
    return st;
}

/* The prompt's token ids into *ids (n >= 1), and the tokens that stop
 * the generation. INVALID_ARG for a prompt the model cannot take. */
static fsdp_status encode_prompt(struct text_io *io, const struct chat_opts *co,
                                 const char *prompt, int V, int **out, int *n_out, int *stop,
                                 int *n_stop)
{
    fsdp_ids ids = {0};
    fsdp_status st = FSDP_STATUS_OK;
    *n_stop = 0;
    if (io->kind == TEXT_HF) {
        int eot = fsdp_hftok_eot(io->hf), bos = fsdp_hftok_bos(io->hf);
        if (co->on) {
            st = encode_chat(io, co, prompt, &ids, stop, n_stop);
        } else {
            int *p = NULL;
            size_t np = 0;
            if (bos >= 0)
                st = fsdp_ids_append(&ids, &bos, 1);
            if (st == FSDP_STATUS_OK && prompt)
                st = fsdp_hftok_encode(io->hf, prompt, strlen(prompt), 0, &p, &np);
            if (st == FSDP_STATUS_OK)
                st = fsdp_ids_append(&ids, p, np);
            free(p);
        }
        if (eot >= 0 && (*n_stop == 0 || stop[0] != eot))
            stop[(*n_stop)++] = eot;
        if (st == FSDP_STATUS_OK && ids.n == 0 && eot >= 0)
            st = fsdp_ids_append(&ids, &eot, 1);
    } else if (prompt && io->kind == TEXT_BYTES) {
        for (const char *s = prompt; *s && st == FSDP_STATUS_OK; s++) {
            int b = (unsigned char)*s;
            st = fsdp_ids_append(&ids, &b, 1);
        }
    } else if (prompt && io->kind == TEXT_LLMC) {
        int *p = NULL, np = 0;
        st = fsdp_tokenizer_encode(io->llmc, prompt, &p, &np);
        if (st == FSDP_STATUS_OK)
            st = fsdp_ids_append(&ids, p, (size_t)np);
        free(p);
    } else if (prompt) {
        int *p = NULL, np = 0;
        if (!parse_ids(prompt, &p, &np))
            return io->ids_asked
                       ? fsdp_error_set(FSDP_STATUS_INVALID_ARG, "with --ids, --prompt must be "
                                        "token ids (integers from 0 to %d) such as "
                                        "'15496,11,995', not '%.40s'; leave --ids out to give "
                                        "text", V - 1, prompt)
                       : fsdp_error_set(FSDP_STATUS_INVALID_ARG, "the model's vocabulary has %d "
                                        "tokens and no tokenizer came with it, so --prompt must "
                                        "be token ids such as '15496,11,995'; pass --tokenizer "
                                        "(tokenizer.json or llm.c's gpt2_tokenizer.bin) to give "
                                        "text", V);
        st = fsdp_ids_append(&ids, p, (size_t)np);
        free(p);
    }
    if (st == FSDP_STATUS_OK && ids.n == 0) { /* no prompt: start from a separator */
        int start = io->kind == TEXT_BYTES                              ? '\n'
                    : io->llmc && fsdp_tokenizer_eot(io->llmc) >= 0 ? fsdp_tokenizer_eot(io->llmc)
                                                                    : V - 1;
        st = fsdp_ids_append(&ids, &start, 1);
    }
    for (size_t i = 0; i < ids.n && st == FSDP_STATUS_OK; i++)
        if (ids.p[i] < 0 || ids.p[i] >= V)
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "prompt token %d (at position %zu) is "
                                "outside the model's vocabulary of %d", ids.p[i], i, V);
    if (st != FSDP_STATUS_OK) {
        fsdp_ids_free(&ids);
        return st;
    }
    *out = ids.p;
    *n_out = (int)ids.n;
    return FSDP_STATUS_OK;
}

/* Write the logits rows of the generated tokens (fp32, raw) to path,
 * through the atomic writer: a failed write says why and leaves what was
 * at path. */
static fsdp_status write_logits(const char *path, const float *logits, int n, int V)
{
    fsdp_atomic_file af;
    FSDP_TRY(fsdp_atomic_open(&af, path, "logits file"));
    size_t k = (size_t)n * (size_t)V;
    bool ok = fwrite(logits, sizeof *logits, k, af.f) == k;
    return fsdp_atomic_commit(&af, ok);
}

/* sample's own options (beside the inference ones, infer_opts.h). */
struct sample_args {
    const char *prompt, *tokenizer, *logits_path;
    struct chat_opts co;
    bool ids_only;
    int n_tokens;
    float temperature;
    uint64_t seed;
};

/* Add sample's options to l, writing into *a (set to the defaults) and c. */
static void sample_opts_add(fsdp_opt_list *l, fsdp_infer_config *c, struct sample_args *a)
{
    *a = (struct sample_args){.n_tokens = 64, .temperature = 0.0f, .seed = 1337};
    c->seq = 0;
    fsdp_opt_add(l, "prompt", FSDP_OPT_STR, &a->prompt, "TEXT",
                 "text to continue (with a tokenizer, or a byte-level model); token ids such as "
                 "'15496,11' otherwise");
    fsdp_opt_add(
        l, "chat", FSDP_OPT_FLAG, &a->co.on, "",
        "the prompt is a user message: render it in the model's chat format and answer as the "
        "assistant, stopping at the end of the turn (needs a tokenizer.json)");
    fsdp_opt_add(l, "system", FSDP_OPT_STR, &a->co.system, "TEXT",
                 "with --chat: a system message first");
    static char chat_formats[96]; /* "template|llama3|chatml", from data/chat.c */
    fsdp_opt_add(
        l, "chat-format", FSDP_OPT_STR, &a->co.format,
        fsdp_chat_format_names(chat_formats, sizeof chat_formats, "|"),
        "with --chat: the format (default: a checkpoint's run's, else the chat_template "
        "beside the tokenizer, else the built-in format its special tokens fit)");
    fsdp_opt_add(l, "tokens", FSDP_OPT_INT, &a->n_tokens, "N",
                 "most tokens to generate (default 64)");
    fsdp_opt_add(l, "temperature", FSDP_OPT_FLOAT, &a->temperature, "X",
                 "0 = greedy (argmax); > 0 samples from softmax(logits / X) (default 0)");
    fsdp_opt_add(l, "seed", FSDP_OPT_U64, &a->seed, "S", "sampling seed (default 1337)");
    fsdp_opt_add(l, "tokenizer", FSDP_OPT_STR, &a->tokenizer, "FILE",
                 "tokenizer.json (Hugging Face; default: the model directory's, or the one a "
                 "checkpoint carries) or llm.c's gpt2_tokenizer.bin");
    fsdp_opt_add(
        l, "seq", FSDP_OPT_INT, &c->seq, "T",
        "context window: longer texts keep their last T tokens (default: the model's context)");
    fsdp_opt_add(l, "ids", FSDP_OPT_FLAG, &a->ids_only, "",
                 "--prompt is token ids and the output is ids, whatever tokenizer there is");
    fsdp_opt_add(
        l, "logits", FSDP_OPT_STR, &a->logits_path, "FILE",
        "also write the fp32 logits each generated token was chosen from (tokens x vocab, raw)");
}

/* Echo the prompt before the continuation: its text (not a chat
 * template's rendering), or its ids when the output is ids (counted in
 * io->n). */
static void echo_prompt(struct text_io *io, bool chat, const char *prompt, const int *ids,
                        int n_ids)
{
    if (prompt && io->kind != TEXT_IDS && !chat)
        fputs(prompt, stdout);
    else if (prompt && io->kind == TEXT_IDS)
        for (int i = 0; i < n_ids; i++)
            printf("%s%d", i ? " " : "", ids[i]), io->n++;
    fflush(stdout);
}

int fsdp_cli_sample(int argc, char **argv)
{
    fsdp_infer_opts io_opts;
    fsdp_opt_list l = {.n = 0};
    fsdp_infer_opts_table(&io_opts, &l);
    fsdp_infer_config *c = &io_opts.cfg;
    struct sample_args args;
    sample_opts_add(&l, c, &args);
    int rc = fsdp_args_parse("sample", "--model DIR|FILE [--prompt TEXT] [--chat] [options]", l.v,
                             l.n, argc, argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if ((rc = fsdp_infer_opts_finish("sample", &io_opts)))
        return rc;
    const char *prompt = args.prompt, *tokenizer = args.tokenizer, *logits_path = args.logits_path;
    struct chat_opts co = args.co;
    bool ids_only = args.ids_only;
    int n_tokens = args.n_tokens;
    float temperature = args.temperature;
    uint64_t seed = args.seed;
    const fsdp_path_arg ins[] = {{"--model", c->model_path, FSDP_PATH_TREE},
                                 {"--tokenizer", tokenizer, FSDP_PATH_FILE}};
    const fsdp_path_arg outs[] = {{"--logits", logits_path, FSDP_PATH_FILE}};
    if ((rc = fsdp_cli_check_paths("sample", ins, 2, outs, 1)))
        return rc;
    if (n_tokens < 0 || !(temperature >= 0.0f) || c->seq < 0)
        return fsdp_cli_usage("sample", "need --tokens >= 0, --temperature >= 0 and --seq >= 1");
    if (co.format && fsdp_chat_check_name(co.format) != FSDP_STATUS_OK)
        return fsdp_cli_status("sample", FSDP_STATUS_INVALID_ARG);
    if ((co.system || co.format) && !co.on)
        return fsdp_cli_usage("sample", "--system and --chat-format apply with --chat");
    fsdp_ckpt_run run; /* --chat on a checkpoint: its run's --chat-format */
    if (co.on && !co.format) {
        fsdp_status cst = fsdp_ckpt_run_find(c->model_path, &run);
        if (cst != FSDP_STATUS_OK)
            return fsdp_cli_status("sample", cst);
        co.format = run.chat_format[0] ? run.chat_format : NULL;
    }
    struct text_io io = {0};
    int *ids = NULL, *out = NULL, n_ids = 0, n_out = 0, stop[4], n_stop = 0;
    float *logits = NULL;
    char found[4096];
    fsdp_model m; /* its vocabulary decides how the prompt is read */
    fsdp_status st = fsdp_modelfile_resolve(c->model_path, &m, NULL);
    if (st != FSDP_STATUS_OK)
        goto fail;
    int V = m.vocab_size, maxT = m.max_seq_len;
    fsdp_model_free(&m);
    if (c->seq > maxT) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--seq %d is longer than the model's "
                            "context of %d", c->seq, maxT);
        goto fail;
    }
    if ((st = open_text_io(&io, tokenizer, c->model_path, V, ids_only, found, sizeof found)) !=
        FSDP_STATUS_OK)
        goto fail;
    if (co.on && io.kind != TEXT_HF) {
        st = fsdp_error_set(FSDP_STATUS_INVALID_ARG, "--chat needs a Hugging Face tokenizer "
                            "(tokenizer.json: --tokenizer, or a model directory that has one)");
        goto fail;
    }
    if ((st = encode_prompt(&io, &co, prompt, V, &ids, &n_ids, stop, &n_stop)) != FSDP_STATUS_OK)
        goto fail;
    out = malloc(((size_t)n_tokens + 1) * sizeof *out);
    if (logits_path)
        logits = malloc(((size_t)n_tokens + 1) * (size_t)V * sizeof *logits);
    if (!out || (logits_path && !logits)) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of memory");
        goto fail;
    }
    /* echo the prompt, then stream the continuation */
    echo_prompt(&io, co.on, prompt, ids, n_ids);
    io.stop = stop;
    io.n_stop = n_stop;
    fsdp_sample_config sc = {.prompt = ids, .n_prompt = n_ids, .n_tokens = n_tokens,
                             .temperature = temperature, .seed = seed, .stop = stop,
                             .n_stop = n_stop, .on_token = print_token, .arg = &io,
                             .logits = logits};
    st = fsdp_infer_sample(c, &sc, out, &n_out);
    if (io.kind != TEXT_IDS)
        print_text(&io, NULL, 0, true); /* a character the last token left open */
    putchar('\n');
    if (st == FSDP_STATUS_OK && logits_path)
        st = write_logits(logits_path, logits, n_out, V);
fail:
    close_text_io(&io);
    free(ids);
    free(out);
    free(logits);
    if (st != FSDP_STATUS_OK)
        return fsdp_cli_status("sample", st);
    return fflush(stdout) == 0 ? 0 : 1;
}
