/*
 * clock.h - the one clock used for durations (step times, plan wall time,
 * test timeouts, timed waits on condition variables): CLOCK_MONOTONIC,
 * immune to wall-clock changes.
 */
#ifndef FSDP_CORE_CLOCK_H
#define FSDP_CORE_CLOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

/* Seconds between the progress lines of long work that prints nothing else
 * until it ends (the synthetic task's evaluation, fsdp eval). */
#define FSDP_PROGRESS_S 10.0

/* Seconds since an arbitrary fixed point; only differences mean anything. */
static inline double fsdp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* When long work started and when it last said how far it is. */
typedef struct fsdp_progress {
    double t0, last;
} fsdp_progress;

static inline fsdp_progress fsdp_progress_start(void)
{
    double t = fsdp_now_s();
    return (fsdp_progress){t, t};
}

/* Whether a progress line is due: `every` seconds since the last (or the
 * start), counted again from now when it is; *elapsed gets the seconds
 * since the start. */
static inline bool fsdp_progress_due(fsdp_progress *p, double every, double *elapsed)
{
    double t = fsdp_now_s();
    if (t - p->last < every)
        return false;
    p->last = t;
    *elapsed = t - p->t0;
    return true;
}

/* The same clock read cheaply, to a kernel tick (1-4 ms): for timestamps
 * taken on every collective that only reports read (the flight recorder's
 * "s ago"); compare it with itself only. */
static inline double fsdp_now_coarse_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Initialise cv so that its timed waits (fsdp_cond_wait_ns) count on this
 * clock. */
static inline void fsdp_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

/* With mu held, wait on cv (made by fsdp_cond_init_monotonic) until it is
 * signalled or ns nanoseconds have passed; like any condition wait it may
 * also return early, so callers re-check their condition. */
static inline void fsdp_cond_wait_ns(pthread_cond_t *cv, pthread_mutex_t *mu, long ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ns / 1000000000L;
    ts.tv_nsec += ns % 1000000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

#endif /* FSDP_CORE_CLOCK_H */
