/*
 * libFuzzer target: the input is what a QEMU monitor sends, byte for
 * byte, before it closes: a greeting, then replies and events.  The client
 * negotiates (qmp_capabilities) and runs one command over it, as the agent
 * does, through a socketpair.
 */
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "qmp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int quiet;
    struct qmp_conn *q;
    struct qmp_err err;
    json_t *ret = NULL;
    int sv[2];

    if (!quiet) {
        log_set_level(LOG_WARN);
        quiet = 1;
    }
    /* the whole input fits the socket buffer (-max_len=4096) */
    if (size > 65536 || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
        return 0;
    if (size > 0 && write(sv[1], data, size) != (ssize_t)size) {
        close(sv[0]);
        close(sv[1]);
        return 0;
    }
    shutdown(sv[1], SHUT_WR);       /* then EOF: no deadline is waited */
    q = qmp_new("/nonexistent");
    if (q && qmp_open_fd(q, sv[0], 100, &err) == 0 &&
        qmp_call(q, "query-status", NULL, 100, &ret, &err) == 0)
        json_decref(ret);
    qmp_free(q);
    close(sv[1]);
    return 0;
}
