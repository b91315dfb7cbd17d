/*
 * cp-kvstore: a compact ZHT (Li, Chapter 2) for recovery drills.
 *
 * Disk layout (one raw disk per node, see README.md):
 *   [0, 4096)            superblock: magic "CPKVDSK1", version, node,
 *                        nparts, nnodes, region size, epoch, membership
 *                        table (32-byte entries, as in ZHT section 2.2),
 *                        crc32 in the last 4 bytes
 *   region r < nparts    partition r: rlog with two halves (NoVoHT log)
 *   region nparts        client journal: rlog with one half
 *
 * Partition record payload (NoVoHT-style, section 2.2.8):
 *   u64 seq | u64 opid | u8 kind | 3 pad | u32 klen | u32 vlen | key | val
 * kind PUT sets the value, DEL is a tombstone, APPEND concatenates.
 *
 * Client journal payload:
 *   u8 type ('I' intent, 'A' ack) | u8 op | u8 status | u8 pad |
 *   u64 opid | u64 seq | u32 part | u32 klen | u32 vlen | u32 v2len | 4 pad |
 *   key | val | val2
 *
 * Wire: u32 length then body (little-endian).
 *   request: u8 op | 3 pad | u32 epoch | u64 opid | u32 klen | u32 vlen |
 *            u32 v2len | u32 timeout_ms | key | val | val2
 *   reply:   u8 status | 3 pad | u32 epoch | u64 seq | u32 vlen | val
 */
#ifndef KV_H
#define KV_H

#include <stdint.h>

#include "rlog.h"
#include "wl.h"

#define KV_SB_SIZE 4096
#define KV_SB_MAGIC "CPKVDSK1"
#define KV_MAX_NODES 64
#define KV_MAX_FRAME (16U << 20)
#define KV_REQ_HDR 32
#define KV_REP_HDR 20
#define KV_REC_HDR 28
#define KV_JREC_HDR 40

enum kv_kind { KV_PUT = 1, KV_DEL = 2, KV_APPEND = 3 };

enum kv_op {
    KV_OP_INSERT = 1,
    KV_OP_LOOKUP = 2,
    KV_OP_REMOVE = 3,
    KV_OP_APPEND = 4,
    KV_OP_CSWAP = 5,     /* val = expected, val2 = new value */
    KV_OP_CALLBACK = 6,  /* val = expected, timeout_ms */
    KV_OP_DIGEST = 7,    /* opid = partition; reply seq = last seq,
                          * val = u64 digest */
    KV_OP_REPL = 8,      /* primary -> secondary: val = one record */
    KV_OP_SYNC = 9,      /* opid = partition, val = u64 last seq; reply
                          * val = records newer than that */
    KV_OP_RSYNC = 10,    /* opid = partition, val = records to take */
    KV_OP_TABLE = 11,    /* reply val = membership table */
};

enum kv_status {
    KV_OK = 0,
    KV_NOTFOUND = 1,
    KV_MISMATCH = 2,
    KV_TIMEOUT = 3,
    KV_WRONG_EPOCH = 4,
    KV_ERROR = 5,
    KV_NOT_OWNER = 6,
    KV_UNKNOWN = 7,      /* journal only: no reply, outcome unknown */
};

struct kv_member {
    struct wl_addr addr;
};

struct kv_config {
    int node;                    /* 0-based index in the ring */
    int nnodes;
    int nparts;
    uint64_t epoch;
    struct kv_member members[KV_MAX_NODES];
    uint64_t region_size;
};

/* Ring: ZHT section 2.2.2, the 64-bit name space cut into nparts equal
 * partitions; partition p is served by node p mod n (primary) and its
 * ring successor (secondary). */
int kv_partition_of(const struct kv_config *c, const void *key,
                    uint32_t klen);
int kv_primary_of(const struct kv_config *c, int part);
int kv_secondary_of(const struct kv_config *c, int part);

/* Superblock: loads it, or formats the disk when blank.  When the peer
 * list differs from the stored table the table is updated and its epoch
 * bumped (a restore at DR with new addresses). */
int kv_superblock_load(struct wl_dev *dev, struct kv_config *c, char *err,
                       size_t errlen);
uint64_t kv_region_base(const struct kv_config *c, int region);

/* request encoding, shared by client, server and forwarder */
struct kv_req {
    uint8_t op;
    uint32_t epoch;
    uint64_t opid;
    const uint8_t *key, *val, *val2;
    uint32_t klen, vlen, v2len, timeout_ms;
};

int kv_req_encode(const struct kv_req *r, struct wl_buf *out);
int kv_req_decode(const uint8_t *b, uint32_t len, struct kv_req *r);
int kv_rep_encode(uint8_t status, uint32_t epoch, uint64_t seq,
                  const void *val, uint32_t vlen, struct wl_buf *out);

int kv_server_run(struct kv_config *c, struct wl_dev *dev, const char *bind);
struct kv_client_opts {
    int client_id;
    long ops;                    /* -1: forever */
    int delay_ms;
    int progress;                /* progress line every N ops */
};
int kv_client_run(struct kv_config *c, struct wl_dev *dev,
                  const struct kv_client_opts *o);

#endif
