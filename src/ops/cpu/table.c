/*
 * table.c - the cpu op table: every slot of struct fsdp_ops_i, filled from
 * the op files beside this one (one family per file), each by its name
 * (designated initialisers, one per op of ops.h's FSDP_OPS_EACH_OP: op's
 * slot takes fsdp_cpu_<op>), so no slot can land in another's place.
 */
#include "ops/cpu/cpu_ops.h"

#define CPU_SLOT(op) .op = fsdp_cpu_##op,

const struct fsdp_ops_i fsdp_ops_cpu_i = {
    .name = "cpu",
    .fini = fsdp_cpu_ops_fini,
    .sync_error = fsdp_cpu_ops_sync_error, /* scratch OOM */
    FSDP_OPS_EACH_OP(CPU_SLOT)
};
