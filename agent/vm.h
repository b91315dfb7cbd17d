/*
 * vm: one managed VM and its hypervisor driver.
 *   qmp     — QMP over the VM's UNIX socket (qmp.c);
 *   libvirt — virDomainSuspend/Resume/GetState, and raw QMP through
 *             virDomainQemuMonitorCommand (QMP transaction snapshots).
 * Every call takes the VM's mutex, so one VM's calls are serialized while
 * other VMs proceed in parallel; a hung QEMU stalls only its own VM, and
 * each QMP call is bounded by its deadline.
 * Errors use struct qmp_err: QMP_E_TIMEOUT → QMP_TIMEOUT, others → QMP_ERROR.
 */
#ifndef CP_VM_H
#define CP_VM_H

#include <pthread.h>
#include <jansson.h>
#include <libvirt/libvirt.h>

#include "config.h"
#include "qmp.h"
#include "rbdsnap.h"
#include "snap.h"

struct qga_conn;

struct vm {
    const struct cfg_vm *cfg;          /* borrowed from the agent config */
    pthread_mutex_t mu;
    struct qmp_conn *qmp;              /* qmp driver */
    virConnectPtr conn;                /* libvirt driver (shared, borrowed) */
    struct rbdsnap_image *img[CFG_MAX_DISKS];   /* rbd disks, or NULL */
    const struct snap_ops *snap;       /* the backend of cfg->method */
    struct snap_mon mon;               /* this VM's monitor, for snap_qmp */
    int needs_resume;                  /* a resume failed: the reaper retries */
    int starting;                      /* a vm.start runs (guarded by agent mu) */
    int images_deferred;               /* rbd disks not open yet: a standby VM
                                          (start =, no QMP socket at start);
                                          vm.start opens them */
    char needs_resume_txn[129];
    double paused_at;                  /* start of the stop that paused it, 0 if
                                          not paused by us (guarded by agent mu) */
    /* quiesce of the current txn (set by prepare; guarded by agent mu) */
    struct qga_conn *qga;              /* open guest agent: thaw pending */
    const char *consistency;           /* "crash" or "fs-freeze" */
    double freeze_ms, thaw_ms;         /* thaw_ms < 0: no thaw yet */
    char freeze_error[256];
    char thaw_error[256];              /* "" unless the last thaw failed */
};

int vm_init(struct vm *v, const struct cfg_vm *cfg, virConnectPtr conn);
void vm_destroy(struct vm *v);

/* Each takes the VM's mutex for its duration. */
int vm_stop(struct vm *v, int timeout_ms, struct qmp_err *err);
int vm_cont(struct vm *v, int timeout_ms, struct qmp_err *err);
/* state: "running", "paused", "shutoff" or "unknown" (never fails). */
const char *vm_state(struct vm *v, int timeout_ms);
/* Raw QMP; args stolen; *ret new reference (may be NULL). */
int vm_qmp(struct vm *v, const char *cmd, json_t *args, int timeout_ms,
           json_t **ret, struct qmp_err *err);
/* Stops the VM for good (QMP quit / virDomainDestroy). */
int vm_poweroff(struct vm *v, int timeout_ms, struct qmp_err *err);

const char *vm_err_code(const struct qmp_err *err);

/* Disk d of v as the snapshot backends see it (borrows from v). */
void vm_snap_disk(struct vm *v, int d, struct snap_disk *out);

#endif
