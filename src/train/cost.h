/*
 * cost.h - the cost model of `fsdp plan --fit`: an ESTIMATE of one
 * optimizer step's time, and of what a cuda run holds beyond the engine's
 * counted buffers. Memory is exact (the meta run); time is not: this file
 * turns exact counts (FLOPs from the model's shape, collective bytes and
 * calls from the meta run's counters, pinned bytes for offload) into
 * seconds with a handful of machine figures, each a parameter with a
 * documented default and a flag of `fsdp plan --fit` to override it.
 *
 * The step (per device; all devices do the same work):
 *   compute   = FLOPs / (peak TFLOP/s of the compute dtype x achieved fraction)
 *               FLOPs = tokens x (training FLOPs per token x (1 + r / 3)),
 *               r = forward passes rerun by activation recompute (0: none,
 *               1: a whole block); a forward is 1/3 of forward + backward
 *   gather    = all-gather bytes received / link bandwidth
 *               + the busiest node's all-gather bytes from other nodes / node bandwidth
 *   reduce    = reduce-scatter + all-reduce bytes received / link bandwidth
 *               + the busiest node's reduction bytes from other nodes / node bandwidth
 *     (a job of several nodes: the bytes that cross between nodes go over each
 *     node's network as well as the devices' links; the two are added, not
 *     overlapped, an upper bound)
 *   latency   = collective calls x per-call latency
 *   device    = prefetch on:  max(compute, gather) + reduce + latency
 *               prefetch off: compute + gather + reduce + latency
 *     (the engine issues the next unit's all-gather before computing this
 *     one only with prefetch; it waits for each reduce-scatter before it
 *     frees the unit's gradient, so reductions are not hidden)
 *   offload   = pcie + cpu_opt, run beside the device's work (offload.c
 *               pipelines copies and CPU updates unit by unit), so
 *               step = max(device, pcie + cpu_opt)
 *     pcie    = (gradient shard down + compute-dtype parameter shard up) /
 *               PCIe bandwidth (one copy stream: the two directions add);
 *               with the parameter shards on the host (params offload) they
 *               go up before each gather instead, on the gathers' stream:
 *               param_upload_bytes / PCIe bandwidth is added to gather
 *     cpu_opt = bytes the CPU optimizer moves for ALL devices (per element:
 *               read p and g, read and write each state array, write p, as
 *               the optimizer's table says: AdamW 28, SGD 20; +2 writing a
 *               bf16 copy) / host memory bandwidth (one host serves every
 *               device)
 *   step      = offload ? max(device, pcie + cpu_opt) : device
 *
 * Left out: kernel efficiency falling at small micro-batches (a constant
 * achieved fraction is used), the optimizer's device time, data loading.
 * The ranking is meant to be right where the terms differ by a lot (more
 * collectives with accumulation under FULL_SHARD, exposed all-gathers
 * without prefetch, PCIe and CPU time with offload); close calls are close.
 */
#ifndef FSDP_TRAIN_COST_H
#define FSDP_TRAIN_COST_H

#include <stdbool.h>
#include <stddef.h>

#include "fsdp/fsdp.h"

/* Machine figures (per device unless noted). Defaults: one 8-GPU H100/H200
 * SXM server, the machine the trainer's MFU figure assumes. */
typedef struct fsdp_machine {
    double tflops_fp32;    /* dense peak at fp32, TFLOP/s (67: H100 SXM, no TF32) */
    double tflops_bf16;    /* dense peak at bf16, TFLOP/s (989: H100/H200 SXM) */
    double mfu;            /* fraction of the peak the step's FLOPs achieve (0.4) */
    double link_gbs;       /* collective bus bandwidth, GB/s, as nccl-tests report it:
                              time = bytes received / bandwidth (360: NVLink 4, 8 GPUs) */
    double link_latency_us; /* per collective call, us (20) */
    double pcie_gbs;       /* pinned host <-> device copies, GB/s (25: PCIe Gen5 x16
                              shared by two GPUs per switch, measured host-to-device
                              rates of H100 servers fall between 25 and 50) */
    double host_gbs;       /* host memory bandwidth the CPU optimizer reaches, GB/s,
                              all devices together (100; build/tools/bench_adam
                              measures it on your machine) */
    double node_gbs;       /* a node's network bandwidth to the other nodes, GB/s, each
                              direction (50: one 400 Gb/s InfiniBand NDR or RoCE NIC;
                              an 8-GPU H100 node with a NIC per GPU has 8x that) */
} fsdp_machine;

/* The defaults above. */
void fsdp_machine_default(fsdp_machine *m);

/* Peak TFLOP/s of m for compute dtype dt. */
double fsdp_machine_tflops(const fsdp_machine *m, fsdp_dtype dt);

/* What one step moves and computes on one device (exact inputs). */
typedef struct fsdp_cost_input {
    double flops;              /* forward + backward + recompute, this device, one step */
    fsdp_dtype dtype;          /* compute dtype */
    bool prefetch;
    bool offload;
    size_t gather_bytes;       /* all-gather bytes received by this device, one step */
    size_t reduce_bytes;       /* reduce-scatter + all-reduce bytes received */
    size_t inter_gather_bytes; /* all-gather bytes the busiest node receives from others */
    size_t inter_reduce_bytes; /* reduction bytes the busiest node receives from others */
    size_t n_calls;            /* collective calls, one step */
    size_t pcie_bytes;         /* offload: host <-> device bytes of this device, one step */
    size_t host_update_bytes;  /* offload: bytes the CPU optimizer moves, all devices */
    size_t param_upload_bytes; /* params offload: host shards (frozen; with the optimizer's
                                * offload, trainable too) uploaded ahead of their gathers,
                                * this device, one step (on the gathers' stream) */
} fsdp_cost_input;

/* The estimate, in seconds, with its terms (see the top of this file). */
typedef struct fsdp_cost {
    double compute_s, gather_s, reduce_s, latency_s, pcie_s, cpu_opt_s;
    double inter_s;            /* of gather_s + reduce_s: the part between nodes */
    double device_s;           /* compute with the collectives the schedule exposes */
    double step_s;
} fsdp_cost;

/* Training FLOPs per token (forward + backward, no recompute) of a
 * transformer with n_params parameters, n_layer attention layers of width
 * attn_dim (heads x head size) at sequence length T: 6 n_params + 12 n_layer
 * attn_dim T (the count llm.c and the trainer's MFU use: 2 FLOPs per
 * multiply-add, backward twice the forward, attention scores and their
 * weighted sum over all T positions). */
double fsdp_cost_flops_per_token(size_t n_params, int n_layer, int attn_dim, int T);

/* The estimate for `in` on machine m. Pure. */
void fsdp_cost_estimate(const fsdp_machine *m, const fsdp_cost_input *in, fsdp_cost *out);

/* ---- what a cuda run holds beyond the engine's counted bytes ---------------
 * The engine's allocations are exact (the planner counts what the cuda
 * device counts as in use). A cuda run also holds, per GPU: */
typedef struct fsdp_cuda_overhead {
    size_t context_bytes;  /* CUDA context: driver state and the kernels loaded lazily
                              (DOCUMENTED ESTIMATE, FSDP_COST_CUDA_CONTEXT_BYTES) */
    size_t cublas_bytes;   /* cuBLAS workspace (the code's constant) */
    size_t scratch_bytes;  /* op scratch: the largest request of the cuda ops for this
                              shape, with the 25% headroom they add (from the code) */
    size_t comm_bytes;     /* NCCL's buffers with more than one device
                              (DOCUMENTED ESTIMATE, FSDP_COST_NCCL_BYTES) */
    size_t cache_bytes;    /* the block cache's size-class rounding (ESTIMATE: 1 MiB per
                              live allocation, half the 2 MiB class step of large blocks) */
    size_t total_bytes;
} fsdp_cuda_overhead;

/* CUDA context with lazy module loading (CUDA >= 11.7): 300-600 MiB are
 * reported for recent GPUs (PyTorch issues #107667, #109888: ~300-400 MiB;
 * 555 MiB on a Blackwell RTX PRO 6000, llama.cpp PR #23604). */
#define FSDP_COST_CUDA_CONTEXT_BYTES ((size_t)512 << 20)
/* NCCL on 8 H100 in one node: about 1 GiB per GPU after init and the first
 * collectives (NVIDIA/nccl issue #1685: 1.06 GB; #864: up to 1.6 GB with
 * more channels). Fewer channels or NCCL_NVLS_ENABLE=0 lower it. */
#define FSDP_COST_NCCL_BYTES ((size_t)1 << 30)
/* cuBLAS workspace per rank: FSDP_CUDA_BLAS_WS_BYTES in src/ops/cuda/common.cuh
 * (test_fit checks that the two agree). */
#define FSDP_COST_CUBLAS_WS_BYTES ((size_t)32 << 20)
/* The bf16 matmul backward stages dout in chunks of at most
 * FSDP_CUDA_LOWP_CHUNK_NUMEL elements (src/ops/cuda/common.cuh). */
#define FSDP_COST_LOWP_CHUNK_NUMEL ((size_t)32 << 20)
/* Rounding estimate per live allocation of the cuda block cache. */
#define FSDP_COST_CACHE_BYTES_PER_ALLOC ((size_t)1 << 20)

/* The shape that sizes the cuda ops' scratch (src/ops/cuda/attention_gqa.cu,
 * matmul.cu): attention forward keeps fp32 scores (NH, T, T) of one
 * sequence; its bf16 backward stages dout (T, C) and the score gradient
 * (NH, T, T) in bf16; the bf16 matmul backward stages min(B T, chunk / OC)
 * rows of dout (OC wide). */
typedef struct fsdp_cost_shape {
    int batch;             /* B: sequences per micro-batch */
    int seq;               /* T */
    int n_head;            /* NH */
    int channels;          /* C = heads x head size */
    int max_out;           /* the widest matmul output (padded vocabulary, 4 C) */
} fsdp_cost_shape;

/* What a cuda run holds beyond the engine's bytes: n_ranks GPUs (NCCL
 * buffers only with more than one), compute dtype dt, the shape, and
 * n_live allocations at the peak. */
void fsdp_cost_cuda_overhead(int n_ranks, fsdp_dtype dt, const fsdp_cost_shape *shape,
                             size_t n_live, fsdp_cuda_overhead *out);

#endif /* FSDP_TRAIN_COST_H */
