/*
 * pool: a fixed set of threads that run the requests' handlers, fed by a
 * bounded queue.  The server submits each valid request here instead of
 * starting a thread per request, so a flood of requests costs at most
 * `workers` threads and `queue` waiting items; beyond that pool_submit
 * refuses at once and the server answers BUSY.
 */
#ifndef CP_POOL_H
#define CP_POOL_H

#include <pthread.h>
#include <stddef.h>

typedef void pool_fn(void *arg);

struct pool_item {
    pool_fn *fn;
    void *arg;
};

struct pool {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t *threads;
    int nthreads;
    struct pool_item *items;    /* ring of cap items */
    size_t cap, head, len;
    int busy;                   /* items being run now */
    int stopping;
};

/* Starts workers threads over a queue of cap items; 0, or -1 (errno). */
int pool_start(struct pool *p, int workers, size_t cap);
/* Queues fn(arg); 0, or -1 if the queue is full (fn not called). */
int pool_submit(struct pool *p, pool_fn *fn, void *arg);
/* Lets the workers finish the queue, then joins them. */
void pool_stop(struct pool *p);

#endif
