/*
 * kv_server: the ZHT instance.  An epoll loop (ZHT section 2.2.4) serves
 * clients on the main port for the partitions this node is primary of;
 * a replica thread serves the primaries of other nodes on port + 1 for
 * the partitions this node is secondary of.
 *
 * Write path of a mutation on partition p (section 2.2.7, made durable):
 *
 *   client --req--> primary: log record, fsync, apply
 *                    primary --REPL--> secondary: log, fsync, apply
 *                    primary <--OK---- secondary
 *   client <--OK--- primary
 *
 * so an acknowledged operation is on the disks of both replicas.  The
 * main loop blocks while it forwards; it never waits on its own replica
 * thread, and a replica thread never waits on anyone, so two nodes that
 * are each other's secondaries cannot deadlock.
 *
 * Cold restart: load the membership table, replay every partition,
 * start the replica thread, reconcile each primary partition with its
 * secondary (the newer state of each key wins, in both directions),
 * then serve.
 */
#include "kv_part.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

struct conn {
    int fd;
    struct wl_buf in, out;
    int dead;
};

struct waiter {                  /* a pending callback (section 2.2.1) */
    struct waiter *next;
    struct conn *c;
    int part;
    uint8_t *key, *expected;
    uint32_t klen, elen;
    uint64_t deadline;
};

struct server {
    struct kv_config *c;
    struct wl_dev *dev;
    struct kv_part *parts;
    struct waiter *waiters;
    int ep;
};

static uint32_t epoch32(const struct server *s)
{
    return (uint32_t)s->c->epoch;
}

static void reply(struct conn *c, uint8_t st, uint32_t epoch, uint64_t seq,
                  const void *val, uint32_t vlen)
{
    struct wl_buf b = { 0 };
    uint8_t l[4];

    if (kv_rep_encode(st, epoch, seq, val, vlen, &b) == 0) {
        wl_put32(l, (uint32_t)b.len);
        if (wl_buf_add(&c->out, l, 4) < 0 ||
            wl_buf_add(&c->out, b.p, b.len) < 0)
            c->dead = 1;
    }
    wl_buf_free(&b);
}

static void conn_flush(struct server *s, struct conn *c);

static void table_text(const struct kv_config *c, struct wl_buf *out)
{
    char line[128];
    int n = snprintf(line, sizeof(line), "epoch=%llu nodes=%d parts=%d",
                     (unsigned long long)c->epoch, c->nnodes, c->nparts);
    wl_buf_add(out, line, (size_t)n);
    for (int i = 0; i < c->nnodes; i++) {
        n = snprintf(line, sizeof(line), " %s:%d", c->members[i].addr.host,
                     c->members[i].addr.port);
        wl_buf_add(out, line, (size_t)n);
    }
}

/* ---- reconciliation (primary side) ---- */

static int repl_call(struct server *s, struct kv_part *p,
                     const struct kv_req *rq, uint8_t *status,
                     uint64_t *seq, uint8_t **val, uint32_t *vlen)
{
    struct wl_buf b = { 0 };
    uint8_t *body = NULL;
    uint32_t len;
    int rc = -1;

    if (p->repl_fd < 0) {
        struct wl_addr a = s->c->members[kv_secondary_of(s->c, p->id)].addr;
        a.port += 1;
        p->repl_fd = wl_connect(&a, 2000);
        if (p->repl_fd < 0)
            goto cleanup;
        wl_set_timeouts(p->repl_fd, 30000);
    }
    if (kv_req_encode(rq, &b) < 0 ||
        wl_frame_send(p->repl_fd, b.p, (uint32_t)b.len) < 0 ||
        wl_frame_recv(p->repl_fd, &body, &len, KV_MAX_FRAME) < 0 ||
        len < KV_REP_HDR || wl_get32(body + 16) != len - KV_REP_HDR)
        goto cleanup;
    *status = body[0];
    *seq = wl_get64(body + 8);
    if (val) {
        *vlen = len - KV_REP_HDR;
        *val = malloc(*vlen ? *vlen : 1);
        if (!*val)
            goto cleanup;
        memcpy(*val, body + KV_REP_HDR, *vlen);
    }
    rc = 0;
cleanup:
    if (rc < 0 && p->repl_fd >= 0) {
        close(p->repl_fd);
        p->repl_fd = -1;
    }
    free(body);
    wl_buf_free(&b);
    return rc;
}

/* Expects p->mu held. */
static int reconcile(struct server *s, struct kv_part *p)
{
    uint8_t last[8], st = 0, *theirs = NULL;
    uint32_t tlen = 0;
    uint64_t sec_last = 0;
    struct wl_buf mine = { 0 };
    int took, rc = -1;

    wl_put64(last, p->last);
    struct kv_req rq = { .op = KV_OP_SYNC, .epoch = epoch32(s),
                         .opid = (uint64_t)p->id, .val = last, .vlen = 8 };
    if (repl_call(s, p, &rq, &st, &sec_last, &theirs, &tlen) < 0 ||
        st != KV_OK)
        goto cleanup;
    took = kv_part_load_dump(p, theirs, tlen);
    if (took < 0 || kv_part_sync(p) < 0)
        goto cleanup;
    if (kv_part_dump(p, sec_last, &mine) < 0)
        goto cleanup;
    struct kv_req rs = { .op = KV_OP_RSYNC, .epoch = epoch32(s),
                         .opid = (uint64_t)p->id, .val = mine.p,
                         .vlen = (uint32_t)mine.len };
    uint64_t dummy;
    if (repl_call(s, p, &rs, &st, &dummy, NULL, NULL) < 0 || st != KV_OK)
        goto cleanup;
    wl_log("partition %d reconciled: took %d from secondary (its last %llu), "
           "sent %zu bytes, last %llu", p->id, took,
           (unsigned long long)sec_last, mine.len,
           (unsigned long long)p->last);
    p->need_sync = 0;
    rc = 0;
cleanup:
    free(theirs);
    wl_buf_free(&mine);
    return rc;
}

/* ---- primary write path ---- */

static uint8_t mutate(struct server *s, struct kv_part *p, uint8_t kind,
                      const struct kv_req *rq, const uint8_t *val,
                      uint32_t vlen, uint64_t *seq)
{
    struct wl_buf b = { 0 };
    uint8_t st = KV_ERROR, rst = 0;
    uint64_t rseq;

    if (p->need_sync && reconcile(s, p) < 0)
        goto cleanup;
    struct kv_rec r = { .seq = p->last + 1, .opid = rq->opid, .kind = kind,
                        .klen = rq->klen, .vlen = vlen, .key = rq->key,
                        .val = val };
    /* durable here before it goes anywhere else */
    if (kv_part_take(p, &r) != 1 || kv_part_sync(p) < 0)
        wl_fatal("partition %d: cannot log seq %llu", p->id,
                 (unsigned long long)r.seq);
    *seq = r.seq;
    if (kv_secondary_of(s->c, p->id) < 0) {
        st = KV_OK;
        goto cleanup;
    }
    if (kv_rec_encode(&r, &b) < 0)
        goto cleanup;
    struct kv_req fw = { .op = KV_OP_REPL, .epoch = epoch32(s),
                         .opid = (uint64_t)p->id, .val = b.p,
                         .vlen = (uint32_t)b.len };
    if (repl_call(s, p, &fw, &rst, &rseq, NULL, NULL) < 0 || rst != KV_OK) {
        /* not acknowledged; the secondary must catch up before the next
         * write of this partition */
        p->need_sync = 1;
        goto cleanup;
    }
    st = KV_OK;
cleanup:
    wl_buf_free(&b);
    return st;
}

static int value_is(const struct kv_entry *e, const uint8_t *v, uint32_t vl)
{
    return e && !e->dead && e->vlen == vl && memcmp(e->val, v, vl) == 0;
}

static void wake_waiters(struct server *s, int part, const uint8_t *key,
                         uint32_t klen)
{
    struct kv_part *p = &s->parts[part];

    for (struct waiter **w = &s->waiters; *w;) {
        struct waiter *x = *w;
        if (x->part == part && x->klen == klen &&
            memcmp(x->key, key, klen) == 0 &&
            value_is(kv_part_find(p, key, klen), x->expected, x->elen)) {
            reply(x->c, KV_OK, epoch32(s), p->last, x->expected, x->elen);
            conn_flush(s, x->c);
            *w = x->next;
            free(x->key);
            free(x->expected);
            free(x);
            continue;
        }
        w = &x->next;
    }
}

static void handle(struct server *s, struct conn *c, const uint8_t *body,
                   uint32_t len)
{
    struct kv_req rq;
    struct kv_part *p;
    struct kv_entry *e;
    uint64_t seq = 0;
    uint8_t st;
    int part;

    if (kv_req_decode(body, len, &rq) < 0) {
        reply(c, KV_ERROR, epoch32(s), 0, "bad frame", 9);
        c->dead = 1;
        return;
    }
    if (rq.op == KV_OP_TABLE) {
        struct wl_buf t = { 0 };
        table_text(s->c, &t);
        reply(c, KV_OK, epoch32(s), 0, t.p, (uint32_t)t.len);
        wl_buf_free(&t);
        return;
    }
    if (rq.op == KV_OP_DIGEST) {
        uint8_t d[8];
        if (rq.opid >= (uint64_t)s->c->nparts ||
            s->parts[rq.opid].role == KV_ROLE_NONE) {
            reply(c, KV_NOT_OWNER, epoch32(s), 0, NULL, 0);
            return;
        }
        p = &s->parts[rq.opid];
        pthread_mutex_lock(&p->mu);
        wl_put64(d, kv_part_digest(p));
        seq = p->last;
        pthread_mutex_unlock(&p->mu);
        reply(c, KV_OK, epoch32(s), seq, d, 8);
        return;
    }
    if (rq.op > KV_OP_CALLBACK) {
        reply(c, KV_ERROR, epoch32(s), 0, "wrong port", 10);
        return;
    }
    /* lazy client update of the membership table, section 2.2.3 */
    if (rq.epoch != epoch32(s)) {
        struct wl_buf t = { 0 };
        table_text(s->c, &t);
        reply(c, KV_WRONG_EPOCH, epoch32(s), 0, t.p, (uint32_t)t.len);
        wl_buf_free(&t);
        return;
    }
    part = kv_partition_of(s->c, rq.key, rq.klen);
    if (kv_primary_of(s->c, part) != s->c->node) {
        reply(c, KV_NOT_OWNER, epoch32(s), 0, NULL, 0);
        return;
    }
    p = &s->parts[part];
    pthread_mutex_lock(&p->mu);
    e = kv_part_find(p, rq.key, rq.klen);
    switch (rq.op) {
    case KV_OP_INSERT:
        st = mutate(s, p, KV_PUT, &rq, rq.val, rq.vlen, &seq);
        reply(c, st, epoch32(s), seq, NULL, 0);
        break;
    case KV_OP_APPEND:
        st = mutate(s, p, KV_APPEND, &rq, rq.val, rq.vlen, &seq);
        reply(c, st, epoch32(s), seq, NULL, 0);
        break;
    case KV_OP_REMOVE:
        if (!e || e->dead) {
            reply(c, KV_NOTFOUND, epoch32(s), p->last, NULL, 0);
            break;
        }
        st = mutate(s, p, KV_DEL, &rq, NULL, 0, &seq);
        reply(c, st, epoch32(s), seq, NULL, 0);
        break;
    case KV_OP_LOOKUP:
        if (!e || e->dead)
            reply(c, KV_NOTFOUND, epoch32(s), p->last, NULL, 0);
        else
            reply(c, KV_OK, epoch32(s), e->seq, e->val, e->vlen);
        break;
    case KV_OP_CSWAP:
        /* server-side atomic compare and swap, Algorithm 2.2 */
        if (!(value_is(e, rq.val, rq.vlen) || (rq.vlen == 0 && (!e || e->dead)))) {
            if (e && !e->dead)
                reply(c, KV_MISMATCH, epoch32(s), e->seq, e->val, e->vlen);
            else
                reply(c, KV_MISMATCH, epoch32(s), p->last, NULL, 0);
            break;
        }
        st = mutate(s, p, KV_PUT, &rq, rq.val2, rq.v2len, &seq);
        reply(c, st, epoch32(s), seq, NULL, 0);
        break;
    case KV_OP_CALLBACK: {
        /* Algorithm 2.3, with the wait moved into the event loop */
        if (value_is(e, rq.val, rq.vlen)) {
            reply(c, KV_OK, epoch32(s), e->seq, e->val, e->vlen);
            break;
        }
        struct waiter *w = calloc(1, sizeof(*w));
        if (!w || !(w->key = malloc(rq.klen + 1)) ||
            !(w->expected = malloc(rq.vlen + 1))) {
            if (w)
                free(w->key);
            free(w);
            reply(c, KV_ERROR, epoch32(s), 0, "oom", 3);
            break;
        }
        memcpy(w->key, rq.key, rq.klen);
        memcpy(w->expected, rq.val, rq.vlen);
        w->klen = rq.klen;
        w->elen = rq.vlen;
        w->c = c;
        w->part = part;
        w->deadline = wl_now_ms() + rq.timeout_ms;
        w->next = s->waiters;
        s->waiters = w;
        break;
    }
    }
    pthread_mutex_unlock(&p->mu);
    if (rq.op == KV_OP_INSERT || rq.op == KV_OP_APPEND ||
        rq.op == KV_OP_REMOVE || rq.op == KV_OP_CSWAP)
        wake_waiters(s, part, rq.key, rq.klen);
}

/* ---- replica thread (secondary side) ---- */

struct rconn {
    struct server *s;
    int fd;
};

static uint8_t replica_handle(struct server *s, const struct kv_req *rq,
                              struct wl_buf *val, uint64_t *seq)
{
    struct kv_part *p;
    struct kv_rec r;
    uint8_t st = KV_ERROR;

    if (rq->opid >= (uint64_t)s->c->nparts)
        return KV_NOT_OWNER;
    p = &s->parts[rq->opid];
    if (rq->op != KV_OP_DIGEST && p->role != KV_ROLE_SECONDARY)
        return KV_NOT_OWNER;
    pthread_mutex_lock(&p->mu);
    switch (rq->op) {
    case KV_OP_REPL:
        if (kv_rec_decode(rq->val, rq->vlen, &r) < 0)
            break;
        if (r.seq <= p->last) {          /* duplicate: already durable */
            st = KV_OK;
            break;
        }
        if (r.seq != p->last + 1) {      /* FIFO broken: needs a SYNC */
            wl_buf_add(val, "gap", 3);
            break;
        }
        if (kv_part_take(p, &r) != 1 || kv_part_sync(p) < 0)
            wl_fatal("partition %d: cannot log replica seq %llu", p->id,
                     (unsigned long long)r.seq);
        st = KV_OK;
        break;
    case KV_OP_SYNC:
        if (rq->vlen != 8)
            break;
        if (kv_part_dump(p, wl_get64(rq->val), val) == 0)
            st = KV_OK;
        break;
    case KV_OP_RSYNC:
        if (kv_part_load_dump(p, rq->val, rq->vlen) >= 0 &&
            kv_part_sync(p) == 0)
            st = KV_OK;
        break;
    case KV_OP_DIGEST: {
        uint8_t d[8];
        wl_put64(d, kv_part_digest(p));
        wl_buf_add(val, d, 8);
        st = KV_OK;
        break;
    }
    default:
        wl_buf_add(val, "wrong port", 10);
    }
    *seq = p->last;
    pthread_mutex_unlock(&p->mu);
    return st;
}

static void *replica_conn(void *arg)
{
    struct rconn *rc = arg;
    uint8_t *body = NULL;
    uint32_t len;

    while (wl_frame_recv(rc->fd, &body, &len, KV_MAX_FRAME) == 0) {
        struct kv_req rq;
        struct wl_buf val = { 0 }, out = { 0 };
        uint64_t seq = 0;
        uint8_t st;
        if (kv_req_decode(body, len, &rq) < 0)
            st = KV_ERROR;
        else
            st = replica_handle(rc->s, &rq, &val, &seq);
        free(body);
        body = NULL;
        if (kv_rep_encode(st, epoch32(rc->s), seq, val.p,
                          (uint32_t)val.len, &out) < 0 ||
            wl_frame_send(rc->fd, out.p, (uint32_t)out.len) < 0) {
            wl_buf_free(&val);
            wl_buf_free(&out);
            break;
        }
        wl_buf_free(&val);
        wl_buf_free(&out);
    }
    free(body);
    close(rc->fd);
    free(rc);
    return NULL;
}

static void *replica_main(void *arg)
{
    struct server *s = arg;
    struct wl_addr a = s->c->members[s->c->node].addr;
    int lfd = wl_listen(a.host, a.port + 1);

    if (lfd < 0)
        wl_fatal("replica listen %s:%d: %s", a.host, a.port + 1,
                 strerror(errno));
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        pthread_t t;
        if (fd < 0)
            continue;
        struct rconn *rc = malloc(sizeof(*rc));
        if (!rc) {
            close(fd);
            continue;
        }
        rc->s = s;
        rc->fd = fd;
        if (pthread_create(&t, NULL, replica_conn, rc) != 0) {
            close(fd);
            free(rc);
            continue;
        }
        pthread_detach(t);
    }
    return NULL;
}

/* ---- epoll main loop ---- */

static void conn_flush(struct server *s, struct conn *c)
{
    struct epoll_event ev = { .data.ptr = c };

    while (c->out.len > 0) {
        ssize_t n = send(c->fd, c->out.p, c->out.len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0) {
            c->dead = 1;
            return;
        }
        memmove(c->out.p, c->out.p + n, c->out.len - (size_t)n);
        c->out.len -= (size_t)n;
    }
    ev.events = EPOLLIN | (c->out.len ? EPOLLOUT : 0);
    epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_close(struct server *s, struct conn *c)
{
    for (struct waiter **w = &s->waiters; *w;) {
        struct waiter *x = *w;
        if (x->c == c) {
            *w = x->next;
            free(x->key);
            free(x->expected);
            free(x);
            continue;
        }
        w = &x->next;
    }
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    wl_buf_free(&c->in);
    wl_buf_free(&c->out);
    free(c);
}

static void conn_read(struct server *s, struct conn *c)
{
    uint8_t buf[65536];

    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0) {
            c->dead = 1;
            return;
        }
        if (wl_buf_add(&c->in, buf, (size_t)n) < 0) {
            c->dead = 1;
            return;
        }
    }
    size_t pos = 0;
    while (c->in.len - pos >= 4 && !c->dead) {
        uint32_t l = wl_get32(c->in.p + pos);
        if (l > KV_MAX_FRAME) {
            c->dead = 1;
            return;
        }
        if (c->in.len - pos - 4 < l)
            break;
        handle(s, c, c->in.p + pos + 4, l);
        pos += 4 + (size_t)l;
    }
    memmove(c->in.p, c->in.p + pos, c->in.len - pos);
    c->in.len -= pos;
}

static int expire_waiters(struct server *s)
{
    uint64_t now = wl_now_ms(), next = UINT64_MAX;

    for (struct waiter **w = &s->waiters; *w;) {
        struct waiter *x = *w;
        if (x->deadline <= now) {
            reply(x->c, KV_TIMEOUT, epoch32(s), 0, NULL, 0);
            conn_flush(s, x->c);
            *w = x->next;
            free(x->key);
            free(x->expected);
            free(x);
            continue;
        }
        if (x->deadline < next)
            next = x->deadline;
        w = &x->next;
    }
    return next == UINT64_MAX ? 1000 : (int)(next - now);
}

int kv_server_run(struct kv_config *c, struct wl_dev *dev, const char *bind)
{
    struct server s = { .c = c, .dev = dev };
    struct epoll_event ev, evs[64];
    pthread_t rt;
    int lfd;

    s.parts = calloc((size_t)c->nparts, sizeof(*s.parts));
    if (!s.parts)
        wl_fatal("out of memory");
    for (int p = 0; p < c->nparts; p++) {
        enum kv_role role = kv_primary_of(c, p) == c->node ? KV_ROLE_PRIMARY
                          : kv_secondary_of(c, p) == c->node
                              ? KV_ROLE_SECONDARY : KV_ROLE_NONE;
        if (kv_part_open(&s.parts[p], p, role, dev, kv_region_base(c, p),
                         c->region_size) < 0)
            wl_fatal("partition %d: cannot load its log", p);
        if (role != KV_ROLE_NONE)
            wl_log("partition %d (%s) loaded: %zu keys, last seq %llu", p,
                   role == KV_ROLE_PRIMARY ? "primary" : "secondary",
                   s.parts[p].n, (unsigned long long)s.parts[p].last);
    }
    if (pthread_create(&rt, NULL, replica_main, &s) != 0)
        wl_fatal("cannot start the replica thread");
    /* reconcile replicas before serving (cold restart) */
    uint64_t until = wl_now_ms() + 60000;
    for (int p = 0; p < c->nparts; p++) {
        struct kv_part *pp = &s.parts[p];
        if (pp->role != KV_ROLE_PRIMARY || kv_secondary_of(c, p) < 0)
            continue;
        pthread_mutex_lock(&pp->mu);
        while (reconcile(&s, pp) < 0) {
            if (wl_now_ms() > until) {
                wl_log("partition %d: secondary unreachable, serving "
                       "without it for now", p);
                pp->need_sync = 1;
                break;
            }
            wl_sleep_ms(200);
        }
        pthread_mutex_unlock(&pp->mu);
    }
    lfd = wl_listen(bind, c->members[c->node].addr.port);
    if (lfd < 0)
        wl_fatal("listen %s:%d: %s", bind, c->members[c->node].addr.port,
                 strerror(errno));
    wl_set_nonblock(lfd);
    s.ep = epoll_create1(EPOLL_CLOEXEC);
    ev.events = EPOLLIN;
    ev.data.ptr = NULL;
    epoll_ctl(s.ep, EPOLL_CTL_ADD, lfd, &ev);
    wl_log("kvstore node %d serving on %s:%d (epoch %llu)", c->node, bind,
           c->members[c->node].addr.port, (unsigned long long)c->epoch);
    for (;;) {
        int n = epoll_wait(s.ep, evs, 64, expire_waiters(&s));
        for (int i = 0; i < n; i++) {
            struct conn *cn = evs[i].data.ptr;
            if (!cn) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL,
                                     SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
                    struct conn *nc = calloc(1, sizeof(*nc));
                    if (!nc) {
                        close(fd);
                        continue;
                    }
                    nc->fd = fd;
                    ev.events = EPOLLIN;
                    ev.data.ptr = nc;
                    epoll_ctl(s.ep, EPOLL_CTL_ADD, fd, &ev);
                }
                continue;
            }
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                conn_read(&s, cn);
            /* flush even a connection about to close: a refused frame
             * still gets its error reply */
            if (cn->out.len)
                conn_flush(&s, cn);
            if (cn->dead)
                conn_close(&s, cn);
        }
    }
    return 0;
}
