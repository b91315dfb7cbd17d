/*
 * redirect_node: the QMP block-graph steps that making overlays
 * (redirect.c) and merging them back (redirect_merge.c) both take: the
 * overlay nodes' names, the VM's block nodes and devices, waiting for a
 * block job, and the note that a QEMU did not answer in time.  Internal to
 * the redirect cut's files (redirect.h is the cut's interface).
 */
#ifndef CP_REDIRECT_NODE_H
#define CP_REDIRECT_NODE_H

#include <stddef.h>

#include <jansson.h>

#include "qmp.h"
#include "vm.h"

/* Set by rd_qmp_err when a QMP call of this thread timed out: its QEMU does
 * not answer (redirect_make's *hung).  Cleared by whoever starts a step. */
extern __thread int rd_qmp_hung;

/* buf = kind followed by d: "cpov0" (the overlay), "cpovf0" (its rbd
 * node), "cpmk0" (its create job), "cpcm0" (its merge job). */
void rd_node_name(char *buf, size_t len, const char *kind, int d);
/* A short sleep between polls of a block job. */
void rd_nap(void);
/* err = qe's message (rd_qmp_hung set on a timeout); returns -1. */
int rd_qmp_err(char *err, size_t errlen, const struct qmp_err *qe);
/* The VM's block nodes (query-named-block-nodes, flat), a new array. */
json_t *rd_block_nodes(struct vm *v, int timeout_ms, char *err,
                       size_t errlen);
/* The node named name in nodes (borrowed), or NULL. */
json_t *rd_find_node(json_t *nodes, const char *name);
/* Waits until job id concludes, then dismisses it; when ready is set, a
 * job that reports "ready" is completed (an active commit).  *ended (when
 * not NULL) is 1 when the job no longer runs, whatever the result. */
int rd_job_finish(struct vm *v, const char *id, int ready, double deadline,
                  int timeout_ms, int *ended, char *err, size_t errlen);
/* 1 when node is the root of one of the VM's block devices (query-block):
 * a switched overlay. */
int rd_is_root(json_t *blocks, const char *node);

#endif
