/*
 * log.h - levelled logging with a rank prefix, and the environment table.
 *
 * FSDP_LOG=error|warn|info|debug sets the level (default warn);
 * FSDP_LOG_SUBSYS=comm,shard,alloc,... restricts debug/info lines to those
 * subsystems (default all). Both are read once, from one table
 * (fsdp_env_get), before the first line. The level check happens before any
 * formatting, so disabled lines cost one branch.
 */
#ifndef FSDP_CORE_LOG_H
#define FSDP_CORE_LOG_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fsdp_log_level {
    FSDP_LOG_ERROR = 0,
    FSDP_LOG_WARN,
    FSDP_LOG_INFO,
    FSDP_LOG_DEBUG,
} fsdp_log_level;

typedef enum fsdp_log_subsys {
    FSDP_SUB_CORE = 1u << 0,
    FSDP_SUB_ALLOC = 1u << 1,
    FSDP_SUB_COMM = 1u << 2,
    FSDP_SUB_SHARD = 1u << 3,
    FSDP_SUB_OPS = 1u << 4,
    FSDP_SUB_OPTIM = 1u << 5,
    FSDP_SUB_DATA = 1u << 6,
    FSDP_SUB_CKPT = 1u << 7,
    FSDP_SUB_TRAIN = 1u << 8,
    FSDP_SUB_ALL = 0xffffu,
} fsdp_log_subsys;

/* Environment settings, declared in one table in log.c and read once. */
typedef enum fsdp_env_key {
    FSDP_ENV_LOG = 0,        /* FSDP_LOG */
    FSDP_ENV_LOG_SUBSYS,     /* FSDP_LOG_SUBSYS */
    FSDP_ENV_CPU_THREADS,    /* FSDP_CPU_THREADS: CPU optimizer worker threads */
    FSDP_ENV_RDV_DIR,        /* FSDP_RDV_DIR: rendezvous directory of a job's processes */
    FSDP_ENV_PROCESS,        /* FSDP_PROCESS: this process's index (with FSDP_RDV_DIR) */
    FSDP_ENV_N_PROCESSES,    /* FSDP_N_PROCESSES: the job's processes (with FSDP_RDV_DIR) */
    FSDP_ENV_PEER_TIMEOUT,   /* FSDP_PEER_TIMEOUT: seconds a wait on another process may last */
    FSDP_ENV_ABORT_GRACE,    /* FSDP_ABORT_GRACE: seconds a failing MPI process has to end the job */
    FSDP_ENV_FAULT,          /* FSDP_FAULT=RANK:OP:K: testing only, core/world.h */
    FSDP_ENV_CPU_STREAMS,    /* FSDP_CPU_STREAMS=inline|async: the cpu backend's streams */
    FSDP_ENV_CPU_STREAM_JITTER, /* FSDP_CPU_STREAM_JITTER=SEED: random delays in async streams */
    FSDP_ENV_CHAT_DATE,      /* FSDP_CHAT_DATE=YYYY-MM-DD: chat templates' strftime_now date */
    FSDP_ENV_WATCHDOG,       /* FSDP_WATCHDOG=SECONDS: the stall watchdog's deadline (0: off) */
    FSDP_ENV_COUNT
} fsdp_env_key;

/* Value of a setting (its default if unset); never NULL. */
const char *fsdp_env_get(fsdp_env_key key);

bool fsdp_log_enabled(fsdp_log_level lvl, unsigned subsys);
void fsdp_log_write(fsdp_log_level lvl, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The rank printed in front of this thread's lines (-1: the main thread). */
void fsdp_log_set_rank(int rank);
int fsdp_log_rank(void);

#define FSDP_LOG_AT(lvl, sub, ...)                                   \
    do {                                                             \
        if (fsdp_log_enabled((lvl), (sub)))                          \
            fsdp_log_write((lvl), __VA_ARGS__);                      \
    } while (0)

#define FSDP_ERR(sub, ...) FSDP_LOG_AT(FSDP_LOG_ERROR, sub, __VA_ARGS__)
#define FSDP_WARN(sub, ...) FSDP_LOG_AT(FSDP_LOG_WARN, sub, __VA_ARGS__)
#define FSDP_INFO(sub, ...) FSDP_LOG_AT(FSDP_LOG_INFO, sub, __VA_ARGS__)
#define FSDP_DEBUG(sub, ...) FSDP_LOG_AT(FSDP_LOG_DEBUG, sub, __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif /* FSDP_CORE_LOG_H */
