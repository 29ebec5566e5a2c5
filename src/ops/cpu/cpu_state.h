/*
 * cpu_state.h - what a cpu op context keeps in ctx->backend (scratch.c
 * creates it on first use, fsdp_cpu_ops_fini frees it).
 */
#ifndef FSDP_OPS_CPU_CPU_STATE_H
#define FSDP_OPS_CPU_CPU_STATE_H

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/dnnl.h"

struct fsdp_cpu_ops_state {
    float *buf[FSDP_CPU_SLOT_COUNT];
    size_t numel[FSDP_CPU_SLOT_COUNT]; /* capacity of buf[k], elements */
    fsdp_status err;                   /* first failure since fsdp_cpu_ops_sync_error */
    char err_msg[512];
    fsdp_cpu_dnnl *dnnl;               /* oneDNN GEMM primitives; NULL until used */
};

/* ctx's state, created on first use (aborts only if a few hundred bytes
 * cannot be had). Rank thread only. */
struct fsdp_cpu_ops_state *fsdp_cpu_state(fsdp_op_ctx *ctx);

#endif /* FSDP_OPS_CPU_CPU_STATE_H */
