/*
 * sync_util: what every part of cutpoint-sync shares: the error buffer,
 * the key=value log line, the JSON event, the monotonic clock and the
 * phase timer of a run.
 */
#ifndef CUTPOINT_SYNC_UTIL_H
#define CUTPOINT_SYNC_UTIL_H

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "sync_engine.h"

/* Format a message into the caller's err (nothing if err is NULL or
 * errlen 0). */
void sync_seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Pass one key=value log line to o->on_log (if any). */
void sync_logkv(const struct sync_opts *o, const char *level,
                const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Pass obj as one compact JSON line to o->on_event (if any); takes the
 * reference to obj over (NULL is ignored). */
void sync_emit(const struct sync_opts *o, json_t *obj);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t sync_now_ns(void);

/* Charge the time since *since to phase ph of r and restart the clock. */
void sync_phase_end(struct sync_result *r, int ph, uint64_t *since);

/* Run fn(arg) on a new thread (returns 1: join *t later); if none can be
 * started, right here (returns 0). */
int sync_start_or_run(pthread_t *t, void *(*fn)(void *), void *arg);

#endif
