/*
 * par: the agent's parallel runners.  A request that touches several VMs
 * drives each VM from its own thread, so that one slow VM never delays
 * the others' pause window; background work (lease expiry, resume
 * retries) runs in detached threads so that the thread that found it due
 * never waits on a VM.
 */
#ifndef CP_PAR_H
#define CP_PAR_H

#include <stddef.h>

typedef void *(*par_fn)(void *);

/* Runs fn over n items of size bytes each, one thread per item, and
 * returns when all are done.  Inline when n == 1; an item whose thread
 * cannot be created runs in the caller.  n <= CFG_MAX_VMS. */
void par_run(par_fn fn, void *items, size_t size, int n);

/* Runs fn(arg) in a detached thread, or here when no thread can be made
 * (late rather than never). */
void par_detach(par_fn fn, void *arg);

#endif
