/*
 * agent: the agent's state (config, VMs, journal, transactions) and the
 * command handlers of agent-protocol §4.  agent_handle runs in a request
 * thread; handlers that touch several VMs drive each VM from its own thread
 * so that one slow VM never delays the others' pause window.
 *
 * Locking: a.mu guards the transaction table and the needs_resume flags;
 * it is never held across a VM call.  Each VM's own mutex serializes calls
 * to that VM (vm.h).
 */
#ifndef CP_AGENT_H
#define CP_AGENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <jansson.h>

#include "config.h"
#include "journal.h"
#include "proto.h"
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
    double started_ms;
    atomic_long connections, requests, errors;
    atomic_long n_prepared, n_committed, n_aborted, n_expired;
    atomic_long resumed_by_lease, resumed_by_journal;
    atomic_long n_thaw_failed;  /* guests possibly left frozen (outage) */
};

/* Opens the hypervisor connections, Ceph images, the journal; resumes journaled VMs; starts
 * the lease reaper.  On -1, err says what failed. */
int agent_start(struct agent *a, const struct agent_config *cfg, char *err,
                size_t errlen);
/* Resumes the VMs of live transactions, stops the reaper, frees. */
void agent_stop(struct agent *a);

/*
 * Runs one validated request.  Returns the result object (new reference)
 * or NULL with *code/msg set; *err_result may receive partial facts for an
 * error reply (new reference or NULL).
 */
json_t *agent_handle(struct agent *a, const struct proto_request *req,
                     const char **code, char *msg, size_t msglen,
                     json_t **err_result);

#endif
