/*
 * ckpt_tok.h - the tokenizer a checkpoint carries, so that `sample`,
 * `eval` and `convert` of a checkpoint find it without --tokenizer (and
 * what its run chose that they default to: the chat format it rendered
 * {"messages"} rows with, its --seq, --batch and --precision).
 *
 * A run that reads its data through a Hugging Face tokenizer.json (and
 * `convert` of a directory that has one into a checkpoint) copies that
 * file, as tokenizer.json, and the companions beside it (hfdir.h's list:
 * tokenizer_config.json with its chat_template, special_tokens_map.json,
 * generation_config.json, chat_template.jinja, ...) into every checkpoint
 * it writes:
 *
 *   CKPT/tokenizer.json, CKPT/tokenizer_config.json, ...
 *
 * and lists each in the manifest as `tokenizer_file <name> <bytes>
 * <XXH64>` (manifest.h; the manifest's own checksum covers those lines).
 * A reader that takes the checkpoint's tokenizer first checks every listed
 * file against its line, so a file edited or damaged since is refused, not
 * silently used to read or render other tokens. The files are read once,
 * when a run starts, and written from memory at each save: every
 * checkpoint of a run holds the same bytes, whatever happens to the
 * originals meanwhile.
 */
#ifndef FSDP_CKPT_CKPT_TOK_H
#define FSDP_CKPT_CKPT_TOK_H

#include <stdbool.h>
#include <stddef.h>

#include "ckpt/manifest.h"
#include "core/error.h"

/* Read the tokenizer to carry into m->tok_files (replacing what m carried):
 * the file `tokenizer` (a tokenizer.json, whatever its name) as
 * tokenizer.json, then the companions other than tokenizer.json that the
 * directory `companions` holds as regular files (NULL: the directory of
 * `tokenizer`), each with its size and XXH64. The bytes are m's (freed
 * with fsdp_ckpt_manifest_free). IO or FORMAT naming the file that cannot
 * be read or is larger than FSDP_CKPT_TOK_BYTES_MAX. */
fsdp_status fsdp_ckpt_tok_load(fsdp_ckpt_manifest *m, const char *tokenizer,
                               const char *companions);

/* Write the files m carries (as fsdp_ckpt_tok_load read them) into the
 * directory `dir` (a checkpoint's .tmp directory), each fsynced. No-op when
 * m carries none; INTERNAL when m was read from disk (it has no bytes). */
fsdp_status fsdp_ckpt_tok_write(const char *dir, const fsdp_ckpt_manifest *m);

/* Check every file m lists (read from `ckpt`/manifest) against its line:
 * present, a regular file, its size and XXH64. FORMAT naming the
 * checkpoint, the file, the manifest line and what to do otherwise. */
fsdp_status fsdp_ckpt_tok_verify(const char *ckpt, const fsdp_ckpt_manifest *m);

/* The tokenizer.json of the checkpoint `value` names (one complete
 * checkpoint, or a --ckpt-dir: its newest), once verified, into buf:
 * *found is false (OK) when value is no checkpoint or one that carries no
 * tokenizer, so the caller goes on without one; a checkpoint whose
 * manifest does not read or whose tokenizer files fail
 * fsdp_ckpt_tok_verify is that error. */
fsdp_status fsdp_ckpt_tok_find(const char *value, char *buf, size_t n, bool *found);

/* The tokenizer.json that comes with the --model value `value`, into buf:
 * a Hugging Face directory's (fsdp_modelfile_tokenizer_of), else the one
 * a checkpoint carries (fsdp_ckpt_tok_find), checked against its
 * manifest. *found false (OK) when there is none; a checkpoint whose
 * tokenizer files no longer match its manifest is FORMAT saying so. */
fsdp_status fsdp_ckpt_tok_for_model(const char *value, char *buf, size_t n, bool *found);

/* What the run of a checkpoint chose that `eval`, `sample` and a resume take as their
 * defaults, so that they read the data as the run did. */
typedef struct fsdp_ckpt_run {
    bool found;               /* value names a checkpoint (else the rest is zero) */
    char chat_format[FSDP_CKPT_CHAT_FORMAT_MAX]; /* how it rendered {"messages"} rows (its
                                                  * manifest's chat_format line; "" none) */
    int batch, seq;           /* its --batch (per device) and --seq */
    char compute_dtype[8];    /* its --precision: fp32 | bf16 */
} fsdp_ckpt_run;

/* The run of the checkpoint `value` names (one complete checkpoint, or a --ckpt-dir: its
 * newest) into *out; out->found false (OK) when value names none. A manifest that does not
 * read is that error. */
fsdp_status fsdp_ckpt_run_find(const char *value, fsdp_ckpt_run *out);

#endif /* FSDP_CKPT_CKPT_TOK_H */
