/*
 * cp-sharedlog: a compact Scalog (Ding, seeds/002, Chapter 3) for
 * recovery drills.  See README.md for the roles, the disk layout and the
 * departures from the paper.
 *
 * Deployment: node i (0-based, ring order of CP_PEERS) runs
 *   - storage server i: shard i/2, primary of segment i, backup of
 *     segment i^1 (its shard peer);
 *   - ordering replica i, if i < 3 (Multi-Paxos);
 *   - client i+1.
 * Ports: storage = base port, ordering = base port + 1.
 *
 * Disk layout (one raw disk per node):
 *   [0, 4096)  superblock "CPSLDSK1": version, node, nnodes, region size,
 *              crc32 in the last 4 bytes
 *   region 0   own segment (rlog): records  u32 client | u64 seq | data
 *   region 1   backup of the peer's segment (rlog), same records
 *   region 2   ordering replica log (rlog): 'P' promise, 'A' accept,
 *              'C' commit records
 *   region 3   client ack journal (rlog): 'R' restart, 'A' ack records
 */
#ifndef SL_H
#define SL_H

#include <stdint.h>

#include "rlog.h"
#include "wl.h"

#define SL_SB_SIZE 4096
#define SL_SB_MAGIC "CPSLDSK1"
#define SL_MAX_NODES 32
#define SL_NORDER 3
#define SL_MAX_FRAME (8U << 20)
#define SL_DEFAULT_PORT 7800
#define SL_REG_OWN 0
#define SL_REG_BACKUP 1
#define SL_REG_ORDER 2
#define SL_REG_CLIENT 3
#define SL_NREGIONS 4

struct sl_config {
    int node, nnodes;            /* nnodes = storage servers, even */
    struct wl_addr addrs[SL_MAX_NODES];
    uint64_t region_size;
    int interval_ms;             /* cut interval (interleaving interval) */
};

static inline int sl_shard_of(int server) { return server / 2; }
static inline int sl_peer_of(int server) { return server ^ 1; }
static inline int sl_norder(const struct sl_config *c)
{
    return c->nnodes < SL_NORDER ? c->nnodes : SL_NORDER;
}

int sl_superblock_load(struct wl_dev *dev, struct sl_config *c, char *err,
                       size_t errlen);
uint64_t sl_region_base(const struct sl_config *c, int region);

/* ---- messages: one fixed header, then dlen bytes of data ---- */
#define SL_MSG_HDR 40
enum sl_type {
    SL_REPORT = 1,     /* a=server b=have_slot c=own durable d=backup durable
                        * reply: data = committed entries after have_slot */
    SL_PREPARE = 2,    /* b=ballot c=from_slot; reply b=promised, data =
                        * accepted entries (slot, ballot, value) */
    SL_ACCEPT = 3,     /* b=ballot c=slot data=value; reply b=promised */
    SL_COMMIT = 4,     /* b=ballot c=slot data=value; reply c=commit index */
    SL_ADMIN = 5,      /* data=command value; reply once committed */
    SL_FETCH = 6,      /* b=have_slot; reply like REPORT */
    SL_APPEND = 10,    /* a=client b=seq c=shard data=payload;
                        * reply b=gsn a=shard */
    SL_REPLICATE = 11, /* a=from server b=first index data=records;
                        * reply b=count held */
    SL_READ = 12,      /* b=gsn c=timeout ms; reply data=record a=shard */
    SL_SUBSCRIBE = 13, /* b=from gsn c=max records; reply data=(gsn,record)*,
                        * b=l_max+1 */
    SL_STATUS = 14,    /* reply b=l_max+1 c=last slot d=trim gsn */
};

enum sl_status {
    SL_OK = 0,
    SL_REJECT = 1,     /* Paxos: promised a higher ballot */
    SL_NOT_LEADER = 2,
    SL_FINALIZED = 3,  /* shard finalized: append elsewhere */
    SL_TRIMMED = 4,
    SL_NOT_HERE = 5,   /* record of another shard */
    SL_TIMEOUT = 6,
    SL_ERROR = 7,
    SL_WRONG_SHARD = 8,
};

struct sl_msg {
    uint8_t type, status;
    uint32_t a;
    uint64_t b, c, d;
    const uint8_t *data;
    uint32_t dlen;
};

int sl_msg_encode(const struct sl_msg *m, struct wl_buf *out);
int sl_msg_decode(const uint8_t *p, uint32_t len, struct sl_msg *m);
/* Blocking request/reply on fd; *body holds the reply (caller frees). */
int sl_call(int fd, const struct sl_msg *req, struct sl_msg *rep,
            uint8_t **body);
int sl_reply(int fd, const struct sl_msg *rep);

/* ---- the replicated log's commands (Paxos values) ---- */
enum sl_cmd {
    SL_CMD_NOOP = 0,
    SL_CMD_CUT = 1,       /* u32 n | u64 count[n] */
    SL_CMD_ADD_SHARD = 2, /* u32 shard */
    SL_CMD_FINALIZE = 3,  /* u32 shard | u64 effective slot */
    SL_CMD_TRIM = 4,      /* u64 gsn */
};

/*
 * The state every party derives from the committed log, in slot order.
 * cut k covers, for server i, records [prev[i], vec[i]) of segment i;
 * their gsns start at base and follow the lexicographic rule of
 * section 3.3.1: lower shard first, then lower server, then index.
 */
struct sl_cut {
    uint64_t slot, base;
    uint64_t *vec;
};

struct sl_view {
    int nservers;
    uint64_t last_slot;
    struct sl_cut *cuts;
    size_t ncuts, cap;
    uint64_t active;              /* shard bitmap */
    uint64_t final_slot[SL_MAX_NODES / 2]; /* 0 = live */
    uint64_t trim;
};

int sl_view_init(struct sl_view *v, int nservers);
void sl_view_free(struct sl_view *v);
/* Applies the command committed at slot (== last_slot + 1). */
int sl_view_apply(struct sl_view *v, uint64_t slot, const uint8_t *val,
                  uint32_t len);
/* Sum of the latest cut: gsns [0, total) are ordered. */
uint64_t sl_view_total(const struct sl_view *v);
const uint64_t *sl_view_latest(const struct sl_view *v);
/* gsn of record idx of segment server; -1 if not ordered yet. */
int64_t sl_view_gsn(const struct sl_view *v, int server, uint64_t idx);
/* Segment and index holding gsn; -1 if gsn is not ordered. */
int sl_view_locate(const struct sl_view *v, uint64_t gsn, int *server,
                   uint64_t *idx);
/* A shard is finalized once its effective slot is committed. */
int sl_view_finalized(const struct sl_view *v, int shard);

/* committed entries as carried in replies: (u64 slot, u32 len, value)* */
int sl_entries_add(struct wl_buf *out, uint64_t slot, const uint8_t *val,
                   uint32_t len);

/*
 * The ordering replica (sl_order.c).
 *
 * Acceptor: PREPARE and ACCEPT are logged and fsynced before the reply.
 * Leader (one at a time, the holder of the highest ballot):
 *
 *   FOLLOWER --no leader heard for 300 ms * (id + 1)--> CANDIDATE
 *   CANDIDATE: PREPARE(b, first uncommitted slot) to all
 *       majority promised --> re-propose every accepted value found
 *                             (highest ballot wins, holes get NOOP)
 *                         --> LEADER
 *       rejected or no majority --> FOLLOWER
 *   LEADER: every interval, if a shard registered, an admin command
 *       waits, or the cut changed: ACCEPT(b, next slot, value) to all;
 *       majority --> log COMMIT (fsync) --> COMMIT to followers
 *       any REJECT (a higher ballot exists) --> FOLLOWER
 *
 */
int sl_order_run(struct sl_config *c, struct wl_dev *dev);
int sl_storage_run(struct sl_config *c, struct wl_dev *dev);
struct sl_client_opts {
    long ops;
    int delay_ms;
    int progress;                /* progress line every N appends */
};
int sl_client_run(struct sl_config *c, struct wl_dev *dev,
                  const struct sl_client_opts *o);
int sl_admin(struct sl_config *c, const uint8_t *cmd, uint32_t len);

#endif
