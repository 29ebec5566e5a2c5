/*
 * sample.c - `fsdp sample`: generate tokens from a model file, greedily or
 * with temperature sampling.
 *
 * Byte-level models (vocabulary 256) take the prompt as text and print
 * text. Other vocabularies have no encoder here: without --tokenizer the
 * prompt is a list of token ids and the output is token ids; with llm.c's
 * tokenizer file (gpt2_tokenizer.bin) the output is decoded text and a
 * text prompt is encoded by greedy longest match over the tokenizer's
 * table (valid ids, though not always the ids GPT-2's BPE would choose).
 * With no prompt, generation starts from a newline (byte-level) or the
 * end-of-text token (the tokenizer's, else the last id of the vocabulary,
 * which is GPT-2's <|endoftext|>).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/infer_opts.h"
#include "ckpt/modelfile.h"
#include "data/tokenizer.h"

struct printer {
    const fsdp_tokenizer *tok;
    bool bytes;     /* byte-level model: print the byte */
    int n;
};

/* Print one token as it is generated (rank 0's thread). */
static void print_token(void *arg, int id)
{
    struct printer *p = arg;
    if (p->bytes) {
        putchar(id);
    } else if (p->tok) {
        size_t len = 0;
        const uint8_t *b = fsdp_tokenizer_decode(p->tok, id, &len);
        if (!b)
            printf("<%d>", id);
        else if (!(len == 1 && b[0] < 0x20 && b[0] != '\n' && b[0] != '\t'))
            fwrite(b, 1, len, stdout); /* control bytes alone are dropped, as llm.c does */
    } else {
        printf("%s%d", p->n ? " " : "", id);
    }
    p->n++;
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

int fsdp_cli_sample(int argc, char **argv)
{
    fsdp_infer_opts io;
    fsdp_opt opts[FSDP_INFER_OPTS_MAX];
    int n = fsdp_infer_opts_table(&io, opts);
    fsdp_infer_config *c = &io.cfg;
    const char *prompt = NULL, *tokenizer = NULL;
    int n_tokens = 64;
    float temperature = 0.0f;
    uint64_t seed = 1337;
    c->seq = 0;
#define OPT(name_, type_, dst_, meta_, help_) \
    opts[n++] = (fsdp_opt){.name = name_, .type = type_, .dst = dst_, .metavar = meta_, .help = help_}
    OPT("prompt", FSDP_OPT_STR, &prompt, "TEXT",
        "text to continue (byte-level models, or with --tokenizer); token ids such as "
        "'15496,11' otherwise");
    OPT("tokens", FSDP_OPT_INT, &n_tokens, "N", "tokens to generate (default 64)");
    OPT("temperature", FSDP_OPT_FLOAT, &temperature, "X",
        "0 = greedy (argmax); > 0 samples from softmax(logits / X) (default 0)");
    OPT("seed", FSDP_OPT_U64, &seed, "S", "sampling seed (default 1337)");
    OPT("tokenizer", FSDP_OPT_STR, &tokenizer, "FILE",
        "llm.c tokenizer file (gpt2_tokenizer.bin): print text for GPT-2 vocabularies");
    OPT("seq", FSDP_OPT_INT, &c->seq, "T",
        "context window: longer texts keep their last T tokens (default: the model's context)");
#undef OPT
    int rc = fsdp_args_parse("sample", "--model FILE [--prompt TEXT] [options]", opts, n, argc,
                             argv, NULL, 0, NULL);
    if (rc != FSDP_ARGS_OK)
        return rc;
    if ((rc = fsdp_infer_opts_finish("sample", &io)))
        return rc;
    if (n_tokens < 0 || !(temperature >= 0.0f) || c->seq < 0) {
        fprintf(stderr, "fsdp sample: need --tokens >= 0, --temperature >= 0 and --seq >= 1\n");
        return 2;
    }
    fsdp_tokenizer *tok = NULL;
    int *ids = NULL, *out = NULL, n_ids = 0;
    fsdp_model m; /* its vocabulary decides how the prompt is read */
    fsdp_status st = fsdp_modelfile_resolve(c->model_path, &m, NULL);
    if (st != FSDP_STATUS_OK)
        goto fail;
    int V = m.vocab_size, context = m.max_seq_len;
    fsdp_model_free(&m);
    if (c->seq > context) {
        fprintf(stderr, "fsdp sample: --seq %d is longer than the model's context of %d (%s)\n",
                c->seq, context, c->model_path);
        return 2;
    }
    bool bytes = V == 256;
    if (tokenizer && !bytes) {
        if ((st = fsdp_tokenizer_open(&tok, tokenizer)) != FSDP_STATUS_OK)
            goto fail;
        if (fsdp_tokenizer_vocab(tok) < V)
            fprintf(stderr, "fsdp sample: warning: tokenizer '%s' has %d tokens, the model %d; "
                            "ids past the table print as <id>\n",
                    tokenizer, fsdp_tokenizer_vocab(tok), V);
    }
    if (prompt && bytes) {
        n_ids = (int)strlen(prompt);
        ids = malloc(((size_t)n_ids + 1) * sizeof *ids);
        if (!ids) {
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < n_ids; i++)
            ids[i] = (unsigned char)prompt[i];
    } else if (prompt && tok) {
        if ((st = fsdp_tokenizer_encode(tok, prompt, &ids, &n_ids)) != FSDP_STATUS_OK)
            goto fail;
    } else if (prompt && !parse_ids(prompt, &ids, &n_ids)) {
        fprintf(stderr, "fsdp sample: the model's vocabulary has %d tokens, so --prompt must be "
                        "token ids such as '15496,11,995'; pass --tokenizer gpt2_tokenizer.bin "
                        "to give text\n", V);
        return 2;
    }
    if (n_ids == 0) {
        free(ids);
        ids = malloc(sizeof *ids);
        if (!ids) {
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of memory");
            goto fail;
        }
        ids[0] = bytes ? '\n' : tok && fsdp_tokenizer_eot(tok) >= 0 ? fsdp_tokenizer_eot(tok)
                                                                     : V - 1;
        n_ids = 1;
    }
    for (int i = 0; i < n_ids; i++) /* refused before anything is echoed */
        if (ids[i] < 0 || ids[i] >= V) {
            st = fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                                "prompt token %d (at position %d) is outside the model's "
                                "vocabulary of %d", ids[i], i, V);
            goto fail;
        }
    out = malloc(((size_t)n_tokens + 1) * sizeof *out);
    if (!out) {
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of memory");
        goto fail;
    }
    struct printer pr = {.tok = tok, .bytes = bytes};
    /* echo the prompt, then stream the continuation */
    if (prompt && (bytes || tok))
        fputs(prompt, stdout);
    else if (prompt)
        for (int i = 0; i < n_ids; i++)
            printf("%s%d", i ? " " : "", ids[i]), pr.n++;
    fflush(stdout);
    fsdp_sample_config sc = {.prompt = ids, .n_prompt = n_ids, .n_tokens = n_tokens,
                             .temperature = temperature, .seed = seed,
                             .on_token = print_token, .arg = &pr};
    st = fsdp_infer_sample(c, &sc, out);
    putchar('\n');
fail:
    if (st != FSDP_STATUS_OK)
        fprintf(stderr, "fsdp sample: error: %s\n", fsdp_error_msg());
    fsdp_tokenizer_free(tok);
    free(ids);
    free(out);
    if (st != FSDP_STATUS_OK)
        return st == FSDP_STATUS_INVALID_ARG ? 2 : 1;
    return fflush(stdout) == 0 ? 0 : 1;
}
