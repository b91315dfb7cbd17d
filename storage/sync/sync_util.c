#include "sync_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void
sync_seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void
sync_logkv(const struct sync_opts *o, const char *level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;

    if (o->on_log == NULL)
        return;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    o->on_log(level, line, o->arg);
}

void
sync_emit(const struct sync_opts *o, json_t *obj)
{
    char *s;

    if (obj == NULL)
        return;
    if (o->on_event != NULL) {
        s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (s != NULL)
            o->on_event(s, o->arg);
        free(s);
    }
    json_decref(obj);
}

uint64_t
sync_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void
sync_phase_end(struct sync_result *r, int ph, uint64_t *since)
{
    uint64_t t = sync_now_ns();

    r->phase_ms[ph] += (double)(t - *since) / 1e6;
    *since = t;
}

int
sync_start_or_run(pthread_t *t, void *(*fn)(void *), void *arg)
{
    if (pthread_create(t, NULL, fn, arg) == 0)
        return 1;
    fn(arg);
    return 0;
}
