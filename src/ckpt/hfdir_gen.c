/*
 * hfdir_gen.c - the generation_config.json of a Hugging Face directory
 * that fsdp writes (hfdir.h): transformers' generate stops at its
 * eos_token_id, so it must list the token that ends an assistant's turn in
 * the chat format the model was trained with (<|eot_id|>, <|im_end|>).
 *
 * The model's own file (a companion) is kept, byte for byte, when it
 * already lists that token; a base model's, which lists only the end of
 * text, gets it appended (the file re-written in its own key order, two
 * spaces of indent, as transformers writes it). Without one, a file is
 * written from the tokenizer's ids. Assumes the ids were found by the
 * caller (fsdp_modelfile_generation): this layer reads no tokenizer.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/hfdir.h"
#include "core/fileio.h"
#include "core/json.h"

#define GEN_MAX_BYTES ((size_t)1 << 20)

/* A number as JSON: an integer without a fraction, else the shortest
 * %g that reads back as the same double. */
static void put_number(FILE *f, double x)
{
    if (x == floor(x) && fabs(x) < 9007199254740992.0) {
        fprintf(f, "%.0f", x);
        return;
    }
    char b[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(b, sizeof b, "%.*g", p, x);
        if (strtod(b, NULL) == x)
            break;
    }
    fputs(b, f);
}

/* v as JSON indented by two spaces per level (json.dumps(indent=2)). */
static void put_value(FILE *f, const fsdp_json *v, int depth)
{
    switch (v->type) {
    case FSDP_JSON_NULL: fputs("null", f); return;
    case FSDP_JSON_BOOL: fputs(v->boolean ? "true" : "false", f); return;
    case FSDP_JSON_NUMBER: put_number(f, v->number); return;
    case FSDP_JSON_STRING: fsdp_json_write_str(f, v->str); return;
    default: break;
    }
    bool obj = v->type == FSDP_JSON_OBJECT;
    if (!v->child) {
        fputs(obj ? "{}" : "[]", f);
        return;
    }
    fputc(obj ? '{' : '[', f);
    for (const fsdp_json *c = v->child; c; c = c->next) {
        fprintf(f, "\n%*s", 2 * (depth + 1), "");
        if (obj) {
            fsdp_json_write_str(f, c->key);
            fputs(": ", f);
        }
        put_value(f, c, depth + 1);
        if (c->next)
            fputc(',', f);
    }
    fprintf(f, "\n%*s%c", 2 * depth, "", obj ? '}' : ']');
}

/* The eos ids an eos_token_id member lists (a number or an array of
 * numbers) into ids; false when it is something else. */
static bool eos_ids(const fsdp_json *eos, int *ids, int *n, int max)
{
    *n = 0;
    if (!eos || eos->type == FSDP_JSON_NULL)
        return true;
    if (eos->type == FSDP_JSON_NUMBER) {
        ids[(*n)++] = (int)eos->number;
        return true;
    }
    if (eos->type != FSDP_JSON_ARRAY)
        return false;
    for (const fsdp_json *c = eos->child; c; c = c->next) {
        if (c->type != FSDP_JSON_NUMBER || *n == max)
            return false;
        ids[(*n)++] = (int)c->number;
    }
    return true;
}

/* A fresh file from g, keys sorted. */
static void put_fresh(FILE *f, const fsdp_modelfile_generation *g)
{
    const char *sep = "{\n";
    if (g->bos_token_id >= 0) {
        fprintf(f, "%s  \"bos_token_id\": %d", sep, g->bos_token_id);
        sep = ",\n";
    }
    if (g->n_eos == 1)
        fprintf(f, "%s  \"eos_token_id\": %d", sep, g->eos_token_id[0]);
    if (g->n_eos > 1) {
        fprintf(f, "%s  \"eos_token_id\": [", sep);
        for (int i = 0; i < g->n_eos; i++)
            fprintf(f, "%s\n    %d", i ? "," : "", g->eos_token_id[i]);
        fputs("\n  ]", f);
    }
    if (g->n_eos > 0)
        sep = ",\n";
    if (g->pad_token_id >= 0)
        fprintf(f, "%s  \"pad_token_id\": %d", sep, g->pad_token_id);
    fputs(sep[0] == '{' ? "{}\n" : "\n}\n", f);
}

/* The companion's object with g's end of turn appended to eos_token_id
 * (the member added last when there is none). */
static void put_edited(FILE *f, fsdp_json *obj, const int *ids, int n, int turn)
{
    fputc('{', f);
    bool had = false;
    for (const fsdp_json *c = obj->child; c; c = c->next) {
        fprintf(f, "\n  ");
        fsdp_json_write_str(f, c->key);
        fputs(": ", f);
        if (strcmp(c->key, "eos_token_id")) {
            put_value(f, c, 1);
        } else {
            had = true;
            fputc('[', f);
            for (int i = 0; i < n; i++)
                fprintf(f, "\n    %d,", ids[i]);
            fprintf(f, "\n    %d\n  ]", turn);
        }
        if (c->next || !had)
            fputc(',', f);
    }
    if (!had)
        fprintf(f, "\n  \"eos_token_id\": %d", turn);
    fputs("\n}\n", f);
}

fsdp_status fsdp_hfdir_write_generation(const char *dir, const char *src,
                                        const fsdp_modelfile_generation *g, const char **what)
{
    char *text = NULL, *out = NULL;
    size_t n = 0, out_n = 0;
    fsdp_json *obj = NULL;
    int ids[16], n_ids = 0, turn = g->n_eos > 0 && g->end_of_turn >= 0 ? g->end_of_turn : -1;
    if (src)
        FSDP_TRY(fsdp_read_file(src, "generation config", GEN_MAX_BYTES, &text, &n));
    bool keep = src && (turn < 0 || fsdp_json_parse(text, n, &obj) != FSDP_STATUS_OK ||
                        obj->type != FSDP_JSON_OBJECT ||
                        !eos_ids(fsdp_json_get(obj, "eos_token_id"), ids, &n_ids, 15));
    for (int i = 0; !keep && src && i < n_ids; i++)
        keep = ids[i] == turn;
    FILE *f = keep ? NULL : open_memstream(&out, &out_n);
    fsdp_status st = FSDP_STATUS_OK;
    if (!keep && !f)
        st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for generation_config.json");
    if (f) {
        if (src)
            put_edited(f, obj, ids, n_ids, turn);
        else
            put_fresh(f, g);
        if (fclose(f) != 0)
            st = fsdp_error_set(FSDP_STATUS_OOM, "out of host memory for generation_config.json");
    }
    char p[FSDP_CKPT_PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    if (st == FSDP_STATUS_OK)
        st = fsdp_write_file_sync(p, keep ? text : out, keep ? n : out_n, "generation config");
    *what = keep ? "copied" : src ? "its end of turn added" : "written";
    fsdp_json_free(obj);
    free(text);
    free(out);
    return st;
}
