/* server: see server.h. */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "authz.h"
#include "dispatch.h"
#include "listener.h"
#include "log.h"
#include "mono.h"
#include "peer.h"
#include "pool.h"
#include "proto.h"
#include "replyq.h"
#include "sdnotify.h"
#include "tls.h"

#define MAX_CONNS CFG_MAX_CONNECTIONS

enum conn_state { CONN_HANDSHAKE, CONN_OPEN, CONN_CLOSING };

struct conn {
    uint64_t id;
    int fd;
    SSL *ssl;
    enum conn_state state;
    double accepted_at;
    int broken;             /* a TLS or socket error was seen */
    char peer[64];
    struct authz_peer who;  /* from the certificate, once OPEN */
    uint8_t *in;
    size_t in_len, in_cap;
    uint8_t *out;
    size_t out_len, out_cap;
    int want_write;
};

struct server {
    struct agent *a;
    SSL_CTX *ctx;
    struct listener listen;
    int efd;
    struct conn *conns[MAX_CONNS];
    int nconns;
    uint64_t next_id;
    struct pool pool;
    struct authz authz;
    struct replyq replies;
};

/* ---- connections ---- */

static struct conn *
conn_find(struct server *s, uint64_t id)
{
    for (int i = 0; i < MAX_CONNS; i++)
        if (s->conns[i] && s->conns[i]->id == id)
            return s->conns[i];
    return NULL;
}

static int
conn_live(struct server *s, const struct conn *c)
{
    for (int i = 0; i < MAX_CONNS; i++)
        if (s->conns[i] == c)
            return 1;
    return 0;
}

static void
conn_close(struct server *s, struct conn *c, const char *why)
{
    log_info("event=conn_close conn=%llu peer=%s why=%s",
             (unsigned long long)c->id, c->peer, why);
    epoll_ctl(s->efd, EPOLL_CTL_DEL, c->fd, NULL);
    if (c->ssl) {
        /* No close_notify on a connection that already failed (it would
         * only queue more errors). */
        if (c->state != CONN_HANDSHAKE && !c->broken)
            SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        /* OpenSSL's error queue is per thread and shared by every
         * connection of this loop: an error left here would make the next
         * SSL_get_error() of another, healthy connection report
         * SSL_ERROR_SSL instead of WANT_READ, and close it. */
        ERR_clear_error();
    }
    close(c->fd);
    for (int i = 0; i < MAX_CONNS; i++)
        if (s->conns[i] == c) {
            s->conns[i] = NULL;
            s->nconns--;
        }
    free(c->in);
    free(c->out);
    free(c);
}

static int
out_append(struct conn *c, const uint8_t *buf, size_t len)
{
    if (c->out_cap - c->out_len < len) {
        size_t ncap = c->out_cap ? c->out_cap : 16384;
        uint8_t *nb;
        while (ncap - c->out_len < len)
            ncap *= 2;
        if (!(nb = realloc(c->out, ncap)))
            return -1;
        c->out = nb;
        c->out_cap = ncap;
    }
    memcpy(c->out + c->out_len, buf, len);
    c->out_len += len;
    return 0;
}

static void
update_events(struct server *s, struct conn *c)
{
    struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = c};

    /* CLOSING reads nothing more: without this a peer that keeps sending
     * would wake the loop in a spin until the last reply is flushed. */
    if (c->state != CONN_CLOSING)
        ev.events |= EPOLLIN;
    if (c->out_len > 0 || c->want_write)
        ev.events |= EPOLLOUT;
    epoll_ctl(s->efd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Writes what SSL accepts now; 0 ok (maybe partial), -1 conn is dead. */
static int
conn_flush(struct conn *c)
{
    size_t off = 0;

    c->want_write = 0;
    while (off < c->out_len) {
        int n;

        ERR_clear_error();   /* SSL_get_error must see only this call */
        n = SSL_write(c->ssl, c->out + off, (int)(c->out_len - off));
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        int e = SSL_get_error(c->ssl, n);
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
            c->want_write = 1;
            break;
        }
        ERR_clear_error();
        c->broken = 1;
        return -1;
    }
    memmove(c->out, c->out + off, c->out_len - off);
    c->out_len -= off;
    return 0;
}

/* ---- requests ---- */

struct work {
    struct server *s;
    uint64_t conn_id;
    struct proto_request req;
};

static void
work_main(void *arg)
{
    struct work *w = arg;
    struct agent *a = w->s->a;
    const char *code = NULL;
    char msg[512] = "";
    json_t *errres = NULL, *res;
    uint8_t *buf;
    size_t len = 0;

    res = dispatch_run(a, &w->req, &code, msg, sizeof(msg), &errres);
    if (res) {
        buf = proto_reply_ok(w->req.id, res, &len);
    } else {
        atomic_fetch_add(&a->errors, 1);
        buf = proto_reply_err(w->req.id, code, msg, errres, &len);
    }
    if (buf && len > PROTO_HDR + PROTO_MAX_FRAME) {
        free(buf);
        buf = proto_reply_err(w->req.id, "INTERNAL", "reply too large",
                              NULL, &len);
    }
    if (buf)
        replyq_post(&w->s->replies, w->conn_id, buf, len);
    proto_request_clear(&w->req);
    free(w);
}

static void
reply_now(struct conn *c, json_t *id, const struct proto_error *err)
{
    size_t len;
    uint8_t *buf = proto_reply_err(id, err->code, err->message, NULL, &len);

    if (buf) {
        out_append(c, buf, len);
        free(buf);
    }
}

/* authz_request's refusal as the reply; 1 when refused. */
static int
refuse(struct server *s, struct conn *c, const struct proto_request *req)
{
    struct proto_error e;
    const char *code = NULL;
    char msg[256];

    if (authz_request(&s->authz, &c->who, req->cmd, c->id, c->peer, &code,
                      msg, sizeof(msg)) == 0)
        return 0;
    proto_error_set(&e, code, "%s", msg);
    reply_now(c, req->id, &e);
    return 1;
}

static void
process_frames(struct server *s, struct conn *c)
{
    size_t off = 0, n;
    struct proto_error err;

    while (c->state == CONN_OPEN) {
        struct proto_request req;
        int bad, r = proto_frame_check(c->in + off, c->in_len - off, &n, &err);

        if (r == 0)
            break;
        if (r < 0) {
            /* agent-protocol §2.2: reply, then close; body not read */
            reply_now(c, NULL, &err);
            c->state = CONN_CLOSING;
            break;
        }
        atomic_fetch_add(&s->a->requests, 1);
        if (proto_parse_request(c->in + off + PROTO_HDR, n, &req, &bad,
                                &err) < 0) {
            atomic_fetch_add(&s->a->errors, 1);
            log_info("event=bad_request conn=%llu code=%s",
                     (unsigned long long)c->id, err.code);
            reply_now(c, req.id, &err);
            proto_request_clear(&req);
            if (bad)
                c->state = CONN_CLOSING;
        } else if (refuse(s, c, &req)) {
            atomic_fetch_add(&s->a->errors, 1);
            proto_request_clear(&req);
        } else {
            struct work *w = malloc(sizeof(*w));
            log_debug("event=request conn=%llu cmd=%s",
                      (unsigned long long)c->id, proto_cmd_name(req.cmd));
            if (!w) {
                proto_request_clear(&req);
                break;
            }
            w->s = s;
            w->conn_id = c->id;
            w->req = req;
            if (pool_submit(&s->pool, work_main, w) < 0) {
                struct proto_error e2;
                log_warnx("event=request_refused conn=%llu cmd=%s "
                          "why=queue_full", (unsigned long long)c->id,
                          proto_cmd_name(req.cmd));
                proto_error_set(&e2, "BUSY", "too many requests in flight; "
                                "retry later");
                reply_now(c, w->req.id, &e2);
                atomic_fetch_add(&s->a->errors, 1);
                proto_request_clear(&w->req);
                free(w);
            }
        }
        off += PROTO_HDR + n;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
}

static void
conn_handshake(struct server *s, struct conn *c)
{
    int r, e;

    ERR_clear_error();
    r = SSL_accept(c->ssl);
    if (r == 1) {
        c->state = CONN_OPEN;
        if (authz_identify(&s->authz, c->ssl, &c->who, c->id, c->peer) < 0) {
            conn_close(s, c, "revoked");
            return;
        }
        atomic_fetch_add(&s->a->connections, 1);
        log_info("event=conn_open conn=%llu peer=%s cn=%s role=%s serial=%s "
                 "tls=%s", (unsigned long long)c->id, c->peer, c->who.cn,
                 peer_role_name(c->who.role), c->who.serial,
                 SSL_get_version(c->ssl));
        return;
    }
    e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return;
    if (e == SSL_ERROR_WANT_WRITE) {
        c->want_write = 1;
        return;
    }
    {
        char why[300];
        long v = SSL_get_verify_result(c->ssl);
        tls_err(why, sizeof(why), "handshake");
        log_warnx("event=tls_refused conn=%llu peer=%s verify=\"%s\" "
                  "msg=\"%s\"", (unsigned long long)c->id, c->peer,
                  X509_verify_cert_error_string(v), why);
    }
    conn_close(s, c, "tls_handshake_failed");
}

static void
conn_read(struct server *s, struct conn *c)
{
    for (;;) {
        size_t want;
        int n, e;

        if (c->state != CONN_OPEN)
            return;
        /* Grow to hold the announced frame, never beyond 1 MiB + header. */
        want = 16384;
        if (c->in_len >= PROTO_HDR) {
            uint32_t fl = ((uint32_t)c->in[0] << 24) |
                          ((uint32_t)c->in[1] << 16) |
                          ((uint32_t)c->in[2] << 8) | c->in[3];
            if (fl <= PROTO_MAX_FRAME && fl + PROTO_HDR > c->in_len)
                want = fl + PROTO_HDR - c->in_len;
        }
        if (c->in_cap - c->in_len < want) {
            size_t ncap = c->in_len + want;
            uint8_t *nb = realloc(c->in, ncap);
            if (!nb) {
                conn_close(s, c, "oom");
                return;
            }
            c->in = nb;
            c->in_cap = ncap;
        }
        ERR_clear_error();
        n = SSL_read(c->ssl, c->in + c->in_len, (int)(c->in_cap - c->in_len));
        if (n > 0) {
            c->in_len += (size_t)n;
            process_frames(s, c);
            continue;
        }
        e = SSL_get_error(c->ssl, n);
        if (e == SSL_ERROR_WANT_READ)
            return;
        if (e == SSL_ERROR_WANT_WRITE) {
            c->want_write = 1;
            return;
        }
        ERR_clear_error();
        if (e != SSL_ERROR_ZERO_RETURN)
            c->broken = 1;
        conn_close(s, c, e == SSL_ERROR_ZERO_RETURN ? "peer_closed" :
                   "read_error");
        return;
    }
}

/* Runs every handler that applies; returns 0, or -1 when c was freed. */
static int
conn_event(struct server *s, struct conn *c, uint32_t events)
{
    uint64_t id = c->id;

    if (c->state == CONN_HANDSHAKE) {
        conn_handshake(s, c);
        if (!conn_find(s, id))
            return -1;
    }
    if (c->state == CONN_OPEN && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP |
                                            EPOLLERR | EPOLLOUT))) {
        conn_read(s, c);
        if (!conn_find(s, id))
            return -1;
    }
    if (c->state != CONN_HANDSHAKE && conn_flush(c) < 0) {
        conn_close(s, c, "write_error");
        return -1;
    }
    if (c->state == CONN_CLOSING && c->out_len == 0) {
        conn_close(s, c, "bad_frame");
        return -1;
    }
    if ((events & (EPOLLHUP | EPOLLERR)) && c->state == CONN_HANDSHAKE) {
        conn_close(s, c, "hangup");
        return -1;
    }
    update_events(s, c);
    return 0;
}

static void
accept_all(struct server *s)
{
    char peer[64];
    int fd;

    while ((fd = listener_accept(&s->listen, peer, sizeof(peer))) >= 0) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
        struct conn *c;
        int slot;

        for (slot = 0; slot < MAX_CONNS && s->conns[slot]; slot++)
            ;
        c = slot < MAX_CONNS && s->nconns < s->a->cfg.max_connections ?
            calloc(1, sizeof(*c)) : NULL;
        if (!c) {
            log_warnx("event=conn_refused peer=%s why=too_many_connections "
                      "max_connections=%d", peer, s->a->cfg.max_connections);
            close(fd);
            continue;
        }
        c->id = ++s->next_id;
        c->fd = fd;
        c->accepted_at = mono_ms();
        snprintf(c->peer, sizeof(c->peer), "%s", peer);
        if (!(c->ssl = SSL_new(s->ctx))) {
            close(fd);
            free(c);
            continue;
        }
        SSL_set_fd(c->ssl, fd);
        s->conns[slot] = c;
        s->nconns++;
        ev.data.ptr = c;
        epoll_ctl(s->efd, EPOLL_CTL_ADD, fd, &ev);
    }
}

static void
drain_replies(struct server *s)
{
    struct reply *r = replyq_take(&s->replies);

    while (r) {
        struct reply *next = r->next;
        struct conn *c = conn_find(s, r->conn_id);
        if (c) {
            out_append(c, r->buf, r->len);
            conn_event(s, c, 0);
        } else {
            log_info("event=reply_dropped conn=%llu why=connection_gone",
                     (unsigned long long)r->conn_id);
        }
        replyq_free(r);
        r = next;
    }
}

int
server_run(struct agent *a, volatile sig_atomic_t *stop, char *err,
           size_t errlen)
{
    struct server s = {.a = a, .listen = {.fd = -1}, .efd = -1,
                       .replies = {.evfd = -1}};
    struct epoll_event ev, evs[64];
    int ret = -1, pool_up = 0, authz_up = 0;

    if (!(s.ctx = tls_ctx_new(&a->cfg, err, errlen)))
        goto cleanup;
    if (authz_start(&s.authz, a->cfg.revoked, err, errlen) < 0)
        goto cleanup;
    authz_up = 1;
    if (pool_start(&s.pool, a->cfg.workers, (size_t)a->cfg.queue) < 0) {
        snprintf(err, errlen, "cannot start %d request threads: %s",
                 a->cfg.workers, strerror(errno));
        goto cleanup;
    }
    pool_up = 1;
    s.efd = epoll_create1(EPOLL_CLOEXEC);
    if (s.efd < 0 || replyq_init(&s.replies) < 0) {
        snprintf(err, errlen, "epoll/eventfd: %s", strerror(errno));
        goto cleanup;
    }
    ev.events = EPOLLIN;
    ev.data.ptr = &s.replies;
    epoll_ctl(s.efd, EPOLL_CTL_ADD, s.replies.evfd, &ev);
    if (listener_open(&s.listen, s.efd, a->cfg.listen_addr,
                      a->cfg.listen_port, err, errlen) < 0)
        goto cleanup;
    log_info("event=listening addr=%s port=%d host=%s vms=%d revoked=%zu "
             "max_connections=%d workers=%d", a->cfg.listen_addr,
             a->cfg.listen_port, a->cfg.host, a->nvms, s.authz.revoked.n,
             a->cfg.max_connections, a->cfg.workers);
    /* Ready: recovery is done (what a previous run paused is resumed) and
     * the listener is open; libvirt and Ceph may still be connecting
     * (bringup.c).  Sent before the listener opened, a unit that depends
     * on this one could be refused: the CI rehearsal of 3c33cb8 connected
     * right after READY=1 and got ECONNREFUSED, the agent still building
     * its TLS context under load. */
    sdnotify_send("READY=1");
    while (!*stop) {
        int n = epoll_wait(s.efd, evs, 64, 500);
        double now;

        authz_poll(&s.authz);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == &s.listen)
                accept_all(&s);
            else if (evs[i].data.ptr == &s.replies)
                drain_replies(&s);
            else if (conn_live(&s, evs[i].data.ptr))
                /* (a reply drained earlier in this batch may have closed it) */
                conn_event(&s, evs[i].data.ptr, evs[i].events);
        }
        /* After the events: evs[] must not point at a connection freed here. */
        now = mono_ms();
        for (int i = 0; i < MAX_CONNS; i++)
            if (s.conns[i] && s.conns[i]->state == CONN_HANDSHAKE &&
                now - s.conns[i]->accepted_at > a->cfg.handshake_timeout_ms)
                conn_close(&s, s.conns[i], "handshake_timeout");
        listener_tick(&s.listen, now);
    }
    ret = 0;
cleanup:
    /* The running handlers finish before their server goes away (their
     * replies go to its queue). */
    if (pool_up)
        pool_stop(&s.pool);
    for (int i = 0; i < MAX_CONNS; i++)
        if (s.conns[i])
            conn_close(&s, s.conns[i], "shutdown");
    replyq_destroy(&s.replies);
    listener_close(&s.listen);
    if (s.efd >= 0)
        close(s.efd);
    SSL_CTX_free(s.ctx);
    if (authz_up)
        authz_stop(&s.authz);
    return ret;
}
