/*
 * sl_storage: a Scalog storage server (section 3.2, 3.3).
 *
 * Append path (Figure 3.2):
 *   1 client APPEND --> write to own segment (not yet durable)
 *   2 committer: group-commit fsync --> own durable count
 *                then FIFO-replicate the durable records to the shard
 *                peer, which logs and fsyncs them before answering
 *   3 reporter: every interval, local cut (own durable, backup durable)
 *                to every ordering replica; the reply brings new commits
 *   4 a committed global cut covers the record --> gsn known
 *   5 reply to the client with (gsn, shard)
 *
 * A record therefore counts in a cut only once it is on both disks of
 * its shard.  Threads: one per connection, the committer, the reporter;
 * one mutex and one condition variable guard everything.
 */
#include "sl.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct seg {
    struct rlog log;
    uint8_t **rec;
    uint32_t *len;
    size_t n, cap;
    uint64_t durable;
};

struct storage {
    struct sl_config *c;
    int id, peer, shard;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct seg own, bak;
    struct sl_view view;
    int64_t backup_acked;        /* -1: unknown, ask the peer */
    int ofds[SL_NORDER];
    int pfd;
};

static int seg_push(struct seg *s, const uint8_t *p, uint32_t len)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 1024;
        uint8_t **r = realloc(s->rec, nc * sizeof(*r));
        if (!r)
            return -1;
        s->rec = r;
        uint32_t *l = realloc(s->len, nc * sizeof(*l));
        if (!l)
            return -1;
        s->len = l;
        s->cap = nc;
    }
    if (!(s->rec[s->n] = malloc(len ? len : 1)))
        return -1;
    memcpy(s->rec[s->n], p, len);
    s->len[s->n++] = len;
    return 0;
}

static int seg_cb(void *arg, const uint8_t *p, uint32_t len)
{
    return len < 12 ? -1 : seg_push(arg, p, len);
}

/* Appends to a segment's log and memory.  Expects st->mu held. */
static int seg_append(struct seg *s, const uint8_t *p, uint32_t len)
{
    if (rlog_append(&s->log, p, len) != 0)
        return -1;
    return seg_push(s, p, len);
}

static void cond_wait_ms(struct storage *st, int ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_cond_timedwait(&st->cv, &st->mu, &ts);
}

/* ---- committer: group commit, then FIFO replication ---- */

static void replicate(struct storage *st)
{
    struct wl_buf recs = { 0 };
    struct sl_msg req = { .type = SL_REPLICATE, .a = (uint32_t)st->id }, rep;
    uint8_t *body = NULL;

    if (st->pfd < 0) {
        struct wl_addr a = st->c->addrs[st->peer];
        st->pfd = wl_connect(&a, 300);
        if (st->pfd < 0)
            return;
        wl_set_timeouts(st->pfd, 5000);
        st->backup_acked = -1;
    }
    pthread_mutex_lock(&st->mu);
    uint64_t from = st->backup_acked < 0 ? 0 : (uint64_t)st->backup_acked;
    /* only durable records leave this server, so the backup can never
     * hold a record that the primary might lose */
    for (uint64_t i = from; st->backup_acked >= 0 && i < st->own.durable &&
                            recs.len < (1U << 20); i++) {
        uint8_t l[4];
        wl_put32(l, st->own.len[i]);
        wl_buf_add(&recs, l, 4);
        wl_buf_add(&recs, st->own.rec[i], st->own.len[i]);
    }
    pthread_mutex_unlock(&st->mu);
    req.b = from;
    req.data = recs.p;
    req.dlen = (uint32_t)recs.len;
    if (sl_call(st->pfd, &req, &rep, &body) < 0) {
        close(st->pfd);
        st->pfd = -1;
    } else {
        pthread_mutex_lock(&st->mu);
        st->backup_acked = (int64_t)rep.b;
        pthread_mutex_unlock(&st->mu);
    }
    free(body);
    wl_buf_free(&recs);
}

static void *committer(void *arg)
{
    struct storage *st = arg;

    for (;;) {
        pthread_mutex_lock(&st->mu);
        while (st->own.n == st->own.durable &&
               st->backup_acked >= (int64_t)st->own.durable)
            cond_wait_ms(st, 50);
        uint64_t n = st->own.n;
        int need_sync = n > st->own.durable;
        pthread_mutex_unlock(&st->mu);
        if (need_sync) {
            if (rlog_sync(&st->own.log) < 0)
                wl_fatal("storage %d: fsync failed", st->id);
            pthread_mutex_lock(&st->mu);
            st->own.durable = n;
            pthread_mutex_unlock(&st->mu);
        }
        replicate(st);
        if (st->pfd < 0)
            wl_sleep_ms(100);
    }
    return NULL;
}

/* ---- reporter: local cuts up, committed entries down ---- */

static void take_entries(struct storage *st, const uint8_t *p, uint32_t len)
{
    for (uint32_t pos = 0; pos + 12 <= len;) {
        uint64_t slot = wl_get64(p + pos);
        uint32_t l = wl_get32(p + pos + 8);
        if (pos + 12 + l > len)
            break;
        if (slot == st->view.last_slot + 1 &&
            sl_view_apply(&st->view, slot, p + pos + 12, l) < 0)
            wl_fatal("storage %d: committed slot %llu does not apply",
                     st->id, (unsigned long long)slot);
        pos += 12 + l;
    }
}

static void *reporter(void *arg)
{
    struct storage *st = arg;

    for (;;) {
        wl_sleep_ms((unsigned)st->c->interval_ms);
        for (int j = 0; j < sl_norder(st->c); j++) {
            struct sl_msg req = { .type = SL_REPORT, .a = (uint32_t)st->id },
                          rep;
            uint8_t *body = NULL;
            if (st->ofds[j] < 0) {
                struct wl_addr a = st->c->addrs[j];
                a.port += 1;
                st->ofds[j] = wl_connect(&a, 300);
                if (st->ofds[j] < 0)
                    continue;
                wl_set_timeouts(st->ofds[j], 3000);
            }
            pthread_mutex_lock(&st->mu);
            req.b = st->view.last_slot;
            req.c = st->own.durable;
            req.d = st->bak.durable;
            pthread_mutex_unlock(&st->mu);
            if (sl_call(st->ofds[j], &req, &rep, &body) < 0) {
                close(st->ofds[j]);
                st->ofds[j] = -1;
                continue;
            }
            pthread_mutex_lock(&st->mu);
            uint64_t before = st->view.last_slot;
            take_entries(st, rep.data, rep.dlen);
            if (st->view.last_slot != before)
                pthread_cond_broadcast(&st->cv);
            pthread_mutex_unlock(&st->mu);
            free(body);
        }
    }
    return NULL;
}

/* ---- request handlers (st->mu held) ---- */

static uint8_t h_append(struct storage *st, const struct sl_msg *m,
                        struct sl_msg *r)
{
    uint64_t idx, deadline = wl_now_ms() + 30000;

    if (m->c != (uint64_t)st->shard)
        return SL_WRONG_SHARD;
    if (sl_view_finalized(&st->view, st->shard))
        return SL_FINALIZED;
    if (m->dlen < 12 || seg_append(&st->own, m->data, m->dlen) < 0)
        return SL_ERROR;
    idx = st->own.n - 1;
    pthread_cond_broadcast(&st->cv);        /* wake the committer */
    /* step 5: answer only once a committed cut covers the record */
    for (;;) {
        int64_t g = sl_view_gsn(&st->view, st->id, idx);
        if (g >= 0) {
            r->b = (uint64_t)g;
            r->a = (uint32_t)st->shard;
            return SL_OK;
        }
        if (sl_view_finalized(&st->view, st->shard))
            return SL_FINALIZED;
        if (wl_now_ms() > deadline)
            return SL_TIMEOUT;
        cond_wait_ms(st, 100);
    }
}

static uint8_t h_replicate(struct storage *st, const struct sl_msg *m,
                           struct sl_msg *r)
{
    uint64_t i = m->b;
    uint8_t st8 = SL_OK;

    if (m->a != (uint32_t)st->peer)
        return SL_ERROR;
    for (uint32_t pos = 0; pos + 4 <= m->dlen; i++) {
        uint32_t l = wl_get32(m->data + pos);
        const uint8_t *p = m->data + pos + 4;
        if (pos + 4 + l > m->dlen) {
            st8 = SL_ERROR;
            break;
        }
        pos += 4 + l;
        if (i < st->bak.n) {
            if (l != st->bak.len[i] || memcmp(p, st->bak.rec[i], l)) {
                wl_log("storage %d: backup of segment %d differs at %llu",
                       st->id, st->peer, (unsigned long long)i);
                st8 = SL_ERROR;
                break;
            }
            continue;
        }
        if (i > st->bak.n) {             /* FIFO broken: tell our count */
            st8 = SL_ERROR;
            break;
        }
        if (seg_append(&st->bak, p, l) < 0)
            wl_fatal("storage %d: backup segment full", st->id);
    }
    if (st->bak.n > st->bak.durable) {
        /* fsync before the count is reported anywhere */
        if (rlog_sync(&st->bak.log) < 0)
            wl_fatal("storage %d: fsync failed", st->id);
        st->bak.durable = st->bak.n;
    }
    r->b = st->bak.durable;
    return st8;
}

static const uint8_t *find(struct storage *st, uint64_t gsn, uint32_t *len,
                           uint8_t *status)
{
    int server;
    uint64_t idx;

    if (sl_view_locate(&st->view, gsn, &server, &idx) < 0) {
        *status = SL_ERROR;
        return NULL;
    }
    struct seg *s = server == st->id ? &st->own
                  : server == st->peer ? &st->bak : NULL;
    if (!s || idx >= s->n) {
        *status = SL_NOT_HERE;
        return NULL;
    }
    *len = s->len[idx];
    *status = SL_OK;
    return s->rec[idx];
}

static uint8_t h_read(struct storage *st, const struct sl_msg *m,
                      struct wl_buf *out, struct sl_msg *r)
{
    uint64_t deadline = wl_now_ms() + m->c;
    uint8_t status;
    uint32_t len;

    /* section 3.3.2: answer only once l <= l_max, so that a stale server
     * never claims a record does not exist */
    while (m->b >= sl_view_total(&st->view)) {
        if (wl_now_ms() >= deadline)
            return SL_TIMEOUT;
        cond_wait_ms(st, 50);
    }
    if (m->b < st->view.trim)
        return SL_TRIMMED;
    const uint8_t *p = find(st, m->b, &len, &status);
    if (p)
        wl_buf_add(out, p, len);
    r->a = (uint32_t)st->shard;
    return status;
}

static uint8_t h_subscribe(struct storage *st, const struct sl_msg *m,
                           struct wl_buf *out, struct sl_msg *r)
{
    uint64_t g = m->b < st->view.trim ? st->view.trim : m->b;
    uint64_t max = m->c ? m->c : 1000;

    if (g >= sl_view_total(&st->view))
        cond_wait_ms(st, 500);      /* long poll for the next cut */
    uint64_t total = sl_view_total(&st->view);
    for (uint64_t n = 0; g < total && n < max; g++) {
        uint8_t status, h[12];
        uint32_t len;
        const uint8_t *p = find(st, g, &len, &status);
        if (!p)
            continue;               /* another shard's record */
        wl_put64(h, g);
        wl_put32(h + 8, len);
        wl_buf_add(out, h, 12);
        wl_buf_add(out, p, len);
        n++;
    }
    r->b = g;
    r->c = total;
    r->d = st->view.trim;
    return SL_OK;
}

struct sconn {
    struct storage *st;
    int fd;
};

static void *storage_conn(void *arg)
{
    struct sconn *sc = arg;
    struct storage *st = sc->st;
    uint8_t *body = NULL;
    uint32_t len;

    while (wl_frame_recv(sc->fd, &body, &len, SL_MAX_FRAME) == 0) {
        struct sl_msg m, r = { 0 };
        struct wl_buf out = { 0 };
        if (sl_msg_decode(body, len, &m) < 0)
            break;
        r.type = m.type;
        pthread_mutex_lock(&st->mu);
        switch (m.type) {
        case SL_APPEND:
            r.status = h_append(st, &m, &r);
            break;
        case SL_REPLICATE:
            r.status = h_replicate(st, &m, &r);
            break;
        case SL_READ:
            r.status = h_read(st, &m, &out, &r);
            break;
        case SL_SUBSCRIBE:
            r.status = h_subscribe(st, &m, &out, &r);
            break;
        case SL_STATUS:
            r.b = sl_view_total(&st->view);
            r.c = st->view.last_slot;
            r.d = st->view.trim;
            r.a = (uint32_t)st->shard;
            break;
        default:
            r.status = SL_ERROR;
        }
        pthread_mutex_unlock(&st->mu);
        free(body);
        body = NULL;
        r.data = out.p;
        r.dlen = (uint32_t)out.len;
        int rc = sl_reply(sc->fd, &r);
        wl_buf_free(&out);
        if (rc < 0)
            break;
    }
    free(body);
    close(sc->fd);
    free(sc);
    return NULL;
}

int sl_storage_run(struct sl_config *c, struct wl_dev *dev)
{
    static struct storage st;
    pthread_t t;
    struct wl_addr a = c->addrs[c->node];
    int lfd;

    st.c = c;
    st.id = c->node;
    st.peer = sl_peer_of(c->node);
    st.shard = sl_shard_of(c->node);
    st.backup_acked = -1;
    st.pfd = -1;
    for (int j = 0; j < SL_NORDER; j++)
        st.ofds[j] = -1;
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    sl_view_init(&st.view, c->nnodes);
    if (rlog_open(&st.own.log, dev, sl_region_base(c, SL_REG_OWN),
                  c->region_size, 1, seg_cb, &st.own) < 0 ||
        rlog_open(&st.bak.log, dev, sl_region_base(c, SL_REG_BACKUP),
                  c->region_size, 1, seg_cb, &st.bak) < 0)
        wl_fatal("storage: cannot load segments");
    st.own.durable = st.own.n;
    st.bak.durable = st.bak.n;
    wl_log("storage %d (shard %d): own segment %zu records, backup of %d: "
           "%zu records", st.id, st.shard, st.own.n, st.peer, st.bak.n);
    lfd = wl_listen(a.host, a.port);
    if (lfd < 0)
        wl_fatal("storage listen %s:%d: %s", a.host, a.port,
                 strerror(errno));
    if (pthread_create(&t, NULL, committer, &st) != 0 ||
        pthread_create(&t, NULL, reporter, &st) != 0)
        wl_fatal("storage: cannot start threads");
    wl_log("storage %d serving on %s:%d", st.id, a.host, a.port);
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        struct sconn *sc;
        if (fd < 0)
            continue;
        if (!(sc = malloc(sizeof(*sc)))) {
            close(fd);
            continue;
        }
        sc->st = &st;
        sc->fd = fd;
        if (pthread_create(&t, NULL, storage_conn, sc) != 0) {
            close(fd);
            free(sc);
            continue;
        }
        pthread_detach(t);
    }
    return 0;
}
