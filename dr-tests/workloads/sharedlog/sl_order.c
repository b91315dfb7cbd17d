/*
 * sl_order: Scalog's ordering layer (section 3.2), three replicas running
 * Multi-Paxos over one log of commands (cuts, add/finalize shard, trim).
 *
 * The acceptor and leader state machine is drawn in sl.h.
 *
 * The cut: for server i, min(i's own durable count, its shard peer's
 * durable count of i's segment), the element-wise minimum of section
 * 3.3.1, never below the previous cut (cuts are monotonic).
 */
#include "sl.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct slotval {
    uint64_t ballot;             /* accepted ballot (0: none) */
    uint8_t *val;
    uint32_t len;
};

struct admin_cmd {
    uint8_t val[16];
    uint32_t len;
    uint64_t id;
};

struct order {
    struct sl_config *c;
    struct rlog log;
    pthread_mutex_t mu;
    int id;
    uint64_t promised;
    struct slotval *acc, *com;   /* by slot, 1-based */
    size_t cap;
    uint64_t max_acc, commit_index;
    struct sl_view view;
    uint64_t rep_own[SL_MAX_NODES], rep_backup[SL_MAX_NODES];
    int reported[SL_MAX_NODES];
    int leader;
    uint64_t ballot;
    uint64_t last_heard;
    int fds[SL_NORDER];
    struct admin_cmd q[16];
    int nq;
    uint64_t next_admin_id, admin_done;
};

static int grow(struct order *o, uint64_t slot)
{
    if (slot < o->cap)
        return 0;
    size_t nc = o->cap ? o->cap : 1024;
    while (nc <= slot)
        nc *= 2;
    struct slotval *a = realloc(o->acc, nc * sizeof(*a));
    if (!a)
        return -1;
    o->acc = a;
    struct slotval *cm = realloc(o->com, nc * sizeof(*cm));
    if (!cm)
        return -1;
    o->com = cm;
    memset(o->acc + o->cap, 0, (nc - o->cap) * sizeof(*a));
    memset(o->com + o->cap, 0, (nc - o->cap) * sizeof(*cm));
    o->cap = nc;
    return 0;
}

static int set_val(struct slotval *s, uint64_t ballot, const uint8_t *v,
                   uint32_t len)
{
    uint8_t *n = malloc(len ? len : 1);

    if (!n)
        return -1;
    memcpy(n, v, len);
    free(s->val);
    s->val = n;
    s->len = len;
    s->ballot = ballot;
    return 0;
}

/* Expects o->mu held.  Applies newly contiguous commits to the view. */
static void advance(struct order *o)
{
    while (o->commit_index + 1 < o->cap && o->com[o->commit_index + 1].val) {
        uint64_t s = o->commit_index + 1;
        if (sl_view_apply(&o->view, s, o->com[s].val, o->com[s].len) < 0)
            wl_fatal("order: committed slot %llu does not apply",
                     (unsigned long long)s);
        o->commit_index = s;
    }
}

static int replay_cb(void *arg, const uint8_t *p, uint32_t len)
{
    struct order *o = arg;

    if (len < 9)
        return -1;
    uint64_t x = wl_get64(p + 1);
    switch (p[0]) {
    case 'P':
        if (x > o->promised)
            o->promised = x;
        return 0;
    case 'A': {
        if (len < 17 || grow(o, x) < 0)
            return -1;
        uint64_t b = wl_get64(p + 9);
        if (b > o->promised)
            o->promised = b;
        if (x > o->max_acc)
            o->max_acc = x;
        return set_val(&o->acc[x], b, p + 17, len - 17);
    }
    case 'C':
        if (grow(o, x) < 0)
            return -1;
        return set_val(&o->com[x], 1, p + 9, len - 9);
    }
    return -1;
}

static void log_rec(struct order *o, char type, uint64_t x, uint64_t y,
                    int has_y, const uint8_t *v, uint32_t len)
{
    struct wl_buf b = { 0 };
    uint8_t h[17];

    h[0] = (uint8_t)type;
    wl_put64(h + 1, x);
    wl_put64(h + 9, y);
    if (wl_buf_add(&b, h, has_y ? 17 : 9) < 0 || wl_buf_add(&b, v, len) < 0 ||
        rlog_append(&o->log, b.p, (uint32_t)b.len) != 0 ||
        rlog_sync(&o->log) < 0)
        wl_fatal("order: cannot log '%c' record (log region full?)", type);
    wl_buf_free(&b);
}

/* ---- acceptor / learner (o->mu held) ---- */

static int do_prepare(struct order *o, uint64_t b, uint64_t from,
                      struct wl_buf *out)
{
    if (b <= o->promised)
        return SL_REJECT;
    o->promised = b;
    log_rec(o, 'P', b, 0, 0, NULL, 0);
    for (uint64_t s = from; s <= o->max_acc; s++) {
        uint8_t h[20];
        if (!o->acc[s].ballot)
            continue;
        wl_put64(h, s);
        wl_put64(h + 8, o->acc[s].ballot);
        wl_put32(h + 16, o->acc[s].len);
        wl_buf_add(out, h, 20);
        wl_buf_add(out, o->acc[s].val, o->acc[s].len);
    }
    return SL_OK;
}

static int do_accept(struct order *o, uint64_t b, uint64_t slot,
                     const uint8_t *v, uint32_t len)
{
    if (b < o->promised)
        return SL_REJECT;
    if (grow(o, slot) < 0)
        return SL_ERROR;
    o->promised = b;
    log_rec(o, 'A', slot, b, 1, v, len);   /* fsync before accepting */
    if (set_val(&o->acc[slot], b, v, len) < 0)
        return SL_ERROR;
    if (slot > o->max_acc)
        o->max_acc = slot;
    return SL_OK;
}

static void do_commit(struct order *o, uint64_t slot, const uint8_t *v,
                      uint32_t len)
{
    if (grow(o, slot) < 0 || o->com[slot].val)
        return;
    log_rec(o, 'C', slot, 0, 0, v, len);
    set_val(&o->com[slot], 1, v, len);
    advance(o);
}

static void entries_after(struct order *o, uint64_t have, struct wl_buf *out)
{
    for (uint64_t s = have + 1, n = 0; s <= o->commit_index && n < 2000;
         s++, n++)
        sl_entries_add(out, s, o->com[s].val, o->com[s].len);
}

/* ---- server side ---- */

struct oconn {
    struct order *o;
    int fd;
};

static void *order_conn(void *arg)
{
    struct oconn *oc = arg;
    struct order *o = oc->o;
    uint8_t *body = NULL;
    uint32_t len;

    while (wl_frame_recv(oc->fd, &body, &len, SL_MAX_FRAME) == 0) {
        struct sl_msg m, r = { 0 };
        struct wl_buf out = { 0 };
        if (sl_msg_decode(body, len, &m) < 0)
            break;
        r.type = m.type;
        pthread_mutex_lock(&o->mu);
        /* a slot far beyond what could be in flight, or a ballot whose
         * successor would overflow, is garbage: refuse it before it sizes
         * an array or blocks every future leader */
        if (((m.type == SL_ACCEPT || m.type == SL_COMMIT) &&
             (m.c == 0 || m.c > o->commit_index + 65536)) ||
            ((m.type == SL_PREPARE || m.type == SL_ACCEPT) &&
             (m.b >> 48) != 0)) {      /* a ballot no replica could make */
            pthread_mutex_unlock(&o->mu);
            r.status = SL_ERROR;
            free(body);
            body = NULL;
            if (sl_reply(oc->fd, &r) < 0)
                break;
            continue;
        }
        switch (m.type) {
        case SL_REPORT:
            if (m.a < (uint32_t)o->c->nnodes) {
                o->rep_own[m.a] = m.c;
                o->rep_backup[m.a] = m.d;
                o->reported[m.a] = 1;
            }
            /* the reply carries new commits, as for FETCH */
            __attribute__((fallthrough));
        case SL_FETCH:
            entries_after(o, m.b, &out);
            r.b = o->commit_index;
            r.a = o->leader ? 1 : 0;
            break;
        case SL_PREPARE:
            r.status = (uint8_t)do_prepare(o, m.b, m.c, &out);
            if (r.status == SL_OK) {
                o->leader = 0;
                o->last_heard = wl_now_ms();
            }
            r.b = o->promised;
            break;
        case SL_ACCEPT:
            r.status = (uint8_t)do_accept(o, m.b, m.c, m.data, m.dlen);
            if (r.status == SL_OK && m.b != o->ballot) {
                o->leader = 0;
                o->last_heard = wl_now_ms();
            }
            r.b = o->promised;
            break;
        case SL_COMMIT:
            if (m.dlen)
                do_commit(o, m.c, m.data, m.dlen);
            if (m.b >= o->promised && m.b != o->ballot) {
                o->leader = 0;
                o->last_heard = wl_now_ms();
            }
            r.c = o->commit_index;
            break;
        case SL_ADMIN:
            if (!o->leader || o->nq >= 16 || m.dlen > 16) {
                r.status = SL_NOT_LEADER;
                break;
            }
            memcpy(o->q[o->nq].val, m.data, m.dlen);
            o->q[o->nq].len = m.dlen;
            uint64_t id = o->q[o->nq].id = ++o->next_admin_id;
            o->nq++;
            pthread_mutex_unlock(&o->mu);
            for (int i = 0; i < 1000 && o->admin_done < id; i++)
                wl_sleep_ms(10);
            pthread_mutex_lock(&o->mu);
            r.status = o->admin_done >= id ? SL_OK : SL_TIMEOUT;
            r.b = o->commit_index;
            break;
        default:
            r.status = SL_ERROR;
        }
        pthread_mutex_unlock(&o->mu);
        free(body);
        body = NULL;
        r.data = out.p;
        r.dlen = (uint32_t)out.len;
        int rc = sl_reply(oc->fd, &r);
        wl_buf_free(&out);
        if (rc < 0)
            break;
    }
    free(body);
    close(oc->fd);
    free(oc);
    return NULL;
}

static void *order_listen(void *arg)
{
    struct order *o = arg;
    struct wl_addr a = o->c->addrs[o->id];
    int lfd = wl_listen(a.host, a.port + 1);

    if (lfd < 0)
        wl_fatal("order listen %s:%d: %s", a.host, a.port + 1,
                 strerror(errno));
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        pthread_t t;
        struct oconn *oc;
        if (fd < 0)
            continue;
        if (!(oc = malloc(sizeof(*oc)))) {
            close(fd);
            continue;
        }
        oc->o = o;
        oc->fd = fd;
        if (pthread_create(&t, NULL, order_conn, oc) != 0) {
            close(fd);
            free(oc);
            continue;
        }
        pthread_detach(t);
    }
    return NULL;
}

/* ---- leader side ---- */

static int peer_call(struct order *o, int j, const struct sl_msg *req,
                     struct sl_msg *rep, uint8_t **body)
{
    if (o->fds[j] < 0) {
        struct wl_addr a = o->c->addrs[j];
        a.port += 1;
        o->fds[j] = wl_connect(&a, 300);
        if (o->fds[j] < 0)
            return -1;
        wl_set_timeouts(o->fds[j], 2000);
    }
    if (sl_call(o->fds[j], req, rep, body) < 0) {
        close(o->fds[j]);
        o->fds[j] = -1;
        return -1;
    }
    return 0;
}

static void step_down(struct order *o, uint64_t seen)
{
    pthread_mutex_lock(&o->mu);
    if (o->leader)
        wl_log("order %d: stepping down (ballot %llx seen)", o->id,
               (unsigned long long)seen);
    o->leader = 0;
    if (seen > o->promised)
        o->promised = seen;
    o->last_heard = wl_now_ms();
    pthread_mutex_unlock(&o->mu);
}

static void send_commits(struct order *o, uint64_t upto)
{
    if (upto == 0)
        return;
    for (int j = 0; j < sl_norder(o->c); j++) {
        uint64_t s = upto;
        for (int guard = 0; j != o->id && guard < 4096; guard++) {
            struct sl_msg req = { .type = SL_COMMIT, .b = o->ballot,
                                  .c = s }, rep;
            uint8_t *body = NULL;
            pthread_mutex_lock(&o->mu);
            if (s > o->commit_index) {
                pthread_mutex_unlock(&o->mu);
                break;
            }
            /* copy: the arrays may move once the lock is dropped */
            uint8_t *v = malloc(o->com[s].len + 1);
            if (!v) {
                pthread_mutex_unlock(&o->mu);
                break;
            }
            memcpy(v, o->com[s].val, o->com[s].len);
            req.data = v;
            req.dlen = o->com[s].len;
            pthread_mutex_unlock(&o->mu);
            int rc = peer_call(o, j, &req, &rep, &body);
            free(v);
            uint64_t theirs = rc == 0 ? rep.c : upto;
            free(body);
            if (rc < 0 || theirs >= upto)
                break;
            s = theirs + 1;           /* catch the follower up */
        }
    }
}

/* Phase 2 for one slot; returns 0 once committed. */
static int phase2(struct order *o, uint64_t slot, const uint8_t *v,
                  uint32_t len)
{
    int oks = 0;
    uint64_t seen = 0;

    pthread_mutex_lock(&o->mu);
    if (do_accept(o, o->ballot, slot, v, len) == SL_OK)
        oks++;
    pthread_mutex_unlock(&o->mu);
    for (int j = 0; j < sl_norder(o->c); j++) {
        struct sl_msg req = { .type = SL_ACCEPT, .b = o->ballot, .c = slot,
                              .data = v, .dlen = len }, rep;
        uint8_t *body = NULL;
        if (j == o->id || peer_call(o, j, &req, &rep, &body) < 0)
            continue;
        if (rep.status == SL_OK)
            oks++;
        else if (rep.b > seen)
            seen = rep.b;
        free(body);
    }
    if (seen > o->ballot) {
        step_down(o, seen);
        return -1;
    }
    if (oks * 2 <= sl_norder(o->c))
        return -1;
    pthread_mutex_lock(&o->mu);
    do_commit(o, slot, v, len);
    pthread_mutex_unlock(&o->mu);
    send_commits(o, slot);
    return 0;
}

static void try_lead(struct order *o)
{
    struct wl_buf mine = { 0 };
    struct slotval *got = NULL;
    uint64_t from, top, seen = 0;
    int oks = 0;

    pthread_mutex_lock(&o->mu);
    uint64_t b = (((o->promised >> 8) + 1) << 8) | (uint64_t)o->id;
    from = o->commit_index + 1;
    if (do_prepare(o, b, from, &mine) == SL_OK)
        oks++;
    top = o->max_acc;
    pthread_mutex_unlock(&o->mu);
    o->ballot = b;
    size_t n = 0;
    struct wl_buf all = { 0 };
    wl_buf_add(&all, mine.p, mine.len);
    for (int j = 0; j < sl_norder(o->c); j++) {
        struct sl_msg req = { .type = SL_PREPARE, .b = b, .c = from }, rep;
        uint8_t *body = NULL;
        if (j == o->id || peer_call(o, j, &req, &rep, &body) < 0)
            continue;
        if (rep.status == SL_OK) {
            oks++;
            wl_buf_add(&all, rep.data, rep.dlen);
        } else if (rep.b > seen) {
            seen = rep.b;
        }
        free(body);
    }
    if (seen > b || oks * 2 <= sl_norder(o->c)) {
        step_down(o, seen);
        goto cleanup;
    }
    /* highest-ballot accepted value per slot, from every promise */
    for (size_t pos = 0; pos + 20 <= all.len;) {
        uint64_t s = wl_get64(all.p + pos);
        uint32_t l = wl_get32(all.p + pos + 16);
        if (s > top)
            top = s;
        pos += 20 + l;
    }
    n = top >= from ? top - from + 1 : 0;
    got = calloc(n ? n : 1, sizeof(*got));
    if (!got)
        goto cleanup;
    for (size_t pos = 0; pos + 20 <= all.len;) {
        uint64_t s = wl_get64(all.p + pos), ab = wl_get64(all.p + pos + 8);
        uint32_t l = wl_get32(all.p + pos + 16);
        if (pos + 20 + l > all.len)
            break;
        if (s >= from && ab > got[s - from].ballot)
            set_val(&got[s - from], ab, all.p + pos + 20, l);
        pos += 20 + l;
    }
    pthread_mutex_lock(&o->mu);
    o->leader = 1;
    pthread_mutex_unlock(&o->mu);
    wl_log("order %d: leader with ballot %llx, re-proposing slots %llu..%llu",
           o->id, (unsigned long long)b, (unsigned long long)from,
           (unsigned long long)(from + n - 1));
    for (size_t i = 0; i < n; i++) {
        uint8_t noop = SL_CMD_NOOP;
        int have = got && got[i].ballot;
        if (phase2(o, from + i, have ? got[i].val : &noop,
                   have ? got[i].len : 1) < 0) {
            step_down(o, 0);
            break;
        }
    }
cleanup:
    for (size_t i = 0; got && i < n; i++)
        free(got[i].val);
    free(got);
    wl_buf_free(&mine);
    wl_buf_free(&all);
}

/* Next command to propose, or 0 if nothing to do.  o->mu held. */
static uint32_t next_value(struct order *o, uint8_t *v, uint64_t slot,
                           uint64_t *admin_id)
{
    int ns = o->c->nnodes / 2;
    const uint64_t *prev = sl_view_latest(&o->view);
    int changed = 0;

    *admin_id = 0;
    /* a shard registers when both its servers have reported (3.3.4) */
    for (int s = 0; s < ns; s++)
        if (!(o->view.active & (1ULL << s)) && o->reported[2 * s] &&
            o->reported[2 * s + 1]) {
            v[0] = SL_CMD_ADD_SHARD;
            wl_put32(v + 1, (uint32_t)s);
            return 5;
        }
    if (o->nq) {
        uint32_t len = o->q[0].len;
        memcpy(v, o->q[0].val, len);
        *admin_id = o->q[0].id;
        if (v[0] == SL_CMD_FINALIZE && len == 13)   /* grace in cuts */
            wl_put64(v + 5, slot + wl_get64(v + 5));
        return len;
    }
    v[0] = SL_CMD_CUT;
    wl_put32(v + 1, (uint32_t)o->c->nnodes);
    for (int i = 0; i < o->c->nnodes; i++) {
        uint64_t p = prev ? prev[i] : 0, x = p;
        int s = sl_shard_of(i);
        int frozen = o->view.final_slot[s] && slot >= o->view.final_slot[s];
        if ((o->view.active & (1ULL << s)) && !frozen) {
            uint64_t own = o->rep_own[i];
            uint64_t bak = o->rep_backup[sl_peer_of(i)];
            uint64_t m = own < bak ? own : bak;
            if (m > x)
                x = m;
        }
        if (x != p)
            changed = 1;
        wl_put64(v + 5 + 8 * i, x);
    }
    return changed ? 5 + 8 * (uint32_t)o->c->nnodes : 0;
}

int sl_order_run(struct sl_config *c, struct wl_dev *dev)
{
    static struct order o;
    pthread_t t;
    uint64_t last_sent = 0;

    o.c = c;
    o.id = c->node;
    pthread_mutex_init(&o.mu, NULL);
    for (int j = 0; j < SL_NORDER; j++)
        o.fds[j] = -1;
    sl_view_init(&o.view, c->nnodes);
    if (rlog_open(&o.log, dev, sl_region_base(c, SL_REG_ORDER),
                  c->region_size, 1, replay_cb, &o) < 0)
        wl_fatal("order: cannot load its log");
    advance(&o);
    wl_log("order %d: promised %llx, accepted up to %llu, committed %llu, "
           "%zu cuts", o.id, (unsigned long long)o.promised,
           (unsigned long long)o.max_acc, (unsigned long long)o.commit_index,
           o.view.ncuts);
    o.last_heard = wl_now_ms();
    if (pthread_create(&t, NULL, order_listen, &o) != 0)
        wl_fatal("order: cannot start listener");
    for (;;) {
        uint8_t v[16 + 8 * SL_MAX_NODES];
        uint64_t admin_id, slot;
        uint32_t len;

        wl_sleep_ms((unsigned)c->interval_ms);
        pthread_mutex_lock(&o.mu);
        if (!o.leader) {
            int due = wl_now_ms() - o.last_heard >
                      300 * (uint64_t)(o.id + 1);
            pthread_mutex_unlock(&o.mu);
            if (due)
                try_lead(&o);
            continue;
        }
        slot = o.commit_index + 1;
        len = next_value(&o, v, slot, &admin_id);
        pthread_mutex_unlock(&o.mu);
        if (!len) {
            if (wl_now_ms() - last_sent > 100) {     /* heartbeat */
                send_commits(&o, o.commit_index);
                last_sent = wl_now_ms();
            }
            continue;
        }
        if (phase2(&o, slot, v, len) == 0) {
            last_sent = wl_now_ms();
            if (admin_id) {
                pthread_mutex_lock(&o.mu);
                memmove(o.q, o.q + 1, (size_t)(o.nq - 1) * sizeof(o.q[0]));
                o.nq--;
                o.admin_done = admin_id;
                pthread_mutex_unlock(&o.mu);
            }
        }
    }
    return 0;
}
