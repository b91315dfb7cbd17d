/*
 * cp-writer - GCVM §4.5.2's writer (Listing 4.1) with a checksum.
 *
 * Writes 512-byte records with global sequence numbers 1, 2, 3, ... one at
 * a time, each durable before the next is issued:
 *   - single-VM mode: record s goes to disk (s-1) mod ndisks;
 *   - distributed mode: a token passed around a TCP ring of writers (one
 *     per VM, CP_PEERS order) carries s; its holder writes s to its next
 *     disk in turn and passes s+1 on, so consecutive records alternate
 *     between VMs and hosts.
 * A writer's k-th record (k from 0) goes to disk k mod ndisks at slot
 * k / ndisks, which is also its epoch: one epoch is a round over all disks.
 * Any crash-consistent image of the disks therefore holds exactly the
 * records 1..p for some p; docs/writer.md explains why.  With --resume the
 * writer continues the run such an image holds (resume.h): same run id,
 * seq p+1 on, each disk's next slot.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "disks.h"
#include "record.h"
#include "resume.h"
#include "ring.h"

#ifndef CUTPOINT_VERSION
#define CUTPOINT_VERSION "dev"
#endif

#define ERRLEN 512

struct writer {
    struct config cfg;
    struct disks disks;
    struct ring ring;
    uint64_t run;
    struct resume_state found;  /* --resume: this writer's records on disk */
    uint64_t written;       /* records this writer wrote (this process) */
    uint64_t last_seq;      /* highest seq this writer wrote or saw */
    double started;
    double last_progress;
    uint64_t written_at_progress;
    double last_write;
    double max_gap;         /* longest time between two records, this
                             * interval: shows pauses such as snapshots */
};

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t default_run(void)
{
    struct timespec ts;
    uint64_t run;

    clock_gettime(CLOCK_REALTIME, &ts);
    run = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    run ^= (uint64_t)getpid() << 40;
    return run ? run : 1;
}

static void progress(struct writer *w, bool force)
{
    double t = now_s();
    double dt = t - w->last_progress;

    if (!force && (w->cfg.progress_s == 0 || dt < w->cfg.progress_s))
        return;
    printf("cp-writer: progress vm=%u seq=%llu written=%llu rate=%.0f/s "
           "max_gap_ms=%.1f\n", w->cfg.vm, (unsigned long long)w->last_seq,
           (unsigned long long)w->written,
           dt > 0 ? (double)(w->written - w->written_at_progress) / dt : 0.0,
           w->max_gap * 1000.0);
    w->last_progress = t;
    w->written_at_progress = w->written;
    w->max_gap = 0;
}

/*
 * Write record seq as this writer's next record.  Returns 0, 1 if the disks
 * are full (nothing written), or -1 on error.
 */
static int write_next(struct writer *w, uint64_t seq, char *err)
{
    struct record rec;
    uint64_t k = w->found.records + w->written;  /* this writer's k-th */
    int disk = (int)(k % (uint64_t)w->disks.n);
    uint64_t slot = k / (uint64_t)w->disks.n;
    double t;

    if (slot >= w->disks.slots)
        return 1;
    rec.epoch = (uint32_t)slot;
    rec.seq = seq;
    rec.vm = w->cfg.vm;
    rec.disk = (uint32_t)disk;
    rec.run = w->run;
    if (disks_write(&w->disks, disk, slot, &rec, err, ERRLEN) < 0)
        return -1;
    t = now_s();
    if (w->written > 0 && t - w->last_write > w->max_gap)
        w->max_gap = t - w->last_write;
    w->last_write = t;
    w->written++;
    w->last_seq = seq;
    if (w->cfg.delay_us)
        usleep(w->cfg.delay_us);
    progress(w, false);
    return 0;
}

static void done(struct writer *w, const char *reason)
{
    progress(w, true);
    printf("cp-writer: done vm=%u last_seq=%llu written=%llu run=%llu "
           "reason=%s\n", w->cfg.vm, (unsigned long long)w->last_seq,
           (unsigned long long)w->written, (unsigned long long)w->run,
           reason);
}

static int run_single(struct writer *w, char *err)
{
    for (uint64_t seq = w->found.last_seq + 1;; seq++) {
        int rc;

        if (w->cfg.count && seq > w->cfg.count) {
            done(w, "count");
            return 0;
        }
        rc = write_next(w, seq, err);
        if (rc < 0)
            return -1;
        if (rc > 0) {
            done(w, "full");
            return 0;
        }
    }
}

/* We hold no token; send STOP around and wait for it to come back. */
static int stop_ring(struct writer *w, uint64_t seq, const char *reason,
                     char *err)
{
    struct ring_msg m = { .type = RING_STOP, .run = w->run, .seq = seq };

    if (ring_send(&w->ring, &m, err, ERRLEN) < 0)
        return -1;
    for (;;) {
        if (ring_recv(&w->ring, &m, err, ERRLEN) < 0)
            return -1;
        if (m.type == RING_STOP)
            break;
    }
    done(w, reason);
    return 0;
}

/* Receive a census message of type `type`; anything else is an error. */
static int census_recv(struct writer *w, struct ring_msg *m, uint32_t type,
                       char *err)
{
    if (ring_recv(&w->ring, m, err, ERRLEN) < 0)
        return -1;
    if (m->type != type) {
        snprintf(err, ERRLEN, "ring census: message type %u, expected %u "
                 "(does every writer of the ring have --resume?)",
                 m->type, type);
        return -1;
    }
    return 0;
}

/*
 * --resume in a ring: agree on the run and its next seq (ring.h).  On
 * return node 0's *first is the seq its token starts with.  0 / -1.
 */
static int ring_census(struct writer *w, uint64_t *first, char *err)
{
    struct ring_msg m;
    uint64_t own = w->found.run;

    if (w->ring.index == 0) {
        m = (struct ring_msg){ RING_CENSUS, own, w->found.last_seq };
        if (ring_send(&w->ring, &m, err, ERRLEN) < 0 ||
            census_recv(w, &m, RING_CENSUS, err) < 0)
            return -1;
        uint64_t run = m.run, highest = m.seq;

        m = (struct ring_msg){ RING_COUNT, run, w->found.records };
        if (ring_send(&w->ring, &m, err, ERRLEN) < 0 ||
            census_recv(w, &m, RING_COUNT, err) < 0)
            return -1;
        if (m.seq != highest) {
            snprintf(err, ERRLEN, "resume: the ring's disks hold %llu "
                     "records but the highest seq is %llu: records are "
                     "missing, not a crash-consistent copy",
                     (unsigned long long)m.seq, (unsigned long long)highest);
            return -1;
        }
        if (run)
            w->run = run;
        *first = highest + 1;
        printf("cp-writer: ring resumes run=%llu at seq=%llu\n",
               (unsigned long long)w->run, (unsigned long long)*first);
        return 0;
    }
    if (census_recv(w, &m, RING_CENSUS, err) < 0)
        return -1;
    if (own && m.run && own != m.run) {
        snprintf(err, ERRLEN, "resume: this writer's disks hold run %llu, "
                 "another writer's run %llu", (unsigned long long)own,
                 (unsigned long long)m.run);
        return -1;
    }
    m.run = m.run ? m.run : own;
    m.seq = m.seq > w->found.last_seq ? m.seq : w->found.last_seq;
    if (ring_send(&w->ring, &m, err, ERRLEN) < 0 ||
        census_recv(w, &m, RING_COUNT, err) < 0)
        return -1;
    m.seq += w->found.records;
    if (m.run)
        w->run = m.run;
    return ring_send(&w->ring, &m, err, ERRLEN);
}

static int run_ring(struct writer *w, char *err)
{
    struct ring_msg m;
    bool holding = w->ring.index == 0;
    uint64_t first = 1;

    printf("cp-writer: ring connected, position %d of %d%s\n",
           w->ring.index, w->ring.n,
           w->ring.index == 0 ? "" : " (run id comes with the token)");
    if (w->cfg.resume && ring_census(w, &first, err) < 0)
        return -1;
    if (holding) {
        m.type = RING_TOKEN;
        m.run = w->run;
        m.seq = first;
    }
    for (;;) {
        int rc;

        if (!holding && ring_recv(&w->ring, &m, err, ERRLEN) < 0)
            return -1;
        holding = false;
        if (m.type == RING_STOP) {
            if (w->last_seq < m.seq - 1 && m.seq > 0)
                w->last_seq = m.seq - 1;
            if (ring_send(&w->ring, &m, err, ERRLEN) < 0)
                return -1;
            done(w, "stopped");
            return 0;
        }
        if (m.type != RING_TOKEN) {
            snprintf(err, ERRLEN, "ring: message type %u, expected the token "
                     "(does every writer of the ring have --resume?)",
                     m.type);
            return -1;
        }
        if (w->ring.index != 0 && w->written == 0 && w->found.records == 0)
            w->run = m.run;     /* everyone takes the initiator's run id */
        if (m.run != w->run) {
            snprintf(err, ERRLEN, "token of run %llu, expected %llu",
                     (unsigned long long)m.run, (unsigned long long)w->run);
            return -1;
        }
        if (w->cfg.count && m.seq > w->cfg.count) {
            w->last_seq = m.seq - 1;
            return stop_ring(w, m.seq, "count", err);
        }
        rc = write_next(w, m.seq, err);
        if (rc < 0)
            return -1;
        if (rc > 0)
            return stop_ring(w, m.seq, "full", err);
        m.seq++;
        if (ring_send(&w->ring, &m, err, ERRLEN) < 0)
            return -1;
    }
}

int main(int argc, char **argv)
{
    struct writer w;
    char err[ERRLEN] = "";
    int rc = 1;

    /* The console is a serial port: one line at a time. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    memset(&w, 0, sizeof(w));
    w.ring.listen_fd = w.ring.next_fd = w.ring.prev_fd = -1;
    config_init(&w.cfg);
    if (config_from_env(&w.cfg, argc <= 1, err, sizeof(err)) < 0 ||
        config_parse_args(&w.cfg, argc - 1, argv + 1, err, sizeof(err)) < 0 ||
        config_finish(&w.cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "cp-writer: error: %s\n%s", err, config_usage);
        return 2;
    }
    if (w.cfg.help) {
        fputs(config_usage, stdout);
        return 0;
    }
    if (w.cfg.version) {
        printf("cp-writer %s\n", CUTPOINT_VERSION);
        return 0;
    }
    if (disks_open(&w.disks, &w.cfg, err, sizeof(err)) < 0)
        goto cleanup;
    if (w.cfg.zero && disks_zero(&w.disks, err, sizeof(err)) < 0)
        goto cleanup;
    w.run = w.cfg.run ? w.cfg.run : default_run();
    if (w.cfg.resume) {
        if (resume_scan(&w.disks, w.cfg.vm, &w.found, err, sizeof(err)) < 0)
            goto cleanup;
        if (!config_distributed(&w.cfg) &&
            resume_check_single(&w.found, err, sizeof(err)) < 0)
            goto cleanup;
        if (w.found.run)
            w.run = w.found.run;
        w.last_seq = w.found.last_seq;
    }
    printf("cp-writer: start mode=%s vm=%u disks=%d slots=%llu run=%llu "
           "direct=%s\n", config_distributed(&w.cfg) ? "distributed" : "single",
           w.cfg.vm, w.disks.n, (unsigned long long)w.disks.slots,
           (unsigned long long)w.run, w.disks.direct[0] ? "yes" : "no");
    if (w.cfg.resume)
        printf("cp-writer: resume vm=%u run=%llu records=%llu last_seq=%llu\n",
               w.cfg.vm, (unsigned long long)w.found.run,
               (unsigned long long)w.found.records,
               (unsigned long long)w.found.last_seq);
    w.started = w.last_progress = now_s();
    if (config_distributed(&w.cfg)) {
        if (ring_connect(&w.ring, &w.cfg, err, sizeof(err)) < 0)
            goto cleanup;
        if (run_ring(&w, err) < 0)
            goto cleanup;
    } else if (run_single(&w, err) < 0) {
        goto cleanup;
    }
    rc = 0;

cleanup:
    if (rc != 0) {
        progress(&w, true);
        fprintf(stderr, "cp-writer: error: %s\n", err);
    }
    ring_close(&w.ring);
    disks_close(&w.disks);
    return rc;
}
