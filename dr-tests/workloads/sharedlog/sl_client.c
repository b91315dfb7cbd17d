/*
 * sl_client: the append load and the checker's oracle.
 *
 * The client appends one record at a time (appendToShard), alternating
 * between live shards, so each append is issued after the previous one
 * was acknowledged, usually on another shard.  Every acknowledgement is
 * appended to the client's journal and fsynced:
 *   'A' | u32 client | u64 seq | u64 gsn | u32 shard | u64 fnv64(payload)
 * and every start adds 'R' | u32 epoch.  Sequence numbers are never
 * reused, not even those of appends that got no reply (such a record may
 * still be ordered later): seqs are reserved in blocks with an fsynced
 * 'H' | u64 highest reserved seq record, and a restart continues above
 * the last reservation.
 * Payloads are a deterministic function of (client, seq), so the checker
 * can tell a real record from a phantom.
 */
#include "sl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct client {
    struct sl_config *c;
    struct rlog j;
    int id;
    uint64_t last_seq;
    uint64_t reserved;           /* highest seq reserved in the journal */
    uint32_t epoch;
    int *fds;
    uint64_t dead_shards;
    long acked, failed, reads, bad_reads;
    struct wl_window win;
};

static int journal_cb(void *arg, const uint8_t *p, uint32_t len)
{
    struct client *cl = arg;

    if (len == 5 && p[0] == 'R') {
        cl->epoch = wl_get32(p + 1);
        return 0;
    }
    if (len == 9 && p[0] == 'H') {
        if (wl_get64(p + 1) > cl->reserved)
            cl->reserved = wl_get64(p + 1);
        return 0;
    }
    if (len != 33 || p[0] != 'A')
        return -1;
    if (wl_get64(p + 5) > cl->last_seq)
        cl->last_seq = wl_get64(p + 5);
    return 0;
}

static void journal(struct client *cl, const uint8_t *rec, uint32_t len)
{
    if (rlog_append(&cl->j, rec, len) != 0 || rlog_sync(&cl->j) < 0)
        wl_fatal("client %d: journal write failed (full?)", cl->id);
}

/* The payload of (client, seq): u32 client | u64 seq | text.  The checker
 * rebuilds it (dr-tests/checkers/sharedlog.py, payload()). */
static uint32_t payload(int client, uint64_t seq, uint8_t *out)
{
    uint64_t r = wl_mix64(((uint64_t)client << 40) ^ seq);
    int n = snprintf((char *)out + 12, 200, "c%d.s%llu:", client,
                     (unsigned long long)seq);
    int fill = 16 + (int)(r % 64);

    wl_put32(out, (uint32_t)client);
    wl_put64(out + 4, seq);
    for (int i = 0; i < fill; i++)
        out[12 + n + i] = (uint8_t)('a' + (wl_mix64(r + (uint64_t)i) % 26));
    return 12 + (uint32_t)n + (uint32_t)fill;
}

static int call(struct client *cl, int server, const struct sl_msg *req,
                struct sl_msg *rep, uint8_t **body)
{
    if (cl->fds[server] < 0) {
        cl->fds[server] = wl_connect(&cl->c->addrs[server], 1000);
        if (cl->fds[server] < 0)
            return -1;
        wl_set_timeouts(cl->fds[server], 35000);
    }
    if (sl_call(cl->fds[server], req, rep, body) < 0) {
        close(cl->fds[server]);
        cl->fds[server] = -1;
        return -1;
    }
    return 0;
}

static int pick_shard(struct client *cl, uint64_t seq)
{
    int ns = cl->c->nnodes / 2, live = 0, k;

    for (int s = 0; s < ns; s++)
        live += !(cl->dead_shards & (1ULL << s));
    if (!live)
        return -1;
    k = (int)(seq % (uint64_t)live);
    for (int s = 0; s < ns; s++)
        if (!(cl->dead_shards & (1ULL << s)) && k-- == 0)
            return s;
    return -1;
}

static void one_append(struct client *cl, uint64_t seq)
{
    uint8_t p[300], rec[33];
    int shard = pick_shard(cl, seq);
    struct sl_msg req = { .type = SL_APPEND, .a = (uint32_t)cl->id, .b = seq },
                  rep;
    uint8_t *body = NULL;

    if (shard < 0)
        wl_fatal("client %d: every shard is finalized", cl->id);
    int server = 2 * shard + (cl->id % 2);
    req.c = (uint64_t)shard;
    req.data = p;
    req.dlen = payload(cl->id, seq, p);
    uint64_t t0 = wl_now_us();
    int crc = call(cl, server, &req, &rep, &body);
    wl_window_add(&cl->win, (double)(wl_now_us() - t0) / 1000.0);
    if (crc < 0) {
        cl->failed++;
        wl_sleep_ms(200);
        return;
    }
    if (rep.status == SL_FINALIZED) {
        wl_log("client %d: shard %d finalized, moving on", cl->id, shard);
        cl->dead_shards |= 1ULL << shard;
        cl->failed++;
    } else if (rep.status != SL_OK) {
        cl->failed++;
        wl_sleep_ms(100);
    } else {
        uint64_t gsn = rep.b, h = wl_fnv64(WL_FNV_INIT, p, req.dlen);
        rec[0] = 'A';
        wl_put32(rec + 1, (uint32_t)cl->id);
        wl_put64(rec + 5, seq);
        wl_put64(rec + 13, gsn);
        wl_put32(rec + 21, rep.a);
        wl_put64(rec + 25, h);
        journal(cl, rec, sizeof(rec));
        cl->acked++;
        if (cl->acked % 16 == 0) {
            /* readRecord(l, s) from the shard's other server */
            struct sl_msg rq = { .type = SL_READ, .b = gsn, .c = 5000 }, rr;
            uint8_t *rb = NULL;
            if (call(cl, server ^ 1, &rq, &rr, &rb) == 0) {
                cl->reads++;
                if (rr.status != SL_OK ||
                    wl_fnv64(WL_FNV_INIT, rr.data, rr.dlen) != h) {
                    cl->bad_reads++;
                    wl_log("client %d: readRecord(%llu, %d) status %d "
                           "does not return our record", cl->id,
                           (unsigned long long)gsn, shard, rr.status);
                }
            }
            free(rb);
        }
    }
    free(body);
}

int sl_client_run(struct sl_config *c, struct wl_dev *dev,
                  const struct sl_client_opts *o)
{
    struct client cl = { .c = c, .id = c->node + 1 };
    uint8_t r[5];

    cl.fds = malloc(sizeof(int) * (size_t)c->nnodes);
    if (!cl.fds)
        wl_fatal("out of memory");
    for (int i = 0; i < c->nnodes; i++)
        cl.fds[i] = -1;
    if (rlog_open(&cl.j, dev, sl_region_base(c, SL_REG_CLIENT),
                  c->region_size, 1, journal_cb, &cl) < 0)
        wl_fatal("client: cannot open the journal");
    cl.epoch++;
    r[0] = 'R';
    wl_put32(r + 1, cl.epoch);
    journal(&cl, r, sizeof(r));
    if (cl.reserved > cl.last_seq)
        cl.last_seq = cl.reserved;
    wl_log("client %d: epoch %u, starting after seq %llu", cl.id, cl.epoch,
           (unsigned long long)cl.last_seq);
    for (uint64_t seq = cl.last_seq + 1;
         o->ops < 0 || seq <= cl.last_seq + (uint64_t)o->ops; seq++) {
        if (seq > cl.reserved) {
            uint8_t h[9];
            cl.reserved = seq + 255;
            h[0] = 'H';
            wl_put64(h + 1, cl.reserved);
            journal(&cl, h, sizeof(h));
        }
        one_append(&cl, seq);
        if (seq % (uint64_t)o->progress == 0) {
            char w[128];
            wl_window_fmt(&cl.win, w, sizeof(w));
            wl_log("client %d: seq %llu, %ld acked, %ld failed, %ld/%ld "
                   "bad reads, %s", cl.id, (unsigned long long)seq, cl.acked,
                   cl.failed, cl.bad_reads, cl.reads, w);
        }
        if (o->delay_ms)
            wl_sleep_ms((unsigned)o->delay_ms);
    }
    wl_log("client %d done: %ld acked, %ld failed, %ld/%ld bad reads", cl.id,
           cl.acked, cl.failed, cl.bad_reads, cl.reads);
    return cl.bad_reads ? 1 : 0;
}

int sl_admin(struct sl_config *c, const uint8_t *cmd, uint32_t len)
{
    for (int round = 0; round < 50; round++)
        for (int j = 0; j < sl_norder(c); j++) {
            struct wl_addr a = c->addrs[j];
            struct sl_msg req = { .type = SL_ADMIN, .data = cmd, .dlen = len },
                          rep;
            uint8_t *body = NULL;
            a.port += 1;
            int fd = wl_connect(&a, 500);
            if (fd < 0)
                continue;
            wl_set_timeouts(fd, 15000);
            int rc = sl_call(fd, &req, &rep, &body);
            close(fd);
            if (rc == 0 && rep.status == SL_OK) {
                printf("committed at slot %llu\n", (unsigned long long)rep.b);
                free(body);
                return 0;
            }
            free(body);
        }
    fprintf(stderr, "cp-sharedlog: no ordering replica committed the "
            "command\n");
    return 1;
}
