/*
 * table.c - the cpu op table: every slot of struct fsdp_ops_i, filled from
 * the op files beside this one (one family per file), each by its name
 * (designated initialisers), so no slot can land in another's place.
 */
#include "ops/cpu/cpu_ops.h"

const struct fsdp_ops_i fsdp_ops_cpu_i = {
    .name = "cpu",
    .fini = fsdp_cpu_ops_fini,
    .embed_fwd = fsdp_cpu_embed_fwd,
    .embed_bwd = fsdp_cpu_embed_bwd,
    .layernorm_fwd = fsdp_cpu_layernorm_fwd,
    .layernorm_bwd = fsdp_cpu_layernorm_bwd,
    .matmul_fwd = fsdp_cpu_matmul_fwd,
    .matmul_bwd = fsdp_cpu_matmul_bwd,
    .lora_fwd = fsdp_cpu_lora_fwd,
    .lora_bwd = fsdp_cpu_lora_bwd,
    .gelu_fwd = fsdp_cpu_gelu_fwd,
    .gelu_bwd = fsdp_cpu_gelu_bwd,
    .attention_fwd = fsdp_cpu_attention_fwd,
    .attention_bwd = fsdp_cpu_attention_bwd,
    .residual_fwd = fsdp_cpu_residual_fwd,
    .xent_fwd_bwd = fsdp_cpu_xent_fwd_bwd,
    .adamw = fsdp_cpu_adamw,
    .sgd = fsdp_cpu_sgd,
    .cast = fsdp_cpu_cast,
    .nf4_dequant = fsdp_cpu_nf4_dequant,
    .add = fsdp_cpu_add,
    .sumsq_blocks = fsdp_cpu_sumsq_blocks,
    .sync_error = fsdp_cpu_ops_sync_error, /* scratch OOM */
    .rmsnorm_fwd = fsdp_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = fsdp_cpu_rmsnorm_bwd,
    .rope_fwd = fsdp_cpu_rope_fwd,
    .rope_bwd = fsdp_cpu_rope_bwd,
    .swiglu_fwd = fsdp_cpu_swiglu_fwd,
    .swiglu_bwd = fsdp_cpu_swiglu_bwd,
    .attention_gqa_fwd = fsdp_cpu_attention_gqa_fwd,
    .attention_gqa_bwd = fsdp_cpu_attention_gqa_bwd,
};
