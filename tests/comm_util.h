/*
 * comm_util.h - a rank's cpu device and transport as the collective suites
 * (test_comm, test_mpi) hold them on their rank threads: each suite opens
 * them its own way and closes them here; and the serial reference of a
 * reduced element that every collective suite compares with.
 *
 * Header-only; nothing here calls Check (rank threads must not).
 */
#ifndef FSDP_TESTS_COMM_UTIL_H
#define FSDP_TESTS_COMM_UTIL_H

#include <stdbool.h>

#include "comm/comm.h"
#include "core/bf16.h"
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
