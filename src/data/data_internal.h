/*
 * data_internal.h - internal to src/data: the data source object behind
 * data.h's handle, shared by the file loaders (tokens.c), the tokenized
 * corpora (corpus.c), the example rows (examples.c), the synthetic task
 * (synth.c) and the batcher (data.c).
 *
 * Stream sources are a list of files read with pread (or one in-memory array
 * of tokenized text) viewed as one concatenated token sequence; the
 * synthetic task is an unbounded virtual sequence computed on demand;
 * example sources are rows of tokens with per-token loss flags. Nothing is
 * written after open, so any number of threads may read a source at once.
 */
#ifndef FSDP_DATA_DATA_INTERNAL_H
#define FSDP_DATA_DATA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "data/data.h"

typedef enum fsdp_data_kind {
    FSDP_DATA_SHARDS = 0, /* llm.c token shards: uint16 after a 1 KiB header */
    FSDP_DATA_TEXT,       /* a .txt file: one token per byte */
    FSDP_DATA_SYNTH,      /* the built-in synthetic task */
    FSDP_DATA_TOKENS,     /* .txt or {"text"} .jsonl tokenized at open: one in-memory file */
    FSDP_DATA_EXAMPLES,   /* prompt/completion or chat rows: one example per batch row */
} fsdp_data_kind;

typedef struct fsdp_data_file {
    char *path;
    int fd;                 /* read-only descriptor (pread), or -1 (in memory) */
    uint64_t bytes;         /* the file's size when opened */
    struct timespec mtime;  /* and its modification time */
    void *owned;            /* in-memory tokens (int32), freed at close; else NULL */
    uint64_t first_byte;    /* offset of the first token in the file */
    int token_bytes;        /* 1 (text), 2 or 4 (shards), 4 (in memory) */
    uint64_t n_tokens;
    uint64_t first;         /* index of the first token in the concatenation */
} fsdp_data_file;

/* Example rows: example i is tokens[start[i] .. start[i+1]); trained[j]
 * says whether token j is a target the loss uses. Once packed
 * (fsdp_data_pack, pack_T > 0), batch row r holds the examples
 * pack_order[pack_first[r] .. pack_first[r+1]) one after the other. */
typedef struct fsdp_examples {
    int *tokens;
    uint8_t *trained;
    uint64_t *start;        /* [n + 1] */
    uint64_t n;
    int pad;                /* input id at padded positions */
    int pack_T;             /* the row length packed for, or 0: one example per row */
    uint64_t n_rows;        /* packed rows */
    uint64_t *pack_order;   /* [<= n] examples in packing order (those with a target slot) */
    uint64_t *pack_first;   /* [n_rows + 1] */
    bool one_pass;          /* rows past the first epoch are padding (fsdp_data_set_one_pass) */
} fsdp_examples;

struct fsdp_data {
    fsdp_data_kind kind;
    uint64_t seed;
    int vocab;              /* what fsdp_data_vocab() returns */
    int n_files;
    fsdp_data_file *files;  /* sorted by path; files[i].first ascending */
    uint64_t n_tokens;      /* sum over files or examples; 0 for the synthetic task */
    fsdp_examples ex;       /* FSDP_DATA_EXAMPLES */
    char chat[320];         /* how chat rows were rendered (fsdp_data_chat), or "" */
    char chat_format[16];   /* its --chat-format name (fsdp_data_chat_format), or "" */
    uint64_t n_special_text; /* special-token strings kept as text (tokenized sources) */
};

/* Map and validate the files of `spec` (a path or a glob of token shards, or
 * a .txt path when kind is FSDP_DATA_TEXT) into d->files, d->n_tokens and
 * d->vocab. On failure the caller closes d (partially filled is fine). */
fsdp_status fsdp_data_files_open(fsdp_data *d, const char *spec, int vocab_size);
void fsdp_data_files_close(fsdp_data *d);

/* Make d one in-memory token sequence named `label`: takes ownership of
 * tokens[0..n) (malloc'd; freed at close, also on failure); sets
 * d->n_tokens and d->vocab (1 + the largest token). */
fsdp_status fsdp_data_files_adopt(fsdp_data *d, const char *label, int *tokens, uint64_t n);

/* Copy n tokens of the concatenated files starting at pos (< d->n_tokens)
 * into dst, wrapping around to token 0 after the last one. IO when a file
 * is shorter than it was at open, FORMAT when a token read is not below
 * d->vocab (the file changed while open), naming the file. */
fsdp_status fsdp_data_files_read(const fsdp_data *d, uint64_t pos, size_t n, int *dst);

/* OK, or IO naming the first file whose size or modification time is not
 * what it was at open. Cheap (one fstat per file); thread-safe. */
fsdp_status fsdp_data_files_check(const fsdp_data *d);

/* Open o->spec (a .txt or .jsonl file) through the tokenizer o->tokenizer
 * into d: a token stream (FSDP_DATA_TOKENS) or example rows
 * (FSDP_DATA_EXAMPLES); corpus.c. On failure the caller closes d. */
fsdp_status fsdp_data_corpus_open(fsdp_data *d, const fsdp_data_opts *o);

/* Fill micro-batch `index` of an example source (data.h; pos may be NULL);
 * examples.c. */
void fsdp_data_examples_batch(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                              int *targets, int *pos);
/* Input positions of micro-batch `index` that hold an example's token. */
uint64_t fsdp_data_examples_real(const fsdp_data *d, uint64_t index, int B, int T);
/* The input positions the rows of micro-batches [first, first + n) need (data.h's
 * fsdp_data_rows_len). */
int fsdp_data_examples_len(const fsdp_data *d, uint64_t first, int n, int B, int T);
/* Batch rows and real positions of one epoch (fsdp_data_layout). */
void fsdp_data_examples_layout(const fsdp_data *d, int T, uint64_t *n_rows, uint64_t *n_real);
void fsdp_data_examples_free(fsdp_examples *ex);

/* Synthetic task: byte at position pos of the training stream for seed
 * (an endless concatenation of problems; pos may be any 64-bit value). */
int fsdp_synth_stream_byte(uint64_t seed, uint64_t pos);

/* Fill n consecutive bytes of the training stream starting at pos (faster
 * than n calls of fsdp_synth_stream_byte: each problem is generated once). */
void fsdp_synth_stream_read(uint64_t seed, uint64_t pos, size_t n, int *dst);

/* Largest byte the synthetic task emits (the smallest vocabulary it needs
 * is this + 1). */
int fsdp_synth_max_byte(void);

#endif /* FSDP_DATA_DATA_INTERNAL_H */
