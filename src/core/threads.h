/*
 * threads.h - ending helper threads that sleep on a condition variable
 * (the cpu device's team, the optimizer's worker pool, the watchdogs of
 * the process transports): one way to tell them and wait for them.
 */
#ifndef FSDP_CORE_THREADS_H
#define FSDP_CORE_THREADS_H

#include <pthread.h>
#include <stdbool.h>

/* Sets *stop under mu, wakes every thread waiting on cv, then joins
 * threads[0..n). The threads must read *stop under mu before each wait. */
void fsdp_threads_stop(pthread_mutex_t *mu, pthread_cond_t *cv, bool *stop,
                       const pthread_t *threads, int n);

#endif /* FSDP_CORE_THREADS_H */
