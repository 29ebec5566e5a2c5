/*
 * infer.h - forward-only use of a trained model on N rank threads:
 * `fsdp eval` (mean loss over a data set) and `fsdp sample` (generation).
 *
 * The model comes from a model file (llm.c .bin, .safetensors or a
 * checkpoint: any format of src/ckpt/modelfile.h, resolved by
 * fsdp_modelfile_resolve) loaded straight into a sharded engine:
 * each rank reads only its own shard of every unit, as in training, so a
 * model that does not fit one device can still be evaluated. The engine is
 * an inference engine (engine.h: inference): parameters in the compute
 * dtype and activations, no optimizer state or gradients.
 */
#ifndef FSDP_TRAIN_INFER_H
#define FSDP_TRAIN_INFER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/engine.h"

typedef struct fsdp_infer_config {
    const char *model_path;    /* a model file (modelfile.h), not a bare spec */
    const char *adapter;       /* a PEFT adapter directory on the model (--adapter), or NULL */
    int quantize;              /* fsdp_quant (train/adapt.h) of the base under the adapter:
                                * NF4 stores its linear weights as a QLoRA run does */
    fsdp_backend backend;
    int n_ranks;
    fsdp_dtype compute_dtype;
    size_t device_mem;         /* per-device cap, 0 = none */
    int cpu_streams;           /* cpu: fsdp_cpu_streams (device/cpu.h); 0 = the environment's */
    int batch;                 /* eval: sequences per micro-batch */
    int seq;                   /* eval: T (0: by the data, fsdp_infer_eval);
                                * sample: context window (0: the model's) */
    const char *tokenizer;     /* eval: tokenizer.json for .txt/.jsonl data, or NULL */
    int pack;                  /* eval: example rows, the trainer's --pack (train.h's
                                * FSDP_TRAIN_PACK_*; AUTO: packed when the model can) */
    const char *chat_format;   /* eval: how {"messages"} rows are rendered, as the trainer's
                                * --chat-format (data.h; NULL: the tokenizer's) */
    FILE *note;                /* eval: where to say how {"messages"} rows were rendered
                                * and, every FSDP_PROGRESS_S seconds, how far a long
                                * evaluation is (NULL: nowhere) */
    fsdp_mem_stats *mem_out;   /* optional [n_ranks]: each rank's device memory figures
                                * after its last forward */
} fsdp_infer_config;

/* Defaults: cpu (cuda if visible), 1 rank, fp32, batch 8, seq 0 (eval: by
 * the data, fsdp_infer_eval; sample: the model's context), pack AUTO. */
void fsdp_infer_config_default(fsdp_infer_config *cfg);

/* What fsdp_infer_eval measured. */
typedef struct fsdp_infer_eval_result {
    float mean;                /* the mean loss over the batches' unmasked targets */
    int n_batches;             /* micro-batches evaluated: the count asked for, or the default */
    int n_data;                /* of them, those holding rows of the data: n_batches, fewer when
                                * example rows (read once) end before the last batch */
    int batch, seq;            /* B and T of each micro-batch (seq: as given, or the default) */
    bool packed;               /* example rows packed several to a row */
    float *losses;             /* [n_batches], malloc'd (the caller frees it): each batch's own
                                * unmasked mean, NAN for a batch without any target */
} fsdp_infer_eval_result;

/* Mean next-token loss over micro-batches 0 .. n_batches-1 of `data` (a
 * spec as for fsdp_data_open; the numbering of fsdp_engine_step, so batch
 * m holds the tokens the trainer's micro-batch m holds for the same B, T
 * and seed), summed in the trainer's balanced tree over m: for the same
 * batches the result equals the trainer's step loss bit for bit, for any
 * number of ranks. n_batches 0: the batches that read the file once, at most
 * FSDP_HELDOUT_MAX_DEFAULT (heldout.h; the held-out set's default), 10 of the
 * synthetic task. cfg->seq 0: for example rows the trainer's default (the
 * longest example rounded up, train.h), else 64 or the context if shorter;
 * cfg->note hears which. Example rows (prompt/completion, chat) count only
 * their unmasked targets: the mean is over those (fsdp_engine_mean_loss),
 * are packed as the trainer packs them (cfg->pack) and are read once, as the
 * held-out set is: the rows past the file's end are padding, so n_batches x B
 * >= the rows counts each example exactly once (the trainer's --eval-data
 * figure for the same B, T, packing and batch count, bit for bit).
 * INVALID_ARG when no batch holds a target (every example cut at --seq
 * before its completion): nothing to evaluate, never a mean of 0. On
 * failure *out holds nothing. */
fsdp_status fsdp_infer_eval(const fsdp_infer_config *cfg, const char *data, uint64_t seed,
                            int n_batches, fsdp_infer_eval_result *out);

typedef struct fsdp_sample_config {
    const int *prompt;         /* n_prompt >= 1 token ids < vocab */
    int n_prompt;
    int n_tokens;              /* tokens to generate */
    float temperature;         /* 0: greedy (argmax); > 0: sample softmax(logits / T) */
    uint64_t seed;             /* sampling: token k draws uniform (seed, k) */
    const int *stop;           /* n_stop token ids that end the generation (end of turn,
                                * end of text); may be NULL */
    int n_stop;
    /* called on rank 0's thread with each new token as it is chosen (may be NULL) */
    void (*on_token)(void *arg, int token);
    void *arg;
    float *logits;             /* optional (n_tokens, vocab): row k receives the fp32
                                * logits token k was chosen from */
} fsdp_sample_config;

/* Generate up to sc->n_tokens tokens after the prompt into out[0..): it
 * stops after a token of sc->stop (which is kept in out). *n_out (may be
 * NULL) receives how many were generated. Prompts longer than the context
 * keep their last `seq` tokens (a sliding window); cfg->seq beyond the
 * model's context is INVALID_ARG. Deterministic for a given model, prompt,
 * temperature and seed, for any number of ranks. */
fsdp_status fsdp_infer_sample(const fsdp_infer_config *cfg, const fsdp_sample_config *sc,
                              int *out, int *n_out);

#endif /* FSDP_TRAIN_INFER_H */
