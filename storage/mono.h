/* mono: the monotonic clock in milliseconds (agent-protocol §3.6). */
#ifndef CP_MONO_H
#define CP_MONO_H

#include <time.h>

static inline double
mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif
