/*
 * header.c - what the cpu backend says in the header of a run (fsdp train,
 * the benchmarks): its threads per device, the GEMM kernels, and any
 * warning about either. One function, so every tool says it the same way.
 */
#include <stdio.h>

#include "device/cpu.h"
#include "ops/cpu/blas.h"
#include "ops/ops.h"

void fsdp_cpu_print_header(FILE *out, int n_devices, int requested_threads)
{
    if (!out)
        return;
    fsdp_cpu_streams mode;
    uint64_t seed;
    if (fsdp_device_cpu_get_streams(&mode, &seed) == FSDP_STATUS_OK &&
        mode == FSDP_CPU_STREAMS_ASYNC) {
        if (seed)
            fprintf(out, "cpu streams: async (a worker thread per stream), random delays from "
                         "seed %llu\n", (unsigned long long)seed);
        else
            fprintf(out, "cpu streams: async (a worker thread per stream)\n");
    }
    fsdp_error_clear();
    int cores = fsdp_device_cpu_cores();
    bool capped;
    int t = fsdp_device_cpu_threads_for(requested_threads, n_devices, cores, &capped);
    fprintf(out, "cpu: %d device(s) x %d thread(s) on %d core(s); GEMM: %s\n", n_devices, t, cores,
            fsdp_cpu_blas_describe());
    if (capped)
        fprintf(out, "note: --threads-per-device %d lowered to %d: %d device(s) x %d threads "
                     "would oversubscribe the %d core(s)\n",
                requested_threads, t, n_devices, requested_threads, cores);
    else if (n_devices > cores)
        fprintf(out, "note: %d devices share %d core(s): 1 thread each, and the ranks take turns\n",
                n_devices, cores);
    const char *warn = fsdp_cpu_blas_warning();
    if (warn)
        fprintf(out, "%s: %s\n", fsdp_cpu_blas_status() == FSDP_STATUS_OK ? "warning" : "error",
                warn);
}
