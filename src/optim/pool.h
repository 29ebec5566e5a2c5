/*
 * pool.h - a CPU worker pool for chunked, embarrassingly parallel host work.
 *
 * Exists for the optimizer-offload path: every rank thread hands its host
 * optimizer step (optim/host_step.h) to one pool shared by the whole process, so
 * the CPU cores that are not driving devices update all shards together
 * instead of each rank updating its own shard on its own thread.
 *
 * A job is a function called once per chunk index 0..n_chunks-1; chunks are
 * independent and may run in any order, on any thread. Workers take chunks
 * from the oldest job that still has some. The thread that waits for a job
 * processes that job's chunks too, so a job always finishes even on a pool
 * with zero workers, and the waiting thread is not idle.
 *
 * Two ways to get a pool:
 *  - the process pool, shared and refcounted: fsdp_pool_acquire() creates it
 *    on first use, fsdp_pool_release() joins its threads when the last user
 *    lets go (so ASan's leak check sees nothing at exit);
 *  - a private pool of an exact size: fsdp_pool_create()/fsdp_pool_destroy()
 *    (benchmarks, tests).
 * All functions are thread-safe; any number of threads may submit and wait
 * at the same time.
 */
#ifndef FSDP_OPTIM_POOL_H
#define FSDP_OPTIM_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "fsdp/fsdp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fsdp_pool fsdp_pool;

/* Process chunk `chunk` of a job. Called with no pool lock held; must not
 * fail (a chunk function has no way to report an error) and must not wait
 * for another job of the same pool. */
typedef void (*fsdp_pool_chunk_fn)(void *arg, size_t chunk);

/* A job's bookkeeping. The caller owns the storage (embed it in its own
 * struct); it must stay valid and untouched from fsdp_pool_submit() until
 * fsdp_pool_wait() returns. The fields are private to pool.c. */
typedef struct fsdp_pool_job {
    fsdp_pool_chunk_fn fn;
    void *arg;
    size_t n_chunks;
    atomic_size_t next_chunk;    /* next chunk index to hand out */
    int n_active;                /* threads inside this job; pool lock */
    bool queued;                 /* on the pool's queue; pool lock */
    bool finished;               /* every chunk has run; pool lock */
    struct fsdp_pool_job *next;  /* queue link; pool lock */
} fsdp_pool_job;

/* Worker count for the process pool: FSDP_CPU_THREADS when set to a positive
 * number, else max(1, online cores - n_busy), where n_busy is how many cores
 * the caller's device work keeps busy (rank threads of the cpu backend). */
int fsdp_pool_default_threads(int n_busy);

/* Create a private pool with exactly n_workers threads (0 is allowed: the
 * waiting thread then does all the work). Returns OOM or INTERNAL with a
 * message if memory or a thread cannot be had; *out is NULL then. */
fsdp_status fsdp_pool_create(int n_workers, fsdp_pool **out);

/* Join the workers and free the pool. No job may be pending (asserted). */
void fsdp_pool_destroy(fsdp_pool *pool);

/* The process pool: created with fsdp_pool_default_threads(n_busy) workers
 * by the first acquire; later acquires return the same pool (its size is
 * fixed by the first) and count a reference. Pair each successful acquire
 * with one fsdp_pool_release(). */
fsdp_status fsdp_pool_acquire(int n_busy, fsdp_pool **out);
void fsdp_pool_release(fsdp_pool *pool);

/* Number of worker threads (not counting threads that help while waiting). */
int fsdp_pool_n_workers(const fsdp_pool *pool);

/* Queue a job of n_chunks calls fn(arg, chunk). Returns at once; workers
 * start on it immediately. n_chunks == 0 makes a job that is already done. */
void fsdp_pool_submit(fsdp_pool *pool, fsdp_pool_job *job, fsdp_pool_chunk_fn fn, void *arg,
                      size_t n_chunks);

/* Process the job's remaining chunks on the calling thread, then block until
 * chunks taken by workers have finished too. On return every chunk's effects
 * are visible to the caller and the job storage may be reused. Call exactly
 * once per submitted job. */
void fsdp_pool_wait(fsdp_pool *pool, fsdp_pool_job *job);

/* Whether the job has finished (non-blocking; does not help). A job that
 * tests done must still be passed to fsdp_pool_wait() once. */
bool fsdp_pool_test(fsdp_pool *pool, fsdp_pool_job *job);

#ifdef __cplusplus
}
#endif

#endif /* FSDP_OPTIM_POOL_H */
