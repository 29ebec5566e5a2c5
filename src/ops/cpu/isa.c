/*
 * isa.c - which vector instruction sets the host optimizer kernels
 * (optim_kernels.h) may use: the build compiles every x86 kernel (with
 * per-function target attributes, since the baseline is x86-64-v2) and the
 * running CPU decides, through __builtin_cpu_supports. Other architectures
 * get the scalar references only.
 */
#include "ops/optim_kernels.h"

const char *fsdp_cpu_isa_name(fsdp_cpu_isa isa)
{
    static const char *const names[FSDP_CPU_ISA_COUNT] = {"scalar", "sse4.1", "avx2", "avx512f"};
    return (unsigned)isa < FSDP_CPU_ISA_COUNT ? names[isa] : "?";
}

bool fsdp_cpu_isa_supported(fsdp_cpu_isa isa)
{
    switch (isa) {
    case FSDP_CPU_ISA_SCALAR:
        return true;
#if defined(__x86_64__) || defined(__i386__)
    case FSDP_CPU_ISA_SSE41:
        return __builtin_cpu_supports("sse4.1");
    case FSDP_CPU_ISA_AVX2:
        return __builtin_cpu_supports("avx2");
    case FSDP_CPU_ISA_AVX512F:
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return false;
    }
}

fsdp_cpu_isa fsdp_cpu_isa_best(void)
{
    for (int isa = FSDP_CPU_ISA_COUNT - 1; isa > FSDP_CPU_ISA_SCALAR; isa--)
        if (fsdp_cpu_isa_supported((fsdp_cpu_isa)isa))
            return (fsdp_cpu_isa)isa;
    return FSDP_CPU_ISA_SCALAR;
}
