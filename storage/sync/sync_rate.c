#include "sync_rate.h"

void
sync_rate_init(struct sync_rate *r, uint64_t bytes_per_sec, uint64_t burst_ns)
{
    r->bytes_per_sec = bytes_per_sec;
    r->burst_ns = burst_ns;
    r->tat_ns = 0;
}

uint64_t
sync_rate_take(struct sync_rate *r, uint64_t now_ns, uint64_t n)
{
    uint64_t cost_ns;

    if (r->bytes_per_sec == 0)
        return 0;
    /* An idle sender earns no credit beyond the burst: restart the
     * virtual clock at now, so a long pause is not followed by a flood. */
    if (r->tat_ns < now_ns)
        r->tat_ns = now_ns;
    /* n is at most a few MiB per call; split the product so that
     * n * 1e9 cannot overflow for any n below 2^64 / 1e9 per part. */
    cost_ns = (n / r->bytes_per_sec) * 1000000000ULL +
              ((n % r->bytes_per_sec) * 1000000000ULL) / r->bytes_per_sec;
    r->tat_ns += cost_ns;
    if (r->tat_ns - now_ns <= r->burst_ns)
        return 0;
    return r->tat_ns - now_ns - r->burst_ns;
}
