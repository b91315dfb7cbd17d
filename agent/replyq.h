/*
 * replyq: how the request threads (pool.h) hand their reply frames back to
 * the server's loop, which alone owns the sockets: a locked list and an
 * eventfd the loop polls.  A reply names its connection by id, so a reply
 * for a connection closed meanwhile is dropped, never written elsewhere.
 */
#ifndef CP_REPLYQ_H
#define CP_REPLYQ_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct reply {
    uint64_t conn_id;
    uint8_t *buf;
    size_t len;
    struct reply *next;
};

struct replyq {
    pthread_mutex_t mu;
    struct reply *head, *tail;
    int evfd;                   /* readable while replies wait */
};

/* 0, or -1 (errno) when the eventfd cannot be made. */
int replyq_init(struct replyq *q);
/* Any thread: queues buf (taken over) for connection conn_id. */
void replyq_post(struct replyq *q, uint64_t conn_id, uint8_t *buf,
                 size_t len);
/* The loop: every waiting reply, oldest first (free each with
 * replyq_free). */
struct reply *replyq_take(struct replyq *q);
void replyq_free(struct reply *r);
/* Frees what still waits and closes the eventfd. */
void replyq_destroy(struct replyq *q);

#endif
