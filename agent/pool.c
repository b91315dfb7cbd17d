/* pool: see pool.h. */
#include "pool.h"

#include <errno.h>
#include <stdlib.h>

static void *
worker(void *arg)
{
    struct pool *p = arg;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        struct pool_item it;

        while (p->len == 0 && !p->stopping)
            pthread_cond_wait(&p->cond, &p->mu);
        if (p->len == 0)
            break;
        it = p->items[p->head];
        p->head = (p->head + 1) % p->cap;
        p->len--;
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        it.fn(it.arg);
        pthread_mutex_lock(&p->mu);
        p->busy--;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int
pool_start(struct pool *p, int workers, size_t cap)
{
    p->items = calloc(cap, sizeof(*p->items));
    p->threads = calloc((size_t)workers, sizeof(*p->threads));
    p->cap = cap;
    p->head = p->len = 0;
    p->busy = p->stopping = 0;
    p->nthreads = 0;
    if (!p->items || !p->threads) {
        free(p->items);
        free(p->threads);
        errno = ENOMEM;
        return -1;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    for (int i = 0; i < workers; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
            pool_stop(p);
            errno = EAGAIN;
            return -1;
        }
        p->nthreads++;
    }
    return 0;
}

int
pool_submit(struct pool *p, pool_fn *fn, void *arg)
{
    int ret = -1;

    pthread_mutex_lock(&p->mu);
    if (!p->stopping && p->len < p->cap) {
        p->items[(p->head + p->len) % p->cap] = (struct pool_item){fn, arg};
        p->len++;
        pthread_cond_signal(&p->cond);
        ret = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return ret;
}

void
pool_stop(struct pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stopping = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->items);
    p->threads = NULL;
    p->items = NULL;
    p->nthreads = 0;
}
