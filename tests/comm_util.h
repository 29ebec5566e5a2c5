/*
 * comm_util.h - a rank's cpu device and transport as the collective suites
 * (test_comm, test_mpi) hold them on their rank threads: each suite opens
 * them its own way and closes them here.
 *
 * Header-only; nothing here calls Check (rank threads must not).
 */
#ifndef FSDP_TESTS_COMM_UTIL_H
#define FSDP_TESTS_COMM_UTIL_H

#include <stdbool.h>

#include "comm/comm.h"
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

#endif /* FSDP_TESTS_COMM_UTIL_H */
