/*
 * vm: one managed VM, and the hypervisor drivers that run VMs.
 *
 * A driver is an operations table, struct vm_ops, in its own file:
 *   vm_qmp.c      "qmp"      QEMU over the VM's QMP UNIX socket (qmp.c)
 *   vm_libvirt.c  "libvirt"  libvirt domains through libvirt's native
 *                            API (with lvconn.c, lvcall.c, domxml.c: the
 *                            only files that call libvirt)
 * The driver table in vm.c lists them; a VM's `driver =` in the config
 * names its row.  Adding a driver adds a vm_*.c file and a table row.
 *
 * Every call on a VM takes the VM's mutex (vm_lock), so one VM's calls
 * are serialized while other VMs proceed in parallel; a hung QEMU stalls
 * only its own VM, and each call is bounded by its deadline.
 * Errors use struct qmp_err: QMP_E_TIMEOUT → QMP_TIMEOUT, others →
 * QMP_ERROR (vm_err_code).
 */
#ifndef CP_VM_H
#define CP_VM_H

#include <pthread.h>
#include <jansson.h>

#include "config.h"
#include "qmp.h"
#include "rbdsnap.h"
#include "snap.h"

struct vm;
/* An open channel to a VM's guest agent; its type is the driver's. */
struct vm_guest;

struct vm_ops {
    const char *name;           /* config `driver =`, inventory `driver` */

    /* ---- the driver's hypervisor connection (any op may be NULL) ---- */
    /* Checks one [vm] section of this driver at config load (and may fill
     * defaults); errors name path and the VM. */
    int (*config_check)(const struct agent_config *cfg, struct cfg_vm *m,
                        const char *path, char *err, size_t errlen);
    /* Opens the connection when cfg configures one; *conn stays NULL
     * otherwise. */
    int (*conn_open)(const struct agent_config *cfg, void **conn, char *err,
                     size_t errlen);
    void (*conn_close)(void *conn);
    /* 0 when the connection is up and knows its VMs; -1 with why.  NULL:
     * ready once opened. */
    int (*conn_ready)(void *conn, char *err, size_t errlen);
    /* fn(opaque) is called, from a thread of the driver, whenever what
     * the connection knows changes (VMs come, go, change state). */
    void (*conn_watch)(void *conn, void (*fn)(void *opaque), void *opaque);
    /* The connection's facts for `inventory` (no I/O): at least
     * "connected" (bool); its "events" and "epoch" count changes. */
    void (*conn_describe)(void *conn, json_t *o);
    /* vm.start of a signed definition (agent-protocol §4.9): the domain
     * called name, when it is not running or paused, is defined from xml
     * (verified by the caller) and started, within timeout_ms; *state is
     * what it was before ("running"/"paused": nothing done), *cmd_ms the
     * define and start.  transient: started without a persistent
     * definition (a drill's copy: vm.stop leaves nothing defined).  NULL:
     * the driver starts no definition. */
    int (*define_start)(void *conn, const char *name, const char *xml,
                        int transient, int timeout_ms, const char **state,
                        double *cmd_ms, struct qmp_err *err);
    /* Fills out[0..max) with the VMs the connection knows now that cfg
     * does not name, when cfg asks for discovery; returns how many. */
    int (*discover)(void *conn, const struct agent_config *cfg,
                    struct cfg_vm *out, int max);
    /* 1 when cfg has this driver discover VMs (before any connection:
     * recovery keeps the journal entries of VMs it may bring back). */
    int (*may_discover)(const struct agent_config *cfg);
    /* Completes a configured VM from what the connection knows (libvirt:
     * the disks of a VM that names none, from the domain XML); 1 when it
     * changed m. */
    int (*fill)(void *conn, const struct agent_config *cfg,
                struct cfg_vm *m);

    /* ---- one VM ---- */
    /* Sets up v->priv (no I/O); conn is the driver's connection, NULL
     * before it is opened; called again with it then (vm_attach). */
    int (*open)(struct vm *v, void *conn);
    void (*close)(struct vm *v);
    /* 1 when the VM has something to talk to now (qmp: its socket
     * exists; libvirt: the domain runs); a startable VM without one is a
     * standby. */
    int (*present)(const struct vm *v);
    /* 1 when vm.start may start this VM; 0 with why otherwise. */
    int (*startable)(const struct vm *v, char *why, size_t len);
    /* The VM's entry of `inventory`, without I/O: sets "state" and
     * "stale" and the driver's own facts in o; 1 when the VM is gone (a
     * discovered VM whose domain no longer exists: not listed).  NULL:
     * state from the state op. */
    int (*describe)(struct vm *v, json_t *o);
    /* 0 when the VM's snapshot method can run on this driver; -1 with
     * why (checked by prepare, before any pause).  NULL: always. */
    int (*snap_check)(const struct vm *v, char *err, size_t errlen);
    /* The QEMU block node of disk d for the QMP snapshot backend; NULL:
     * the config's node name. */
    const char *(*monitor_node)(struct vm *v, int d);
    /* Connects to the VM's monitor now, so that no pause window holds a
     * connect (design "Coordinator latency"). */
    int (*connect)(struct vm *v, int timeout_ms, struct qmp_err *err);
    int (*pause)(struct vm *v, int timeout_ms, struct qmp_err *err);
    /* pause, then the raw QMP command cmd (args stolen) with both sent at
     * once, so that the command runs in QEMU right after the pause with no
     * round trip to us between (the redirect cut's switch).  *t_paused:
     * when the pause's reply came; on -1, *which is 1 (the pause failed;
     * the command may have run) or 2.  NULL: vm_stop_then pauses, then
     * calls qmp. */
    int (*pause_then)(struct vm *v, const char *cmd, json_t *args,
                      int timeout_ms, double *t_paused, int *which,
                      struct qmp_err *err);
    /* Resuming a running VM is success (agent-protocol §4.6). */
    int (*resume)(struct vm *v, int timeout_ms, struct qmp_err *err);
    /* "running", "paused", "shutoff" or "unknown" (never fails). */
    const char *(*state)(struct vm *v, int timeout_ms);
    /* Raw QMP to the VM's QEMU (the QMP snapshot backend uses it); args
     * stolen, *ret new reference (may be NULL). */
    int (*qmp)(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
               json_t **ret, struct qmp_err *err);
    /* vm.definition: the VM's persistent definition (*out, a new
     * string) in the format definition_format names.  NULL: none. */
    int (*definition)(struct vm *v, int timeout_ms, char **out,
                      struct qmp_err *err);
    const char *definition_format;
    /* vm.stop: stops the VM for good. */
    int (*poweroff)(struct vm *v, int timeout_ms, struct qmp_err *err);
    /* vm.start of a configured VM that is shut off: starts it and waits
     * until it runs, by deadline (mono_ms); *cmd_ms is the time the
     * driver's own start step took. */
    int (*start)(struct vm *v, double deadline, double *cmd_ms,
                 struct qmp_err *err);

    /* ---- the guest (quiesce fs-freeze, agent-protocol §4.3) ---- */
    /* 1 when the VM has a guest agent channel configured. */
    int (*guest_configured)(const struct vm *v);
    int (*guest_open)(const struct vm *v, struct vm_guest **out, char *err,
                      size_t errlen);
    /* *nfs: the number of filesystems frozen / thawed.  guest_freeze
     * returns VM_GUEST_UNSENT when the freeze never reached the guest. */
    int (*guest_freeze)(struct vm_guest *g, int timeout_ms, int *nfs,
                        char *err, size_t errlen);
    int (*guest_thaw)(struct vm_guest *g, int *nfs, char *err,
                      size_t errlen);
    void (*guest_close)(struct vm_guest *g);
    /* Any guest agent command (vm.guest_ping, vm.guest_exec;
     * agent-protocol §4.12): cmd with args (stolen, may be NULL) through
     * the VM's guest agent channel within timeout_ms; *ret is its
     * "return" (new reference).  err->kind QMP_E_TIMEOUT: no answer in
     * time; otherwise the channel or the guest agent refused (no channel,
     * not connected, an error reply).  NULL: the driver has none. */
    int (*guest_command)(struct vm *v, const char *cmd, json_t *args,
                         int timeout_ms, json_t **ret, struct qmp_err *err);
};

/* guest_freeze failed before the freeze was sent (the guest agent did not
 * answer the sync): the guest cannot have been frozen, nothing to thaw. */
#define VM_GUEST_UNSENT (-2)

extern const struct vm_ops vm_qmp_ops;
extern const struct vm_ops vm_libvirt_ops;

/* The driver table: its row of name, or NULL. */
const struct vm_ops *vm_driver_find(const char *name);
/* Row i of the table, or NULL past its end (for iteration). */
const struct vm_ops *vm_driver_at(int i);

#define VM_MAX_DRIVERS 8
/* NIC backends (netdevs) per VM that the live cut can hold (hold.h). */
#define VM_MAX_NICS 8

/* This agent's hypervisor connections, one slot per row of the table. */
struct vm_host {
    void *conn[VM_MAX_DRIVERS];
};

/* Opens every driver's connection that cfg configures.  On -1 err says
 * what failed. */
int vm_host_open(struct vm_host *h, struct agent_config *cfg, char *err,
                 size_t errlen);
/* 0 when every open connection is ready (conn_ready); -1 with why. */
int vm_host_ready(struct vm_host *h, char *err, size_t errlen);
void vm_host_close(struct vm_host *h);
/* The connection of driver row i, or NULL. */
void *vm_host_conn(struct vm_host *h, int i);

struct vm {
    const struct cfg_vm *cfg;          /* borrowed from the agent config */
    const struct vm_ops *ops;          /* its driver */
    void *priv;                        /* the driver's per-VM state */
    pthread_mutex_t mu;
    struct rbdsnap_image *img[CFG_MAX_DISKS];   /* rbd disks, or NULL */
    const struct snap_ops *snap;       /* the backend of cfg->method */
    struct snap_mon mon;               /* this VM's monitor, for snap_qmp */
    int needs_resume;                  /* a resume failed: the reaper retries */
    int starting;                      /* a vm.start runs (guarded by agent mu) */
    int images_deferred;               /* rbd disks not open yet: a standby VM
                                          (start =, no QMP socket at start);
                                          vm.start opens them */
    int storage_pending;               /* bringup has not opened its disks
                                          yet: no prepare (guarded by agent
                                          mu) */
    char needs_resume_txn[129];
    double paused_at;                  /* start of the stop that paused it, 0 if
                                          not paused by us (guarded by agent mu) */
    /* quiesce of the current txn (set by prepare; guarded by agent mu) */
    struct vm_guest *guest;            /* open guest agent: thaw pending */
    const char *consistency;           /* "crash" or "fs-freeze" */
    double freeze_ms, thaw_ms;         /* thaw_ms < 0: no thaw yet */
    char freeze_error[256];
    char thaw_error[256];              /* "" unless the last thaw failed */
    /* a thaw that failed, retried by the reaper with backoff until the
     * guest agent answers or the guest is gone (quiesce.c; agent mu) */
    int thaw_pending, thaw_running, thaw_attempts;
    double thaw_next;                  /* mono_ms of the next attempt */
    char thaw_txn[129];                /* the `frozen` entry's txn */
    /* how long past a commit's budget its snapshot method can keep the VM
     * paused (vm_pause_bound; only prepare, which owns the VM, uses it) */
    int bound_ms;                      /* 0 none, -1 no limit */
    double bound_at;                   /* mono_ms when looked up, 0 never */
    char bound_why[400];
    /* the live cut's network hold (hold.h): v's filters, set up by
     * hold_ready (used by prepare, which owns the VM) */
    int hold_state;                    /* 0 not looked at, 1 ready, -1 not
                                          usable (hold_why) */
    int nhold;
    char hold_id[VM_MAX_NICS][96];     /* the filters' QOM ids */
    char hold_why[256];
    double hold_at;                    /* mono_ms of the look, 0 never */
    /* guarded by agent mu: held, its filters may be on (a resume turns
     * them off); hold_only, held without a stop (a resume sends no cont) */
    int held, hold_only;
};

/* Sets v up for cfg with the driver cfg->driver names (no I/O). */
int vm_open(struct vm *v, const struct cfg_vm *cfg, struct vm_host *h);
void vm_close(struct vm *v);
/* Gives v its driver's connection in h, opened after v (the libvirt
 * connection comes after recovery); no-op for drivers without one. */
void vm_attach(struct vm *v, struct vm_host *h);
/* Lets v's driver fill in what its config leaves to the connection in h
 * (the fill op), and picks v's snapshot backend again.  Before any
 * request may use v (it is storage_pending). */
void vm_fill(struct vm *v, struct vm_host *h, const struct agent_config *cfg);

/* Each takes the VM's mutex for its duration (through its driver). */
int vm_connect(struct vm *v, int timeout_ms, struct qmp_err *err);
int vm_stop(struct vm *v, int timeout_ms, struct qmp_err *err);
/* The driver's pause_then, or vm_stop and vm_qmp one after the other. */
int vm_stop_then(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
                 double *t_paused, int *which, struct qmp_err *err);
int vm_cont(struct vm *v, int timeout_ms, struct qmp_err *err);
const char *vm_state(struct vm *v, int timeout_ms);
int vm_qmp(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
           json_t **ret, struct qmp_err *err);
int vm_poweroff(struct vm *v, int timeout_ms, struct qmp_err *err);
/* 1 for a configured VM that vm.start boots and that has nothing to talk
 * to yet (a DR standby). */
int vm_is_standby(const struct vm *v);
/* 1 when some driver may add VMs that cfg does not name (may_discover). */
int vm_may_discover(const struct agent_config *cfg);
/* 1 when vm.start may start v; 0 with why. */
int vm_startable(const struct vm *v, char *why, size_t len);

const char *vm_err_code(const struct qmp_err *err);

/* Disk d of v as the snapshot backends see it (borrows from v). */
void vm_snap_disk(struct vm *v, int d, struct snap_disk *out);

/*
 * How long past a commit's budget v's snapshot method can keep v paused:
 * the sum over its rbd disks of the backend's pause_bound (snap.h), into
 * v->bound_ms (-1: no limit, with the reason in v->bound_why).  Looked up
 * again after VM_BOUND_TTL_MS: a VM's storage config changes only with a
 * new QEMU.  0, or -1 with err when the lookup failed (QEMU did not
 * answer, its Ceph config unreadable).
 */
#define VM_BOUND_TTL_MS 60000.0
int vm_pause_bound(struct vm *v, int timeout_ms, struct snap_err *err);

/* For drivers: takes v's mutex within timeout_ms, or fails with a
 * QMP_E_TIMEOUT naming what was attempted. */
int vm_lock(struct vm *v, int timeout_ms, struct qmp_err *err,
            const char *what);
void vm_unlock(struct vm *v);

#endif
