/*
 * journal: the durable list of VMs this agent has paused and not yet
 * resumed (agent-protocol §7).  Every change rewrites the whole file as
 * temp file → write → fsync → rename → fsync(dir); err_op names the step
 * that failed.  Format: one line "paused <txn> <vm>" per entry.
 * Thread-safe (an internal mutex).
 */
#ifndef CP_JOURNAL_H
#define CP_JOURNAL_H

#include <stddef.h>

struct journal;

struct journal_entry {
    char txn[129];
    char vm[256];
};

/* Opens (or creates empty) the journal at path, loading its entries. */
int journal_open(const char *path, struct journal **out, char *err,
                 size_t errlen);
void journal_free(struct journal *j);

/* Copies the entries into a malloc'd array (caller frees). */
int journal_entries(struct journal *j, struct journal_entry **out, int *n);

/* Adds (txn, vm) durably; a vm already present is replaced. */
int journal_add(struct journal *j, const char *txn, const char *vm,
                char *err, size_t errlen);
/* Adds (txn, vms[i]) for all n VMs in one durable write. */
int journal_add_many(struct journal *j, const char *txn,
                     const char *const *vms, int n, char *err,
                     size_t errlen);
/* Removes vm durably (absent is fine). */
int journal_remove(struct journal *j, const char *vm, char *err,
                   size_t errlen);

#endif
