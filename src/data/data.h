/*
 * data.h - training data: llm.c token shards, text (bytes, or tokenized
 * with a tokenizer.json), .jsonl rows (documents, prompt/completion
 * examples, chat conversations), and the built-in synthetic task.
 *
 * A data source is opened once and then read-only, so every rank thread may
 * call fsdp_data_batch() concurrently. Micro-batches are numbered globally
 * (docs/determinism.md: rank r takes micro-batches r, r+N, r+2N, ...); micro-batch m is a
 * pure function of (source, seed, m, B, T), so the global batch does not
 * depend on the number of devices.
 *
 * Two shapes of source:
 * - streams (shards, text, {"text"} rows, the synthetic task): one long
 *   token sequence cut into consecutive rows (data.c); every target is a
 *   real next token. Tokenized documents are separated by the tokenizer's
 *   BOS (Llama 3: <|begin_of_text|>) or, when it adds none, its
 *   end-of-text token (GPT-2, Qwen2: <|endoftext|>), put before each
 *   document as llm.c does.
 * - examples (prompt/completion and messages rows): as opened, padded, one
 *   example per batch row (attention never crosses examples). Row r of
 *   micro-batch m is example k = m*B + r of an endless sequence of epochs,
 *   each a permutation of the rows keyed by (seed, epoch); an example
 *   longer than T+1 tokens keeps its first T+1. Targets of prompt, header
 *   and padding positions are -1 (fsdp_data_masked): the loss must skip
 *   them and average over the targets that are not -1; a row may have
 *   none.
 * - packed examples (after fsdp_data_pack(d, T)): several examples per
 *   row of T, each starting at position 0 again (fsdp_data_batch_pos),
 *   so a model whose attention takes positions keeps them apart; the rows
 *   are fixed once and each epoch visits them in a permutation keyed by
 *   (seed, epoch) (examples.c).
 */
#ifndef FSDP_DATA_DATA_H
#define FSDP_DATA_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "fsdp/fsdp.h"

typedef struct fsdp_data fsdp_data;

/* spec: "synthetic", a path ending in ".txt" (bytes, vocab 256), or a path
 * or glob of llm.c token shards ("data/train_*.bin"). Files are validated
 * (magic 20240520, version 1, token count vs size, every token < vocab_size
 * when vocab_size > 0): a clear error names the file and the offset. */
fsdp_status fsdp_data_open(fsdp_data **out, const char *spec, int vocab_size, uint64_t seed);

typedef struct fsdp_data_opts {
    const char *spec;         /* as for fsdp_data_open, or FILE.jsonl */
    int vocab_size;           /* > 0: every token must be below it */
    uint64_t seed;            /* synthetic problems; the order of example rows */
    const char *tokenizer;    /* tokenizer.json: .txt and .jsonl are tokenized with it
                               * (NULL: .txt is bytes, .jsonl is refused); with shards it
                               * bounds their tokens by its vocabulary */
    const char *chat_format;  /* messages rows (chat.h): a built-in name or "template";
                               * NULL: the chat template beside the tokenizer, else the
                               * built-in format whose special tokens it has */
} fsdp_data_opts;

/* fsdp_data_open with a tokenizer and chat format. Bad rows are FORMAT
 * errors naming the file and line (jsonl.h). */
fsdp_status fsdp_data_open_opts(fsdp_data **out, const fsdp_data_opts *opts);

void fsdp_data_close(fsdp_data *d);

/* Vocabulary the data needs (256 for text and synthetic; for token shards,
 * 1 + the largest token seen). */
int fsdp_data_vocab(const fsdp_data *d);
/* Total tokens available (0 for the synthetic task: unbounded). */
uint64_t fsdp_data_n_tokens(const fsdp_data *d);

/* How {"messages"} rows were rendered, for the run header ("chat template of
 * DIR/tokenizer_config.json", "built-in chat format llama3 ..."), or "" when the
 * source has no such rows; corpus.c. */
const char *fsdp_data_chat(const fsdp_data *d);
/* The same as its --chat-format name ("template" or a built-in format's), or "". */
const char *fsdp_data_chat_format(const fsdp_data *d);

/* Special-token strings (the tokenizer's, e.g. "<|eot_id|>") found in the text of
 * .jsonl rows and kept as text; 0 for other sources. */
uint64_t fsdp_data_special_text(const fsdp_data *d);

/* True when targets can be -1 (example rows: loss on completions and
 * assistant turns only). */
bool fsdp_data_masked(const fsdp_data *d);

/* Example rows (0 for streams). */
uint64_t fsdp_data_n_examples(const fsdp_data *d);

/* With rows of T tokens: how many examples are longer than T+1 tokens
 * and get cut, and how many examples have no target left at all (their
 * trained tokens all fall past the cut). Both 0 for streams. */
void fsdp_data_truncated(const fsdp_data *d, int T, uint64_t *n_cut, uint64_t *n_no_target);

/* Fill micro-batch `index`: inputs[B*T] and targets[B*T] (targets =
 * inputs shifted by one; -1 where the loss must not look, on example
 * sources). Thread-safe. Files are read as they are now: one truncated
 * or rewritten since open is an IO or FORMAT error naming it, never a
 * crash. */
fsdp_status fsdp_data_batch(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                            int *targets);

/* Whether the files of d are as they were when opened: OK, or IO naming
 * the first one whose size or modification time changed (truncated,
 * emptied, rewritten). OK for sources held in memory. One fstat per file;
 * thread-safe. The trainer calls it between steps. */
fsdp_status fsdp_data_check(const fsdp_data *d);

/* fsdp_data_batch, and pos[B*T] (may be NULL): each input's position in its
 * example when d is packed (0 at every example's start and on padding), else
 * j at column j. A packed source's rows are only right with their
 * positions (the attention of a model that takes them keeps examples
 * apart), and only at the T it was packed for (INVALID_ARG otherwise). */
fsdp_status fsdp_data_batch_pos(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                                int *targets, int *pos);

/* ---- packing example rows --------------------------------------------------------------- */

/* Pack the examples of d into rows of T input positions, once, before any
 * thread reads d: the examples in a permutation keyed by the seed, each
 * taking min(len - 1, T) positions (its last token is only a target; an
 * example of one token has nothing to train and is left out), greedily
 * appended to the current row while they fit, else starting the next.
 * INVALID_ARG for a source that is not example rows or has no example of
 * two tokens. Calling it again repacks for another T. */
fsdp_status fsdp_data_pack(fsdp_data *d, int T);

/* Read example rows once: micro-batch rows past the first epoch's last row (an example,
 * or a packed row) hold padding only, with no target, so ceil(rows / B) micro-batches
 * count every example exactly once, whatever B (a held-out set: train/heldout.h). No
 * effect on streams. Before any thread reads d. */
void fsdp_data_set_one_pass(fsdp_data *d);

/* Whether d is packed (fsdp_data_pack), and for which T (0: not packed). */
int fsdp_data_packed(const fsdp_data *d);

/* Tokens of the longest example (0 for streams). */
uint64_t fsdp_data_longest(const fsdp_data *d);

/* One epoch of d in batch rows of T: how many rows and how many of their
 * n_rows * T input positions hold data (the rest is padding). Streams: the
 * rows of T the tokens fill (0 for the synthetic task), all real. */
typedef struct fsdp_data_layout {
    uint64_t n_rows;
    uint64_t n_real;
} fsdp_data_layout;
void fsdp_data_layout_get(const fsdp_data *d, int T, fsdp_data_layout *out);

/* Input positions of micro-batch `index` (B rows of T) that hold data, not
 * padding (B*T for streams): what tokens/s counts. Thread-safe. */
uint64_t fsdp_data_batch_real(const fsdp_data *d, uint64_t index, int B, int T);

/* One example per row (example rows not packed): the input positions the rows of
 * micro-batches [first, first + n) (B rows each) need, the longest of their examples'
 * (an example of len tokens takes min(len, T): its last token is an input too), at least
 * 1; T for streams and packed sources, whose rows are full. Columns past it hold padding
 * only (no target, after every real position), so rows cut to it give the same losses.
 * Over a step's micro-batches (its global batch: rows first*B .. (first+n)*B - 1) it does
 * not depend on how the step is split into devices, accumulation and B. Thread-safe. */
int fsdp_data_rows_len(const fsdp_data *d, uint64_t first, int n, int B, int T);

/* Synthetic task: held-out problem `index` (never produced by
 * fsdp_data_batch for the same seed): prompt (e.g. "123+456=") and expected
 * answer (e.g. "579\n"), NUL-terminated, each at most 64 bytes.
 * The format (synth.c): 3-digit zero-padded operands and the 4-digit sum
 * written least significant digit first, e.g. prompt "352+471=", answer
 * "3280\n" (823 reversed). The training stream is 14-byte blocks
 * "\n" + prompt + answer, so with T = 14 each row is one problem at the
 * positions the greedy evaluation uses; training operand digits are skewed
 * towards 0, held-out ones are uniform (synth.c says why). Micro-batch
 * numbering for every source: data.c. */
void fsdp_synth_problem(uint64_t seed, uint64_t index, char *prompt, char *answer);

/* The synthetic task's block: "\n" + prompt + answer, one problem (the
 * default --seq of a synthetic run, and the rows its evaluation decodes). */
#define FSDP_SYNTH_ROW 14

#endif /* FSDP_DATA_DATA_H */
