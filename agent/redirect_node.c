/* redirect_node: see redirect_node.h. */
#include "redirect_node.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mono.h"

/* Error messages are bounded buffers and are cut on purpose when long. */
#pragma GCC diagnostic ignored "-Wformat-truncation"

/* A block job is polled this often. */
#define RD_POLL_NS (2 * 1000000L)

void
rd_node_name(char *buf, size_t len, const char *kind, int d)
{
    snprintf(buf, len, "%s%d", kind, d);
}

void
rd_nap(void)
{
    struct timespec ts = {0, RD_POLL_NS};

    nanosleep(&ts, NULL);
}

__thread int rd_qmp_hung;

int
rd_qmp_err(char *err, size_t errlen, const struct qmp_err *qe)
{
    snprintf(err, errlen, "%s", qe->msg);
    if (qe->kind == QMP_E_TIMEOUT)
        rd_qmp_hung = 1;
    return -1;
}

json_t *
rd_block_nodes(struct vm *v, int timeout_ms, char *err, size_t errlen)
{
    struct qmp_err qe;
    json_t *ret = NULL;

    if (vm_qmp(v, "query-named-block-nodes", json_pack("{s:b}", "flat", 1),
               timeout_ms, &ret, &qe) < 0) {
        rd_qmp_err(err, errlen, &qe);
        return NULL;
    }
    return ret;
}

json_t *
rd_find_node(json_t *nodes, const char *name)
{
    size_t i;
    json_t *n;

    json_array_foreach(nodes, i, n) {
        const char *nn = json_string_value(json_object_get(n, "node-name"));
        if (nn && strcmp(nn, name) == 0)
            return n;
    }
    return NULL;
}

int
rd_job_finish(struct vm *v, const char *id, int ready, double deadline,
              int timeout_ms, int *ended, char *err, size_t errlen)
{
    struct qmp_err qe;
    char status[32];
    int dummy;

    if (!ended)
        ended = &dummy;
    *ended = 0;
    for (;;) {
        json_t *jobs = NULL, *j = NULL;
        const char *st = NULL;
        size_t i;

        if (vm_qmp(v, "query-jobs", NULL, timeout_ms, &jobs, &qe) < 0)
            return rd_qmp_err(err, errlen, &qe);
        json_array_foreach(jobs, i, j)
            if (strcmp(json_string_value(json_object_get(j, "id")) ?: "",
                       id) == 0)
                break;
        if (i == json_array_size(jobs)) {
            json_decref(jobs);
            *ended = 1;
            snprintf(err, errlen, "job %s is gone", id);
            return -1;
        }
        snprintf(status, sizeof(status), "%s",
                 json_string_value(json_object_get(j, "status")) ?: "");
        st = status;
        if (strcmp(st, "concluded") == 0) {
            const char *e = json_string_value(json_object_get(j, "error"));

            *ended = 1;
            if (e)
                snprintf(err, errlen, "job %s: %s", id, e);
            json_decref(jobs);
            vm_qmp(v, "job-dismiss", json_pack("{s:s}", "id", id),
                   timeout_ms, NULL, &qe);
            return e ? -1 : 0;
        }
        /* ready: completed once (it may still say ready for a while) */
        if (ready == 1 && strcmp(st, "ready") == 0) {
            if (vm_qmp(v, "job-complete", json_pack("{s:s}", "id", id),
                       timeout_ms, NULL, &qe) < 0) {
                json_decref(jobs);
                return rd_qmp_err(err, errlen, &qe);
            }
            ready = 2;
        }
        json_decref(jobs);
        if (mono_ms() > deadline) {
            snprintf(err, errlen, "job %s not done in time (status %s)", id,
                     st);
            return -1;
        }
        rd_nap();
    }
}

/* (A switched overlay's backing_file_depth says 0: the overlay's image
 * names no backing file, the graph does.) */
int
rd_is_root(json_t *blocks, const char *node)
{
    size_t i;
    json_t *b;

    json_array_foreach(blocks, i, b) {
        const char *nn = json_string_value(json_object_get(
            json_object_get(b, "inserted"), "node-name"));
        if (nn && strcmp(nn, node) == 0)
            return 1;
    }
    return 0;
}
