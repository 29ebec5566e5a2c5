/*
 * comm_util.h - a rank's cpu device and transport as the collective suites
 * (test_comm, test_mpi) hold them on their rank threads: each suite opens
 * them its own way and closes them here; and the serial reference of a
 * reduced element that every collective suite compares with, and the
 * inputs they make.
 *
 * Header-only; nothing here calls Check (rank threads must not).
 */
#ifndef FSDP_TESTS_COMM_UTIL_H
#define FSDP_TESTS_COMM_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "comm/comm.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "device/device.h"

/* A rank's device and transport, and which of them are open. */
struct rank_env {
    fsdp_device dev;
    fsdp_comm comm;
    bool have_dev, have_comm;
};

/* Closes what is open: the transport, then the device. */
static inline void env_fini(struct rank_env *e)
{
    if (e->have_comm)
        fsdp_comm_fini(&e->comm);
    if (e->have_dev)
        fsdp_device_fini(&e->dev);
}

/* st, or, when the collective that returned it was issued (OK) on a
 * transport with a device, the status of waiting for the device's comm
 * stream: a collective is stream-ordered, and on asynchronous cpu streams
 * (FSDP_CPU_STREAMS=async) its outputs and failure are there only after
 * the sync. Wrap every collective whose results a suite reads. */
static inline fsdp_status synced(fsdp_comm *c, fsdp_status st)
{
    if (st != FSDP_STATUS_OK || !c->dev)
        return st;
    return fsdp_device_stream_sync(c->dev, c->dev->comm);
}

/* An input element of the collective suites: a float with a random sign
 * and mantissa and an exponent in [-10, 10], so the order of a sum shows
 * in its rounding; `key` mixes the suite's seed, the collective, the rank
 * and the element (each suite its own way). */
static inline float ref_input_f32(uint64_t key)
{
    uint64_t u = fsdp_rng_mix(key);
    uint32_t bits = (uint32_t)(u >> 63) << 31 | (uint32_t)(127 - 10 + (int)((u >> 32) % 21)) << 23 |
                    ((uint32_t)u & 0x7fffffu);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Write n elements of rank r's input for collective `tag`, from element
 * `first`, in dtype dt: element i is gen(tag, r, first + i) (bf16: rounded
 * once). */
static inline void ref_fill(void *buf, fsdp_dtype dt, float (*gen)(uint64_t tag, int r, size_t i),
                            uint64_t tag, int r, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float v = gen(tag, r, first + i);
        if (dt == FSDP_DTYPE_F32)
            ((float *)buf)[i] = v;
        else
            ((fsdp_bf16 *)buf)[i] = fsdp_f32_to_bf16(v);
    }
}

/* The reference of one reduced element: op over the n ranks' values
 * vals[0..n) (fp32, as the collective sees its inputs), the tree sum
 * (fsdp_tree_sum) times 1.0f / n for AVG, stored as element i of out in dt
 * (bf16: rounded once). */
static inline void ref_reduce_store(void *out, size_t i, fsdp_dtype dt, fsdp_reduce_op op,
                                    const float *vals, int n)
{
    float s = fsdp_tree_sum(vals, n);
    if (op == FSDP_REDUCE_AVG)
        s = s * (1.0f / (float)n);
    if (dt == FSDP_DTYPE_F32)
        ((float *)out)[i] = s;
    else
        ((fsdp_bf16 *)out)[i] = fsdp_f32_to_bf16(s);
}

#endif /* FSDP_TESTS_COMM_UTIL_H */
