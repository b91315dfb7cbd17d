/*
 * journal: the durable record of what this agent did to its VMs and has
 * not undone yet (agent-protocol §7): the VMs it paused and not yet
 * resumed, and the guests whose filesystems it may have frozen and not yet
 * thawed.  Every change rewrites the whole file as temp file → write →
 * fsync → rename → fsync(dir); err_op names the step that failed.
 *
 * Format: a first line `cutpoint-journal 2`, then one entry per line (no
 * entries: an empty file):
 *
 *   paused <txn> <vm>     written before QMP stop, removed after cont
 *   frozen <txn> <vm>     written before guest-fsfreeze-freeze, removed
 *                         after a thaw the guest agent answered
 *   redirect <id> <vm>    written before the redirect cut makes the VM's
 *                         overlays (redirect.c; <id>: a txn, or ahead-...
 *                         for overlays made ahead of the next cut),
 *                         removed after they were merged back and deleted
 *
 * <txn> and <vm> are framed so that names with any bytes round-trip: a
 * byte outside '!'..'~', and '%', is written %XX (hex), so a field never
 * holds a blank, a newline or a non-ASCII byte.  A file without the first
 * line is of the first format (written before the framing): fields split
 * on blanks, taken literally; files from before `frozen` (only `paused`
 * lines) are of it too, and load unchanged.  Lines that do not parse are
 * skipped.  An entry is keyed by (kind, vm): a VM has at most one of each.
 * Thread-safe (an internal mutex).
 */
#ifndef CP_JOURNAL_H
#define CP_JOURNAL_H

#include <stddef.h>

struct journal;

enum journal_kind { JOURNAL_PAUSED, JOURNAL_FROZEN, JOURNAL_REDIRECT };

struct journal_entry {
    enum journal_kind kind;
    char txn[129];
    char vm[256];
};

/* Opens (or creates empty) the journal at path, loading its entries. */
int journal_open(const char *path, struct journal **out, char *err,
                 size_t errlen);
void journal_free(struct journal *j);

/* Parses a journal file's bytes buf[0..len) (either format) into a
 * malloc'd array *out of *n entries (caller frees; NULL when none);
 * -1 only when out of memory.  Any input is safe (fuzzed). */
int journal_parse(const char *buf, size_t len, struct journal_entry **out,
                  int *n);

/* Copies the entries into a malloc'd array (caller frees). */
int journal_entries(struct journal *j, struct journal_entry **out, int *n);

/* Adds the n entries in one durable write; an entry whose (kind, vm) is
 * already present replaces it.  On failure nothing is recorded. */
int journal_put(struct journal *j, const struct journal_entry *e, int n,
                char *err, size_t errlen);
/* Adds a `paused` (txn, vm) durably. */
int journal_add(struct journal *j, const char *txn, const char *vm,
                char *err, size_t errlen);
/* Adds `paused` (txn, vms[i]) for all n VMs in one durable write. */
int journal_add_many(struct journal *j, const char *txn,
                     const char *const *vms, int n, char *err,
                     size_t errlen);
/* Removes the `paused` entry of vm durably (absent is fine). */
int journal_remove(struct journal *j, const char *vm, char *err,
                   size_t errlen);
/* Removes the (kind, vm) entry durably if its txn is txn (any txn when
 * txn is NULL); absent is fine.  The txn check keeps a late thaw of an
 * earlier transaction from dropping the entry of a newer freeze. */
int journal_remove_kind(struct journal *j, enum journal_kind kind,
                        const char *vm, const char *txn, char *err,
                        size_t errlen);

#endif
