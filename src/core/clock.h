/*
 * clock.h - the one clock used for durations (step times, plan wall time,
 * test timeouts): CLOCK_MONOTONIC, immune to wall-clock changes.
 */
#ifndef FSDP_CORE_CLOCK_H
#define FSDP_CORE_CLOCK_H

#include <time.h>

/* Seconds since an arbitrary fixed point; only differences mean anything. */
static inline double fsdp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* FSDP_CORE_CLOCK_H */
