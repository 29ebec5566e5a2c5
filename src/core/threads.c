/*
 * threads.c - ending helper threads (threads.h).
 */
#include "core/threads.h"

void fsdp_threads_stop(pthread_mutex_t *mu, pthread_cond_t *cv, bool *stop,
                       const pthread_t *threads, int n)
{
    pthread_mutex_lock(mu);
    *stop = true;
    pthread_cond_broadcast(cv);
    pthread_mutex_unlock(mu);
    for (int i = 0; i < n; i++)
        pthread_join(threads[i], NULL);
}
