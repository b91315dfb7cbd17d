/*
 * kv_client: the load generator and the checker's oracle.
 *
 * Each client issues one operation at a time, so every operation depends
 * on the acknowledgement of the one before it (a chain of dependent
 * writes that hops across partitions and nodes).  Before sending, the
 * client appends an intent record to its journal and fsyncs it; after
 * the reply it appends and fsyncs an ack record.  Op ids are
 * (client << 40 | n) and never reused: after a restart the client
 * continues after the highest n in its journal and first closes a
 * dangling intent with an ack of status UNKNOWN.
 *
 * Keys are per client ("c<id>k<i>", "c<id>a<i>", "c<id>ctr"), so the
 * checker can decide visibility from op ids alone.
 */
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct client {
    struct kv_config *c;
    struct rlog j;
    int id;
    uint64_t last_n;
    int dangling;                /* last intent has no ack */
    uint8_t dangling_op;
    uint64_t dangling_opid;
    int *fds;
    long ctr;                    /* value of our cswap counter */
    long acked, unknown;
    struct wl_window win;
};

static int journal_cb(void *arg, const uint8_t *p, uint32_t len)
{
    struct client *cl = arg;

    if (len < KV_JREC_HDR)
        return -1;
    uint64_t n = wl_get64(p + 4) & ((1ULL << 40) - 1);
    if (n > cl->last_n)
        cl->last_n = n;
    cl->dangling = p[0] == 'I';
    cl->dangling_op = p[1];
    cl->dangling_opid = wl_get64(p + 4);
    return 0;
}

static void journal(struct client *cl, char type, const struct kv_req *rq,
                    uint8_t status, uint64_t seq, int part)
{
    struct wl_buf b = { 0 };
    uint8_t h[KV_JREC_HDR];

    memset(h, 0, sizeof(h));
    h[0] = (uint8_t)type;
    h[1] = rq->op;
    h[2] = status;
    wl_put64(h + 4, rq->opid);
    wl_put64(h + 12, seq);
    wl_put32(h + 20, (uint32_t)part);
    wl_put32(h + 24, rq->klen);
    wl_put32(h + 28, type == 'I' ? rq->vlen : 0);
    wl_put32(h + 32, type == 'I' ? rq->v2len : 0);
    if (wl_buf_add(&b, h, sizeof(h)) < 0 ||
        wl_buf_add(&b, rq->key, rq->klen) < 0 ||
        (type == 'I' && (wl_buf_add(&b, rq->val, rq->vlen) < 0 ||
                         wl_buf_add(&b, rq->val2, rq->v2len) < 0)))
        wl_fatal("out of memory");
    int rc = rlog_append(&cl->j, b.p, (uint32_t)b.len);
    if (rc == RLOG_FULL)
        wl_fatal("client journal full after %llu ops; use a bigger disk",
                 (unsigned long long)cl->last_n);
    /* the journal is the oracle: it is always fsynced, even in the
     * nofsync negative control (see main) */
    if (rc < 0 || rlog_sync(&cl->j) < 0)
        wl_fatal("client journal write failed");
    wl_buf_free(&b);
}

/* One request/reply with the owning primary.  Returns the status, or
 * KV_UNKNOWN if no reply came. */
static uint8_t call(struct client *cl, struct kv_req *rq, uint64_t *seq,
                    struct wl_buf *val)
{
    int part = kv_partition_of(cl->c, rq->key, rq->klen);
    int node = kv_primary_of(cl->c, part);
    struct wl_buf b = { 0 };
    uint8_t *body = NULL, st = KV_UNKNOWN;
    uint32_t len;

    for (int attempt = 0; attempt < 3; attempt++) {
        if (cl->fds[node] < 0) {
            cl->fds[node] = wl_connect(&cl->c->members[node].addr, 2000);
            if (cl->fds[node] < 0)
                goto cleanup;
            wl_set_timeouts(cl->fds[node], 20000);
        }
        rq->epoch = (uint32_t)cl->c->epoch;
        b.len = 0;
        if (kv_req_encode(rq, &b) < 0 ||
            wl_frame_send(cl->fds[node], b.p, (uint32_t)b.len) < 0 ||
            wl_frame_recv(cl->fds[node], &body, &len, KV_MAX_FRAME) < 0 ||
            len < KV_REP_HDR || wl_get32(body + 16) != len - KV_REP_HDR) {
            close(cl->fds[node]);
            cl->fds[node] = -1;
            goto cleanup;
        }
        st = body[0];
        *seq = wl_get64(body + 8);
        if (st == KV_WRONG_EPOCH) {
            /* lazily take the server's table (section 2.2.3) and retry:
             * nothing was applied */
            cl->c->epoch = wl_get32(body + 4);
            free(body);
            body = NULL;
            st = KV_UNKNOWN;
            continue;
        }
        val->len = 0;
        wl_buf_add(val, body + KV_REP_HDR, len - KV_REP_HDR);
        break;
    }
cleanup:
    free(body);
    wl_buf_free(&b);
    return st;
}

static void one_op(struct client *cl, uint64_t n)
{
    char key[64], val[160], val2[32];
    struct wl_buf reply = { 0 };
    struct kv_req rq = { .opid = ((uint64_t)cl->id << 40) | n };
    uint64_t r = wl_mix64(((uint64_t)cl->id << 40) ^ n), seq = 0;
    unsigned k = (unsigned)(r % 100), i = (unsigned)((r >> 8) % 16);
    uint8_t st;

    val2[0] = 0;
    if (k < 40) {
        rq.op = KV_OP_INSERT;
        snprintf(key, sizeof(key), "c%dk%u", cl->id, i);
        snprintf(val, sizeof(val), "c%dn%llu:%0*llx", cl->id,
                 (unsigned long long)n, (int)(r >> 40) % 64 + 8,
                 (unsigned long long)r);
    } else if (k < 60) {
        rq.op = KV_OP_APPEND;
        snprintf(key, sizeof(key), "c%da%u", cl->id, i % 4);
        snprintf(val, sizeof(val), "%d.%llu;", cl->id, (unsigned long long)n);
    } else if (k < 68) {
        rq.op = KV_OP_REMOVE;
        snprintf(key, sizeof(key), "c%dk%u", cl->id, i);
        val[0] = 0;
    } else if (k < 80) {
        rq.op = KV_OP_CSWAP;
        snprintf(key, sizeof(key), "c%dctr", cl->id);
        if (cl->ctr)
            snprintf(val, sizeof(val), "%ld", cl->ctr);
        else
            val[0] = 0;
        snprintf(val2, sizeof(val2), "%ld", cl->ctr + 1);
    } else if (k < 92) {
        rq.op = KV_OP_LOOKUP;
        snprintf(key, sizeof(key), "c%dk%u", cl->id, i);
        val[0] = 0;
    } else {
        /* wait for our own counter to hold its current value: returns at
         * once, or times out (100 ms) while the counter is still unset */
        rq.op = KV_OP_CALLBACK;
        snprintf(key, sizeof(key), "c%dctr", cl->id);
        snprintf(val, sizeof(val), "%ld", cl->ctr ? cl->ctr : -1);
        rq.timeout_ms = 100;
    }
    rq.key = (const uint8_t *)key;
    rq.klen = (uint32_t)strlen(key);
    rq.val = (const uint8_t *)val;
    rq.vlen = (uint32_t)strlen(val);
    rq.val2 = (const uint8_t *)val2;
    rq.v2len = (uint32_t)strlen(val2);
    int part = kv_partition_of(cl->c, rq.key, rq.klen);

    journal(cl, 'I', &rq, 0, 0, part);
    uint64_t t0 = wl_now_us();
    st = call(cl, &rq, &seq, &reply);
    wl_window_add(&cl->win, (double)(wl_now_us() - t0) / 1000.0);
    journal(cl, 'A', &rq, st, seq, part);
    if (rq.op == KV_OP_CSWAP) {
        if (st == KV_OK)
            cl->ctr++;
        else if (st == KV_MISMATCH && reply.len < 30) {
            char tmp[32];
            memcpy(tmp, reply.p, reply.len);
            tmp[reply.len] = 0;
            cl->ctr = strtol(tmp, NULL, 10);
        }
    }
    if (st == KV_UNKNOWN || st == KV_ERROR) {
        cl->unknown++;
        wl_sleep_ms(100);
    } else {
        cl->acked++;
    }
    wl_buf_free(&reply);
}

int kv_client_run(struct kv_config *c, struct wl_dev *dev,
                  const struct kv_client_opts *o)
{
    struct client cl = { .c = c, .id = o->client_id };
    uint64_t seq;
    struct wl_buf v = { 0 };

    cl.fds = malloc(sizeof(int) * (size_t)c->nnodes);
    if (!cl.fds)
        wl_fatal("out of memory");
    for (int i = 0; i < c->nnodes; i++)
        cl.fds[i] = -1;
    if (rlog_open(&cl.j, dev, kv_region_base(c, c->nparts), c->region_size,
                  1, journal_cb, &cl) < 0)
        wl_fatal("cannot open the client journal");
    if (cl.dangling) {
        struct kv_req rq = { .op = cl.dangling_op,
                             .opid = cl.dangling_opid };
        journal(&cl, 'A', &rq, KV_UNKNOWN, 0, 0);
    }
    wl_log("client %d starting after op %llu", cl.id,
           (unsigned long long)cl.last_n);
    /* learn our counter; the servers may still be reconciling */
    for (;;) {
        char key[32];
        snprintf(key, sizeof(key), "c%dctr", cl.id);
        struct kv_req rq = { .op = KV_OP_LOOKUP, .key = (uint8_t *)key,
                             .klen = (uint32_t)strlen(key) };
        uint8_t st = call(&cl, &rq, &seq, &v);
        if (st == KV_OK || st == KV_NOTFOUND) {
            if (st == KV_OK) {
                wl_buf_add(&v, "", 1);
                cl.ctr = strtol((char *)v.p, NULL, 10);
            }
            break;
        }
        wl_sleep_ms(200);
    }
    wl_buf_free(&v);
    for (uint64_t n = cl.last_n + 1;
         o->ops < 0 || n <= cl.last_n + (uint64_t)o->ops; n++) {
        one_op(&cl, n);
        if (n % (uint64_t)o->progress == 0) {
            char w[128];
            wl_window_fmt(&cl.win, w, sizeof(w));
            wl_log("client %d: op %llu, %ld replied, %ld unknown, %s", cl.id,
                   (unsigned long long)n, cl.acked, cl.unknown, w);
        }
        if (o->delay_ms)
            wl_sleep_ms((unsigned)o->delay_ms);
    }
    wl_log("client %d done: %ld replied, %ld unknown", cl.id, cl.acked,
           cl.unknown);
    return 0;
}
