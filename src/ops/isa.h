/*
 * isa.h - the instruction-set levels of the host CPU that the vectorised
 * host kernels are written for (ops/optim_kernels.h has the kernels
 * and the run-time detection).
 *
 * The enum lives apart from the kernels so that an interface above the ops
 * layer (the optimizer table's host step, optim/optim.h) can name a level
 * without including a backend's header.
 */
#ifndef FSDP_OPS_ISA_H
#define FSDP_OPS_ISA_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_cpu_isa {
    FSDP_CPU_ISA_SCALAR = 0, /* the reference itself */
    FSDP_CPU_ISA_SSE41,      /* 4 lanes */
    FSDP_CPU_ISA_AVX2,       /* 8 lanes */
    FSDP_CPU_ISA_AVX512F,    /* 16 lanes */
    FSDP_CPU_ISA_COUNT       /* as an argument: the best supported */
} fsdp_cpu_isa;

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPS_ISA_H */
