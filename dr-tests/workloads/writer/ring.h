/*
 * ring.h - the token ring of distributed mode.
 *
 * Every writer connects to the next one in CP_PEERS order and accepts one
 * connection from the previous one.  A single token carries the next global
 * sequence number; only its holder writes, and it passes the token on only
 * after its write is durable.  So record s+1 (on another VM, on another
 * host) causally depends on record s: exactly the chain of dependent writes
 * whose prefix a crash-consistent group snapshot must contain (GCVM §4.5.2,
 * "Multiple VM Multiple Disk Consistency Groups").
 *
 * Message: 24 bytes, little-endian: "CPTK", u32 type, u64 run, u64 seq.
 *
 *   node 0:  listen -> connect next -> accept prev -> holds token seq=1
 *   node k:  listen -> connect next -> accept prev -> waits for token
 *
 *   TOKEN(seq) --write record seq--> TOKEN(seq+1) to next
 *   count reached or disk full: STOP to next; wait until STOP comes back
 *   STOP from prev (not ours): forward STOP, exit
 *
 * With --resume (resume.h) a census goes round once before the token, so
 * that the ring agrees on where the run found on its disks goes on:
 *
 *   node 0:  CENSUS(run, seq = its highest seq) --> every node: same run
 *            or none, seq = max --> back at node 0
 *            COUNT(run, seq = its records) --> every node adds its own,
 *            takes the run --> back at node 0: records == highest seq, or
 *            node 0 exits with the error (the ring closes behind it)
 *            TOKEN(seq = highest + 1) as above
 */
#ifndef CP_WRITER_RING_H
#define CP_WRITER_RING_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

#define RING_MSG_SIZE 24

enum ring_type {
    RING_TOKEN = 1,
    RING_STOP = 2,
    RING_CENSUS = 3,
    RING_COUNT = 4,
};

struct ring_msg {
    uint32_t type;
    uint64_t run;
    uint64_t seq;
};

struct ring {
    int listen_fd;
    int next_fd;
    int prev_fd;
    int index;
    int n;
};

/*
 * Build the ring for position cfg->ring_index.  Waits up to
 * cfg->connect_timeout_s for the neighbours.  0, or -1 with err set.
 */
int ring_connect(struct ring *r, const struct config *cfg,
                 char *err, size_t errlen);

int ring_send(struct ring *r, const struct ring_msg *m,
              char *err, size_t errlen);

/* Blocks for the next message from the previous node.  0 / -1. */
int ring_recv(struct ring *r, struct ring_msg *m, char *err, size_t errlen);

/* Encode/decode one message (exposed for the unit tests). */
void ring_msg_encode(const struct ring_msg *m, unsigned char *buf);
int ring_msg_decode(const unsigned char *buf, struct ring_msg *m);

/* Close every socket; safe on a closed ring. */
void ring_close(struct ring *r);

#endif
