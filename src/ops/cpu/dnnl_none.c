/*
 * dnnl_none.c - built instead of dnnl.c when oneDNN 2.x is not found: bf16
 * GEMMs are widened to fp32, and all fp32 GEMMs run through OpenBLAS (see
 * dnnl.h).
 */
#include <stdio.h>

#include "ops/cpu/dnnl.h"

bool fsdp_cpu_dnnl_probe(char *desc, size_t cap)
{
    snprintf(desc, cap, "widened to fp32 (built without oneDNN; install libdnnl-dev and rebuild "
                        "for bf16 dot products)");
    return false;
}

bool fsdp_cpu_dnnl_probe_f32(char *desc, size_t cap)
{
    snprintf(desc, cap, "built without oneDNN");
    return false;
}

fsdp_status fsdp_cpu_dnnl_prepare(fsdp_cpu_dnnl **state, const fsdp_cpu_dnnl_shape *shape,
                                  int n_workers, fsdp_cpu_dnnl_prim **out)
{
    (void)state, (void)shape, (void)n_workers, (void)out;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "cpu ops: this build has no oneDNN");
}

fsdp_status fsdp_cpu_dnnl_run(fsdp_cpu_dnnl *state, const fsdp_cpu_dnnl_prim *prim, int worker,
                              const void *A, const void *B, float *C)
{
    (void)state, (void)prim, (void)worker, (void)A, (void)B, (void)C;
    return fsdp_error_set(FSDP_STATUS_UNSUPPORTED, "cpu ops: this build has no oneDNN");
}

const char *fsdp_cpu_dnnl_impl(const fsdp_cpu_dnnl_prim *prim)
{
    (void)prim;
    return "none";
}

void fsdp_cpu_dnnl_free(fsdp_cpu_dnnl *state) { (void)state; }
