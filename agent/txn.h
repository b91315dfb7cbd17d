/*
 * txn: the transaction table and its lease logic (agent-protocol §5).
 * Pure bookkeeping: no I/O and no locking (the caller holds one mutex over
 * the table), and the clock is injected so that tests drive time.
 *
 *                 txn_begin_prepare      txn_prepared(lease)
 *     (none) ───────────────▶ PREPARING ───────────────▶ PREPARED
 *                                │ txn_fail_prepare          │
 *                                ▼                           │
 *                            (removed)                       │
 *        ┌───────────────────────────────────────────────────┤
 *        │ txn_claim_commit, now < deadline                  │ txn_claim_commit
 *        ▼                                                   │ or lease_claim_due,
 *    COMMITTING ──txn_finish_commit──▶ COMMITTED | FAILED    │ now >= deadline
 *                                                            ▼
 *                      txn_finish_expire     EXPIRED ◀── EXPIRING
 *   PREPARED or a finished state ──txn_begin_abort──▶ ABORTING
 *        (caller resumes the VMs and deletes snapshots) ──txn_finish_abort──▶
 *        ABORTED.  An unknown txn is created ABORTING, so a late prepare or
 *        commit of it gets ABORTED.
 *
 * Transitional states (PREPARING, COMMITTING, EXPIRING) are owned by the
 * thread that entered them; others wait for the table's condition variable
 * (the caller's) until the state is stable.
 */
#ifndef CP_TXN_H
#define CP_TXN_H

#include <jansson.h>

enum txn_state {
    TXN_PREPARING,
    TXN_PREPARED,
    TXN_COMMITTING,
    TXN_COMMITTED,
    TXN_FAILED,
    TXN_EXPIRING,
    TXN_EXPIRED,
    TXN_ABORTING,
    TXN_ABORTED,
};

/* How long finished transactions are remembered for idempotence. */
#define TXN_KEEP_MS (10 * 60 * 1000.0)

typedef double (*txn_clock_fn)(void *opaque);

struct txn {
    char id[129];
    enum txn_state state;
    char **vms;
    int nvms;
    double lease_deadline;      /* valid in PREPARED */
    double finished_at;         /* valid in stable end states */
    json_t *prepare_result;     /* owned; replayed for a repeated prepare */
    json_t *commit_result;      /* owned; replayed for a repeated commit */
    char err_code[32];          /* FAILED: the stored error */
    char err_msg[256];
    json_t *created;            /* owned: {"disk": "snapshot name"} made by commit */
    json_t *created_ids;        /* owned, or NULL: {"disk": rbd snap id} of those */
    double *t_stop0, *t_stop1;  /* per VM: start and end of its stop call */
    unsigned char *rd;          /* per VM: its redirect (enum rd_state,
                                   redirect.h); 0 is the in_pause cut */
    unsigned char *cut_live;    /* per VM: 1 when cut live (hold.h): its
                                   t_stop0/1 are the switch, not a stop */
    double *t_hold0;            /* per VM, when live: its hold began */
    struct txn *next;
};

struct txn_table {
    struct txn *head;
    txn_clock_fn now;
    void *clock_opaque;
};

void txn_table_init(struct txn_table *t, txn_clock_fn now, void *opaque);
void txn_table_clear(struct txn_table *t);

struct txn *txn_find(struct txn_table *t, const char *id);
const char *txn_state_name(enum txn_state s);
int txn_is_live(const struct txn *x);

/*
 * Starts a prepare.  Returns the new txn in PREPARING, or NULL with *code
 * set: "BUSY" when a VM is in another live txn (msg names it).
 */
struct txn *txn_begin_prepare(struct txn_table *t, const char *id,
                              const char *const *vms, int nvms,
                              const char **code, char *msg, size_t msglen);
/* PREPARING → PREPARED; arms the lease.  result is stolen. */
void txn_prepared(struct txn_table *t, struct txn *x, double lease_ms,
                  json_t *result);
/* PREPARING → removed (all-or-nothing prepare failed). */
void txn_fail_prepare(struct txn_table *t, struct txn *x);

enum txn_claim { TXN_CLAIM_COMMIT, TXN_CLAIM_EXPIRE, TXN_CLAIM_NONE };
/* PREPARED → COMMITTING (lease disarmed) or, when the deadline has passed,
 * → EXPIRING (the caller resumes and calls txn_finish_expire). */
enum txn_claim txn_claim_commit(struct txn_table *t, struct txn *x);
/* COMMITTING → COMMITTED (code NULL) or FAILED; result is stolen. */
void txn_finish_commit(struct txn_table *t, struct txn *x, json_t *result,
                       const char *code, const char *msg);

/* Lease: claims one PREPARED txn whose deadline passed (→ EXPIRING), or
 * NULL.  The caller resumes its VMs and then calls txn_finish_expire. */
struct txn *lease_claim_due(struct txn_table *t);
void txn_finish_expire(struct txn_table *t, struct txn *x);
/* Milliseconds until the next lease deadline, or -1 when none is armed. */
double lease_next_in(struct txn_table *t);

/* A stable state (or unknown id) → ABORTING; returns the txn (created
 * when unknown) and sets *was_prepared when its VMs are still paused.
 * Returns NULL when the txn is in a transitional state (caller waits). */
struct txn *txn_begin_abort(struct txn_table *t, const char *id,
                            int *was_prepared);
void txn_finish_abort(struct txn_table *t, struct txn *x);

/* Drops finished txns older than TXN_KEEP_MS.  Returns how many. */
int txn_gc(struct txn_table *t);

#endif
