/*
 * kv_part: one ZHT partition held by this node, as primary or secondary:
 * an in-memory chained hash table (NoVoHT, ZHT section 2.2.8) over an
 * rlog with two halves.  Every change is logged before it is applied;
 * removes leave tombstones; compaction rewrites the live half.
 *
 * Locking: the main (epoll) thread touches primary partitions and the
 * replica thread touches secondary ones, but both may read any for a
 * digest, so every call below expects p->mu held by the caller.
 */
#ifndef KV_PART_H
#define KV_PART_H

#include <pthread.h>
#include <stdint.h>

#include "kv.h"

enum kv_role { KV_ROLE_NONE = 0, KV_ROLE_PRIMARY = 1, KV_ROLE_SECONDARY = 2 };

struct kv_entry {
    struct kv_entry *next;
    uint64_t seq, opid;
    int dead;                    /* tombstone */
    uint32_t klen, vlen;
    uint8_t *key, *val;
};

struct kv_rec {
    uint64_t seq, opid;
    uint8_t kind;
    uint32_t klen, vlen;
    const uint8_t *key, *val;
};

struct kv_part {
    pthread_mutex_t mu;
    int id;
    enum kv_role role;
    struct rlog log;
    struct kv_entry **b;
    size_t nb, n;
    uint64_t last;               /* highest seq applied */
    unsigned removes;            /* tombstones since last compaction */
    int repl_fd;                 /* primary: connection to the secondary */
    int need_sync;               /* primary: secondary may be behind */
};

/* Tombstones per partition that trigger a compaction (--compact-removes). */
extern unsigned kv_compact_removes;

int kv_rec_encode(const struct kv_rec *r, struct wl_buf *out);
int kv_rec_decode(const uint8_t *p, uint32_t len, struct kv_rec *r);

/* Opens the partition's log on dev and replays it into memory. */
int kv_part_open(struct kv_part *p, int id, enum kv_role role,
                 struct wl_dev *dev, uint64_t base, uint64_t size);
void kv_part_close(struct kv_part *p);
struct kv_entry *kv_part_find(struct kv_part *p, const uint8_t *key,
                              uint32_t klen);
/*
 * Logs r (without sync) and applies it, if it is newer than what the
 * key holds.  Compacts when the half is full.  Returns 1 if applied,
 * 0 if older (ignored), -1 on error.
 */
int kv_part_take(struct kv_part *p, const struct kv_rec *r);
/* Sync, then compact if the log is getting full or has many tombstones. */
int kv_part_sync(struct kv_part *p);
/* Appends (u32 len, record) for every entry with seq > after. */
int kv_part_dump(struct kv_part *p, uint64_t after, struct wl_buf *out);
/* Takes every record of a dump; returns count taken or -1. */
int kv_part_load_dump(struct kv_part *p, const uint8_t *b, uint32_t len);
/* Order-independent digest of the live keys: sum of fnv64(key 0 val). */
uint64_t kv_part_digest(struct kv_part *p);

#endif
