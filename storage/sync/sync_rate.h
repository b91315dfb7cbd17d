/*
 * sync_rate: a rate limiter for cutpoint-sync (GCRA / virtual clock).
 *
 * The limiter keeps a "theoretical arrival time" (tat): the instant at
 * which everything debited so far would have finished at the configured
 * rate.  Debiting n bytes moves tat forward by n / rate; the caller must
 * wait until tat minus the allowed burst before it sends.  Time is passed
 * in by the caller so the limiter is pure and testable without sleeping.
 *
 * Not thread-safe: callers that share a limiter hold their own lock.
 */
#ifndef CUTPOINT_SYNC_RATE_H
#define CUTPOINT_SYNC_RATE_H

#include <stdint.h>

struct sync_rate {
    uint64_t bytes_per_sec;   /* 0 = unlimited */
    uint64_t burst_ns;        /* credit a sender may run ahead by */
    uint64_t tat_ns;          /* theoretical arrival time */
};

/* Configure a limiter; bytes_per_sec 0 disables limiting. */
void sync_rate_init(struct sync_rate *r, uint64_t bytes_per_sec,
                    uint64_t burst_ns);

/*
 * Debit n bytes at monotonic time now_ns.  Returns the number of
 * nanoseconds the caller must wait before sending them (0 = send now).
 */
uint64_t sync_rate_take(struct sync_rate *r, uint64_t now_ns, uint64_t n);

#endif
