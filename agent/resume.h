/*
 * resume: resuming VMs the agent paused (invariant 2: never left paused).
 * A resume that succeeds clears the VM's `paused` journal entry and then
 * thaws its guest if a freeze left a guest agent open (quiesce.c); one that
 * fails marks the VM needs_resume, and the reaper retries it (reaper.c).
 */
#ifndef CP_RESUME_H
#define CP_RESUME_H

#include "agent.h"

struct resume_job {
    struct agent *a;
    struct vm *vm;
    const char *why;        /* for the log: commit, abort, lease_expired... */
    const char *txn;        /* may be NULL */
    double cont_ms;
    double t_end;           /* when cont returned */
    double paused_ms;       /* pause window ended by this cont, -1 unknown */
    int rc;
    struct qmp_err err;
};

/* Resumes j->vm (a par_fn: arg is a struct resume_job). */
void *resume_one(void *arg);

/* Resumes the n VMs in parallel; jobs[0..n) get the results. */
void resume_vms(struct agent *a, struct vm **vms, int n, const char *txn,
                const char *why, struct resume_job *jobs);

#endif
