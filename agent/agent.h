/*
 * agent: the agent's state (config, VMs, hypervisor connections, Ceph,
 * journal, transactions, counters), its start and stop, and lookups of its
 * VMs and disks.  What runs on that state lives in files of its own:
 *
 *   dispatch.c   the command table; cmd_txn.c, cmd_snap.c, cmd_vm.c,
 *                cmd_info.c: the handlers, by family
 *   txn_vm.c     one VM's part of a prepare and of a commit
 *   resume.c     resuming VMs;  quiesce.c: guest freeze and thaw
 *   reaper.c     the lease and resume-retry thread
 *   recover.c    what a previous run left undone (journal, fencing)
 *   bringup.c    the rest of the start; inventory.c: VMs the hypervisor
 *                connections report later, and the inventory reply
 *
 * Locking: a.mu guards the transaction table, the VMs' needs_resume,
 * starting, paused_at and quiesce fields, and the reaper's retry state; it
 * is never held across a VM call.  Each VM's own mutex serializes calls to
 * that VM (vm.h).
 */
#ifndef CP_AGENT_H
#define CP_AGENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "journal.h"
#include "rbdsnap.h"
#include "txn.h"
#include "vm.h"

struct agent {
    struct agent_config cfg;
    struct vm vms[CFG_MAX_VMS];
    int nvms;
    struct journal *journal;
    struct rbdsnap_cluster *ceph;
    struct vm_host host;        /* the hypervisor drivers' connections */
    pthread_mutex_t mu;
    pthread_cond_t cond;        /* CLOCK_MONOTONIC; txn state changes */
    struct txn_table txns;
    pthread_t reaper;
    int reaper_started;
    int stopping;
    /* bringup.c: 0 not started, 1 running, 2 done, 3 given up (stopping) */
    int bringup_state;
    int host_open;              /* bringup opened a.host */
    /* inventory.c: the live inventory's thread, its generation, the disks
     * of VMs it adopted (a.mu, but adopt_mu for adopting) */
    pthread_t inventory;
    int inventory_started, inv_kick, inv_full_warned;
    pthread_mutex_t adopt_mu;
    long inv_generation;
    uint64_t inv_digest;
    char instance[17];          /* this run of the agent, random hex */
    double images_retry_at[CFG_MAX_VMS], images_warned_at[CFG_MAX_VMS];
    /* reaper.c: a resume retry of vms[i] is running / last started */
    int retrying[CFG_MAX_VMS];
    double last_retry[CFG_MAX_VMS];
    double started_ms;
    atomic_long connections, requests, errors;
    atomic_long n_prepared, n_committed, n_aborted, n_expired;
    atomic_long resumed_by_lease, resumed_by_journal;
    atomic_long n_thaw_failed;  /* guests possibly left frozen (outage) */
};

/*
 * Recovery first (invariant 2): opens the journal and the configured VMs'
 * own monitors, and undoes what the journal says a previous run left done
 * (recover.c), before anything that needs the network or another daemon;
 * then starts the reaper and, in the background, the rest (bringup.c:
 * libvirt, Ceph, images, retried with backoff).  -1 (err says what) only
 * when the journal cannot be opened or a thread cannot start.
 */
int agent_start(struct agent *a, const struct agent_config *cfg, char *err,
                size_t errlen);
/* Resumes the VMs of live transactions, stops the reaper, frees. */
void agent_stop(struct agent *a);

/* The VM named name, or NULL. */
struct vm *agent_find_vm(struct agent *a, const char *name);
/* "vm/node" → VM and disk index; -1 when unknown. */
int agent_find_disk(struct agent *a, const char *id, struct vm **vmp,
                    int *idx);
/* Opens the VM's rbd disks that are not open yet; -1 with err on the
 * first failure (those opened stay open). */
int agent_open_images(struct agent *a, struct vm *v, char *err,
                      size_t errlen);
/* Waits on a.cond (a.mu held) for at most ms. */
void agent_wait(struct agent *a, double ms);
/* Txn id once it is not in a transitional state (the owner of one
 * broadcasts a.cond when it leaves it), or NULL when unknown (a.mu held). */
struct txn *agent_txn_stable(struct agent *a, const char *id);

#endif
