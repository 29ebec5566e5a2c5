/*
 * fsdp.h - the public API of fsdp: status codes, dtypes, opaque handles.
 *
 * Everything a program that embeds fsdp needs to name. Function-pointer
 * tables, shard maps and backend internals live in headers under src/.
 */
#ifndef FSDP_FSDP_H
#define FSDP_FSDP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_status {
    FSDP_STATUS_OK = 0,
    FSDP_STATUS_INVALID_ARG,  /* bad flag, shape or argument */
    FSDP_STATUS_OOM,          /* a device or host allocation failed or hit its cap */
    FSDP_STATUS_IO,           /* open/read/write/fsync failed */
    FSDP_STATUS_FORMAT,       /* a file is malformed (magic, version, sizes) */
    FSDP_STATUS_CUDA,         /* a CUDA runtime or cuBLAS call failed */
    FSDP_STATUS_NCCL,         /* an NCCL call failed */
    FSDP_STATUS_ABORTED,      /* another rank failed; this one stopped waiting */
    FSDP_STATUS_UNSUPPORTED,  /* valid request this build or backend cannot do */
    FSDP_STATUS_INTERNAL,     /* a broken invariant reported instead of aborting */
    FSDP_STATUS_NONFINITE,    /* the loss or a gradient became NaN or infinite (divergence) */
    FSDP_STATUS_STALLED,      /* a wait in a collective or barrier passed the stall watchdog's
                                 deadline (core/flight.h) */
    FSDP_STATUS_COUNT
} fsdp_status;

/* Short upper-case name of a status ("OOM"); never NULL. */
const char *fsdp_status_name(fsdp_status st);

/* Message attached to the last error set on the calling thread ("" if none).
 * After fsdp_world_launch() fails it holds the first failing rank's message. */
const char *fsdp_error_msg(void);

typedef enum fsdp_dtype {
    FSDP_DTYPE_F32 = 0,
    FSDP_DTYPE_BF16 = 1,
    FSDP_DTYPE_COUNT
} fsdp_dtype;

/* Bytes per element of a dtype. */
size_t fsdp_dtype_size(fsdp_dtype dt);
/* "fp32", "bf16" (the name table in core/names.c); "unknown" for other
 * values. */
const char *fsdp_dtype_name(fsdp_dtype dt);

typedef enum fsdp_backend {
    FSDP_BACKEND_CPU = 0,   /* simulated devices backed by host memory */
    FSDP_BACKEND_CUDA,      /* one GPU (or a share of one) per rank */
    FSDP_BACKEND_META,      /* accounting only: nothing is backed or computed */
    FSDP_BACKEND_COUNT
} fsdp_backend;

/* "cpu", "cuda", "meta" (the backend table in device/device.c); "unknown"
 * for other values. */
const char *fsdp_backend_name(fsdp_backend b);

/* Most ranks (devices) one world runs: every count of ranks, devices or
 * world size is checked against this one bound. */
#define FSDP_MAX_RANKS 1024

/* Opaque handles. */
typedef struct fsdp_world *fsdp_world_t;

#ifdef __cplusplus
}
#endif

#endif /* FSDP_FSDP_H */
