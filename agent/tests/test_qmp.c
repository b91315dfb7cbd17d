/*
 * cmocka tests of qmp.c, replaying replies recorded from the real QEMU
 * (tests/qmp-replies/NAME.txt, made by tests/record_qmp.py) over a
 * socketpair, with the replay peer of fakepeer.h.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fakepeer.h"
#include "mono.h"
#include "qmp.h"

struct fixture {
    struct fakepeer_qmp r;
    struct qmp_conn *q;
    int cfd;
    int events_stop, events_resume;
};

static void
on_event(const char *ev, json_t *msg, void *opaque)
{
    struct fixture *f = opaque;

    assert_non_null(json_object_get(msg, "timestamp"));
    if (strcmp(ev, "STOP") == 0)
        f->events_stop++;
    if (strcmp(ev, "RESUME") == 0)
        f->events_resume++;
}

static void
start(struct fixture *f, const char **files, int chunk, int hang_after)
{
    memset(f, 0, sizeof(*f));
    f->cfd = fakepeer_qmp_start(&f->r, files, chunk, hang_after);
    f->q = qmp_new("replay");
    qmp_set_event_cb(f->q, on_event, f);
}

static void
finish(struct fixture *f)
{
    qmp_free(f->q);     /* closes cfd, so a blocked server returns */
    fakepeer_qmp_finish(&f->r);
    assert_int_equal(f->r.mismatches, 0);
}

static void
test_greeting_and_stop_event(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "stop-with-event.txt", "cont-with-event.txt", NULL};
    struct fixture f;
    struct qmp_err err;
    json_t *ret = NULL;

    (void)state;
    start(&f, files, 0, -1);
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    assert_int_equal(qmp_call(f.q, "stop", NULL, 2000, NULL, &err), 0);
    assert_int_equal(f.events_stop, 1);
    assert_int_equal(qmp_call(f.q, "query-status", NULL, 2000, &ret, &err), 0);
    assert_string_equal(json_string_value(json_object_get(ret, "status")),
                        "paused");
    json_decref(ret);
    assert_int_equal(qmp_call(f.q, "cont", NULL, 2000, NULL, &err), 0);
    assert_int_equal(qmp_call(f.q, "query-status", NULL, 2000, &ret, &err), 0);
    assert_true(json_is_true(json_object_get(ret, "running")));
    assert_int_equal(f.events_resume, 1);
    assert_int_equal(qmp_events_seen(f.q), 2);
    json_decref(ret);
    finish(&f);
}

static void
test_replies_in_pieces(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "transaction-snapshot.txt", NULL};
    struct fixture f;
    struct qmp_err err;
    json_t *acts;

    (void)state;
    start(&f, files, 3, -1);
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    assert_int_equal(qmp_call(f.q, "stop", NULL, 2000, NULL, &err), 0);
    acts = json_pack("{s:[{s:s,s:{s:s,s:s}}]}", "actions", "type",
                     "blockdev-snapshot-internal-sync", "data", "device",
                     "disk0", "name", "cp.g.t1");
    assert_int_equal(qmp_call(f.q, "transaction", acts, 2000, NULL, &err), 0);
    assert_int_equal(qmp_call(f.q, "cont", NULL, 2000, NULL, &err), 0);
    assert_int_equal(f.events_stop, 1);
    assert_int_equal(f.events_resume, 1);
    finish(&f);
}

static void
test_error_unknown_command(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "error-unknown-command.txt", NULL};
    struct fixture f;
    struct qmp_err err;

    (void)state;
    start(&f, files, 0, -1);
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    assert_int_equal(qmp_call(f.q, "no-such-command", NULL, 2000, NULL, &err),
                     -1);
    assert_int_equal(err.kind, QMP_E_ERROR);
    assert_string_equal(err.cls, "CommandNotFound");
    assert_non_null(strstr(err.msg, "no-such-command: The command "
                           "no-such-command has not been found"));
    /* an error reply leaves the connection usable */
    assert_true(qmp_connected(f.q));
    finish(&f);
}

static void
test_error_bad_device(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "error-bad-device.txt", NULL};
    struct fixture f;
    struct qmp_err err;

    (void)state;
    start(&f, files, 0, -1);
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    assert_int_equal(qmp_call(f.q, "transaction", json_object(), 2000, NULL,
                              &err), -1);
    assert_int_equal(err.kind, QMP_E_ERROR);
    assert_string_equal(err.cls, "GenericError");
    assert_non_null(strstr(err.msg, "nodisk"));
    finish(&f);
}

static void
test_timeout_hung_qemu(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "stop-with-event.txt", NULL};
    struct fixture f;
    struct qmp_err err;
    double t0, dt;

    (void)state;
    start(&f, files, 0, 1);     /* answers qmp_capabilities, then hangs */
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    t0 = mono_ms();
    assert_int_equal(qmp_call(f.q, "stop", NULL, 150, NULL, &err), -1);
    dt = mono_ms() - t0;
    assert_int_equal(err.kind, QMP_E_TIMEOUT);
    assert_true(dt >= 140 && dt < 1000);
    assert_false(qmp_connected(f.q));   /* dropped: state unknown */
    finish(&f);
}

/* qmp_call_pair: stop and a transaction sent together (the redirect
 * cut's switch), on QEMU's recorded replies. */
static void
test_pair_stop_then_transaction(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "transaction-snapshot.txt", NULL};
    struct fixture f;
    struct qmp_err err;
    json_t *acts;
    double t0, t1 = 0;
    int which = 0;

    (void)state;
    start(&f, files, 3, -1);
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    acts = json_pack("{s:[{s:s,s:{s:s,s:s}},{s:s,s:{s:s,s:s}}]}", "actions",
                     "type", "blockdev-snapshot-internal-sync", "data",
                     "device", "disk0", "name", "cp.g.t1", "type",
                     "blockdev-snapshot-internal-sync", "data", "device",
                     "disk1", "name", "cp.g.t1");
    t0 = mono_ms();
    assert_int_equal(qmp_call_pair(f.q, "stop", NULL, "transaction", acts,
                                   2000, &t1, &which, &err), 0);
    assert_true(t1 >= t0 && t1 <= mono_ms());
    assert_int_equal(f.events_stop, 1);
    /* the stream is in step: the next call gets its own reply */
    assert_int_equal(qmp_call(f.q, "cont", NULL, 2000, NULL, &err), 0);
    assert_int_equal(f.events_resume, 1);
    finish(&f);
}

static void
test_pair_second_refused(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "stop-then-bad-switch.txt", NULL};
    struct fixture f;
    struct qmp_err err;
    double t1 = 0;
    int which = 0;

    (void)state;
    start(&f, files, 0, -1);
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    assert_int_equal(qmp_call_pair(f.q, "stop", NULL, "transaction",
                                   json_pack("{s:[]}", "actions"), 2000, &t1,
                                   &which, &err), -1);
    assert_int_equal(which, 2);         /* stopped; the switch refused */
    assert_int_equal(err.kind, QMP_E_ERROR);
    assert_non_null(strstr(err.msg, "transaction: Cannot find device"));
    assert_true(qmp_connected(f.q));
    finish(&f);
}

static void
test_pair_hung_stop(void **state)
{
    const char *files[] = {"greeting.txt", "capabilities.txt",
                           "transaction-snapshot.txt", NULL};
    struct fixture f;
    struct qmp_err err;
    double t1 = 0;
    int which = 0;

    (void)state;
    start(&f, files, 0, 1);     /* answers qmp_capabilities, then hangs */
    assert_int_equal(qmp_open_fd(f.q, f.cfd, 2000, &err), 0);
    assert_int_equal(qmp_call_pair(f.q, "stop", NULL, "transaction",
                                   json_pack("{s:[]}", "actions"), 150, &t1,
                                   &which, &err), -1);
    assert_int_equal(which, 1);
    assert_int_equal(err.kind, QMP_E_TIMEOUT);
    assert_false(qmp_connected(f.q));   /* dropped: state unknown */
    finish(&f);
}

static void
test_not_qmp_and_eof(void **state)
{
    struct qmp_conn *q = qmp_new("x");
    struct qmp_err err;
    int sv[2];

    (void)state;
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(write(sv[1], "[1,2]\n", 6), 6);
    assert_int_equal(qmp_open_fd(q, sv[0], 500, &err), -1);
    assert_int_equal(err.kind, QMP_E_PROTO);
    close(sv[1]);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    close(sv[1]);
    assert_int_equal(qmp_open_fd(q, sv[0], 500, &err), -1);
    assert_int_equal(err.kind, QMP_E_IO);
    /* connecting to a missing socket is an I/O error, not a hang */
    qmp_free(q);
    q = qmp_new("/nonexistent/qmp.sock");
    assert_int_equal(qmp_call(q, "stop", NULL, 500, NULL, &err), -1);
    assert_int_equal(err.kind, QMP_E_IO);
    qmp_free(q);
    qmp_free(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greeting_and_stop_event),
        cmocka_unit_test(test_replies_in_pieces),
        cmocka_unit_test(test_error_unknown_command),
        cmocka_unit_test(test_error_bad_device),
        cmocka_unit_test(test_timeout_hung_qemu),
        cmocka_unit_test(test_pair_stop_then_transaction),
        cmocka_unit_test(test_pair_second_refused),
        cmocka_unit_test(test_pair_hung_stop),
        cmocka_unit_test(test_not_qmp_and_eof),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
