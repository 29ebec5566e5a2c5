/*
 * adapt.h - the model a run trains when it does not train every weight of
 * the model --model gives: LoRA adapters (--lora, models/lora.h) and
 * frozen parameters (--freeze) applied to it, and the engine's init for
 * such a model. Adapting lays every unit out again (trainable parameters
 * first: models/model.h), so a model file, whose reads follow the base
 * model's layout, is bound to a copy of the base: the init reads each base
 * parameter there by name, and draws adapters from their initialisers.
 */
#ifndef FSDP_TRAIN_ADAPT_H
#define FSDP_TRAIN_ADAPT_H

#include <stdbool.h>
#include <stdint.h>

#include "ckpt/modelfile.h"
#include "ckpt/peft.h"
#include "core/names.h"
#include "models/model.h"

typedef struct fsdp_adapt {
    bool active;               /* something was applied (the rest is unused otherwise) */
    fsdp_model base;           /* the model as built from its family and config, the file
                                * bound to it; unused without a file */
    fsdp_modelfile *mf;        /* the base's weights, or NULL (the seed's) */
    uint64_t seed;             /* the adapters' (and a seed-initialised base's) */
    bool has_peft;             /* the adapters start from a PEFT directory (--adapter) */
    fsdp_peft_dir peft;
} fsdp_adapt;

/* What a run asks for: adapters (lora->r > 0) and freeze patterns (NULL or
 * "" : none). */
static inline bool fsdp_adapt_wanted(const fsdp_lora_config *lora, const char *freeze,
                                     const char *adapter)
{
    return (lora && lora->r > 0) || (freeze && freeze[0]) || (adapter && adapter[0]);
}

/* Adapt m in place (LoRA first, then the freeze patterns); mf, when not
 * NULL, is m's open file bound to m, and is bound to a copy of the base
 * instead. `adapter` (NULL: none) is a PEFT adapter directory the adapters
 * start from: its r, alpha, targets and rslora are the LoRA settings (lora
 * must then be unset, r = 0). INVALID_ARG naming the setting that does not
 * apply; the PEFT reader's errors name the file and tensor. */
fsdp_status fsdp_adapt_apply(fsdp_adapt *a, fsdp_model *m, fsdp_modelfile *mf,
                             const fsdp_lora_config *lora, const char *freeze,
                             const char *adapter, uint64_t seed);

/* How a run stores its frozen linear weights (--quantize). */
typedef enum fsdp_quant {
    FSDP_QUANT_NONE = 0, /* in the compute dtype */
    FSDP_QUANT_NF4,      /* NF4 with double quantization (ops/nf4.h), as bitsandbytes */
    FSDP_QUANT_COUNT
} fsdp_quant;

/* The settings by name, with one help line each (--quantize). */
extern const fsdp_name_table fsdp_quant_names;

/* Store frozen linear weights of the adapted model m in NF4 (the block
 * units' linear layers, as bitsandbytes quantizes a model's nn.Linear but the
 * LM head) when q is FSDP_QUANT_NF4, or whatever the base's file stores in
 * NF4 (a bnb-4bit directory) in any case; relayout m. INVALID_ARG when there
 * is something to quantize but nothing is frozen (naming --lora and
 * --freeze), or a weight cannot be (models/model.h's relayout). */
fsdp_status fsdp_adapt_quantize(fsdp_adapt *a, fsdp_model *m, fsdp_quant q);

/* The shape of the model a run of `model` (a --model value) trains with these adapters,
 * freeze patterns and --quantize, for a plan or a shard map: nothing but a model file's
 * headers is read, and whether it stores NF4 weights (a bnb-4bit directory's are NF4
 * whatever q says) counts as in the run. *m is the caller's to free; the errors are
 * fsdp_modelfile_resolve's, fsdp_adapt_apply's and fsdp_adapt_quantize's. */
fsdp_status fsdp_adapt_shape(const char *model, const fsdp_lora_config *lora,
                             const char *freeze, fsdp_quant q, fsdp_model *m);

/* fsdp_engine_shared.init_nf4_fn for an adapted model; arg is the fsdp_adapt:
 * NF4 shards from the base's file (quantized there when it holds floats), or
 * the base's initialisers quantized. */
fsdp_status fsdp_adapt_init_nf4_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                                   size_t end, uint8_t *codes, float *absmax);

/* fsdp_engine_shared.init_fn for an adapted model; arg is the fsdp_adapt. */
fsdp_status fsdp_adapt_init_fn(void *arg, const fsdp_model *m, int unit, size_t begin,
                               size_t end, float *dst);

/* Release the base copy and the adapter directory (the model file stays the
 * caller's: close it first); also after a failed fsdp_adapt_apply. */
void fsdp_adapt_free(fsdp_adapt *a);

#endif /* FSDP_TRAIN_ADAPT_H */
