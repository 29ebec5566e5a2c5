/*
 * pool.c - the CPU worker pool (see pool.h for the contract).
 *
 * One mutex guards the job queue and every job's n_active/queued/finished;
 * chunk indices are handed out with an atomic counter so that claiming a
 * chunk costs no lock. A job is finished when its counter has run past
 * n_chunks (nothing left to claim) and no thread is inside it any more:
 * every claimed chunk was claimed by a thread counted in n_active, so
 * n_active == 0 means every chunk has completed. The thread that observes
 * this under the lock marks the job finished and wakes the waiters, and from
 * then on no pool thread touches the job, so its owner may free it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "optim/pool.h"

struct fsdp_pool {
    pthread_mutex_t mu;
    pthread_cond_t work_cv;   /* a job was queued, or stop was set */
    pthread_cond_t done_cv;   /* some job finished */
    fsdp_pool_job *head;      /* FIFO of jobs that may still have chunks */
    fsdp_pool_job *tail;
    bool stop;
    int n_workers;
    int n_started;
    pthread_t *threads;       /* (n_workers,) */
};

/* The process pool, created by the first acquire, joined by the last release. */
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static fsdp_pool *g_pool;
static int g_pool_refs;

int fsdp_pool_default_threads(int n_busy)
{
    const char *env = fsdp_env_get(FSDP_ENV_CPU_THREADS);
    char *end = NULL;
    long v = strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0)
        return v > 4096 ? 4096 : (int)v;
    if (v != 0 || end == env || *end != '\0')
        FSDP_WARN(FSDP_SUB_OPTIM,
                  "FSDP_CPU_THREADS='%s' is not a positive thread count; using the default "
                  "(online cores minus device threads)", env);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    long w = n - (n_busy > 0 ? n_busy : 0);
    return w < 1 ? 1 : (int)w;
}

static bool job_has_chunks(const fsdp_pool_job *job)
{
    return atomic_load_explicit(&job->next_chunk, memory_order_relaxed) < job->n_chunks;
}

/* Run chunks of job until none is left to claim. No lock held. */
static void job_run(fsdp_pool_job *job)
{
    for (;;) {
        size_t c = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed);
        if (c >= job->n_chunks)
            return;
        job->fn(job->arg, c);
    }
}

static void queue_remove(fsdp_pool *pool, fsdp_pool_job *job)
{
    fsdp_pool_job **pp = &pool->head, *prev = NULL;
    while (*pp && *pp != job) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    FSDP_ASSERT(*pp == job);
    *pp = job->next;
    if (pool->tail == job)
        pool->tail = prev;
    job->next = NULL;
    job->queued = false;
}

/* Called with the lock held by a thread that has just left job_run(job):
 * nothing is left to claim, so unqueue it; finish it if it was the last. */
static void job_leave(fsdp_pool *pool, fsdp_pool_job *job)
{
    job->n_active--;
    if (job->queued)
        queue_remove(pool, job);
    if (job->n_active == 0 && !job->finished) {
        job->finished = true;
        pthread_cond_broadcast(&pool->done_cv);
    }
}

/* First queued job with chunks left, or NULL. Lock held. */
static fsdp_pool_job *queue_pick(fsdp_pool *pool)
{
    for (fsdp_pool_job *j = pool->head; j; j = j->next)
        if (job_has_chunks(j))
            return j;
    return NULL;
}

static void *worker_main(void *arg)
{
    fsdp_pool *pool = arg;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        fsdp_pool_job *job;
        while (!(job = queue_pick(pool)) && !pool->stop)
            pthread_cond_wait(&pool->work_cv, &pool->mu);
        if (!job)
            break; /* stop, and nothing left to do */
        job->n_active++;
        pthread_mutex_unlock(&pool->mu);
        job_run(job);
        pthread_mutex_lock(&pool->mu);
        job_leave(pool, job);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void pool_stop_join(fsdp_pool *pool)
{
    fsdp_threads_stop(&pool->mu, &pool->work_cv, &pool->stop, pool->threads, pool->n_started);
    pool->n_started = 0;
}

fsdp_status fsdp_pool_create(int n_workers, fsdp_pool **out)
{
    *out = NULL;
    if (n_workers < 0)
        return fsdp_error_set(FSDP_STATUS_INVALID_ARG,
                              "cpu pool: %d workers requested; pass 0 or more", n_workers);
    fsdp_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return fsdp_error_set(FSDP_STATUS_OOM, "cpu pool: out of host memory for the pool");
    pool->n_workers = n_workers;
    pool->threads = calloc(n_workers > 0 ? (size_t)n_workers : 1, sizeof(pthread_t));
    if (!pool->threads) {
        free(pool);
        return fsdp_error_set(FSDP_STATUS_OOM, "cpu pool: out of host memory for %d threads",
                              n_workers);
    }
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    for (int i = 0; i < n_workers; i++) {
        int rc = pthread_create(&pool->threads[i], NULL, worker_main, pool);
        if (rc != 0) {
            fsdp_pool_destroy(pool);
            return fsdp_error_set(FSDP_STATUS_INTERNAL,
                                  "cpu pool: cannot start worker %d of %d: %s; set "
                                  "FSDP_CPU_THREADS lower or raise the process thread limit",
                                  i + 1, n_workers, strerror(rc));
        }
        pool->n_started = i + 1;
        char name[16];
        snprintf(name, sizeof name, "fsdp-cpu-%d", i);
        pthread_setname_np(pool->threads[i], name); /* for top -H, gdb; failure is harmless */
    }
    FSDP_INFO(FSDP_SUB_OPTIM, "cpu pool: %d worker threads", n_workers);
    *out = pool;
    return FSDP_STATUS_OK;
}

void fsdp_pool_destroy(fsdp_pool *pool)
{
    if (!pool)
        return;
    pool_stop_join(pool);
    FSDP_ASSERT(pool->head == NULL); /* a job was submitted and never waited for */
    pthread_cond_destroy(&pool->done_cv);
    pthread_cond_destroy(&pool->work_cv);
    pthread_mutex_destroy(&pool->mu);
    free(pool->threads);
    free(pool);
}

fsdp_status fsdp_pool_acquire(int n_busy, fsdp_pool **out)
{
    fsdp_status st = FSDP_STATUS_OK;
    pthread_mutex_lock(&g_pool_mu);
    if (!g_pool)
        st = fsdp_pool_create(fsdp_pool_default_threads(n_busy), &g_pool);
    if (st == FSDP_STATUS_OK)
        g_pool_refs++;
    *out = g_pool;
    pthread_mutex_unlock(&g_pool_mu);
    return st;
}

void fsdp_pool_release(fsdp_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&g_pool_mu);
    FSDP_ASSERT(pool == g_pool && g_pool_refs > 0);
    fsdp_pool *last = NULL;
    if (--g_pool_refs == 0) {
        last = g_pool;
        g_pool = NULL;
    }
    pthread_mutex_unlock(&g_pool_mu);
    fsdp_pool_destroy(last);
}

int fsdp_pool_n_workers(const fsdp_pool *pool) { return pool->n_workers; }

void fsdp_pool_submit(fsdp_pool *pool, fsdp_pool_job *job, fsdp_pool_chunk_fn fn, void *arg,
                      size_t n_chunks)
{
    job->fn = fn;
    job->arg = arg;
    job->n_chunks = n_chunks;
    atomic_init(&job->next_chunk, 0);
    job->n_active = 0;
    job->next = NULL;
    pthread_mutex_lock(&pool->mu);
    job->finished = n_chunks == 0;
    job->queued = n_chunks > 0;
    if (job->queued) {
        if (pool->tail)
            pool->tail->next = job;
        else
            pool->head = job;
        pool->tail = job;
        /* One chunk per worker would do, but a broadcast is simpler and jobs
         * are few and large. */
        pthread_cond_broadcast(&pool->work_cv);
    }
    pthread_mutex_unlock(&pool->mu);
}

void fsdp_pool_wait(fsdp_pool *pool, fsdp_pool_job *job)
{
    pthread_mutex_lock(&pool->mu);
    if (!job->finished && job_has_chunks(job)) {
        job->n_active++;
        pthread_mutex_unlock(&pool->mu);
        job_run(job);
        pthread_mutex_lock(&pool->mu);
        job_leave(pool, job);
    }
    while (!job->finished)
        pthread_cond_wait(&pool->done_cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

bool fsdp_pool_test(fsdp_pool *pool, fsdp_pool_job *job)
{
    pthread_mutex_lock(&pool->mu);
    bool done = job->finished;
    pthread_mutex_unlock(&pool->mu);
    return done;
}
