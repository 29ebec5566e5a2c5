/*
 * data.h - training data: llm.c token shards, byte-level text, and the
 * built-in synthetic task.
 *
 * A data source is opened once and then read-only, so every rank thread may
 * call fsdp_data_batch() concurrently. Micro-batches are numbered globally
 * (DESIGN: rank r takes micro-batches r, r+N, r+2N, ...); micro-batch m is a
 * pure function of (source, seed, m, B, T), so the global batch does not
 * depend on the number of devices.
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
void fsdp_data_close(fsdp_data *d);

/* Vocabulary the data needs (256 for text and synthetic; for token shards,
 * 1 + the largest token seen). */
int fsdp_data_vocab(const fsdp_data *d);
/* Total tokens available (0 for the synthetic task: unbounded). */
uint64_t fsdp_data_n_tokens(const fsdp_data *d);

/* Fill micro-batch `index`: inputs[B*T] and targets[B*T] (targets =
 * inputs shifted by one). Thread-safe. */
fsdp_status fsdp_data_batch(const fsdp_data *d, uint64_t index, int B, int T, int *inputs,
                            int *targets);

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

#endif /* FSDP_DATA_DATA_H */
