/* replyq: see replyq.h. */
#include "replyq.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"

int
replyq_init(struct replyq *q)
{
    q->head = q->tail = NULL;
    q->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->evfd < 0)
        return -1;
    pthread_mutex_init(&q->mu, NULL);
    return 0;
}

void
replyq_post(struct replyq *q, uint64_t conn_id, uint8_t *buf, size_t len)
{
    struct reply *r = calloc(1, sizeof(*r));
    uint64_t one = 1;

    if (!r) {
        free(buf);
        return;
    }
    r->conn_id = conn_id;
    r->buf = buf;
    r->len = len;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    pthread_mutex_unlock(&q->mu);
    if (write(q->evfd, &one, sizeof(one)) < 0)
        log_warn("event=eventfd_write");
}

struct reply *
replyq_take(struct replyq *q)
{
    struct reply *r;
    uint64_t v;

    if (read(q->evfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        log_warn("event=eventfd_read");
    pthread_mutex_lock(&q->mu);
    r = q->head;
    q->head = q->tail = NULL;
    pthread_mutex_unlock(&q->mu);
    return r;
}

void
replyq_free(struct reply *r)
{
    free(r->buf);
    free(r);
}

void
replyq_destroy(struct replyq *q)
{
    if (q->evfd < 0)
        return;
    for (struct reply *r = q->head, *next; r; r = next) {
        next = r->next;
        replyq_free(r);
    }
    q->head = q->tail = NULL;
    close(q->evfd);
    q->evfd = -1;
    pthread_mutex_destroy(&q->mu);
}
