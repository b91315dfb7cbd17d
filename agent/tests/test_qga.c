/*
 * cmocka tests of qga.c, replaying the guest-agent bytes recorded from a
 * real qemu-guest-agent (dr-tests/tests/data/qga_transcript.json, recorded
 * by dr-tests/checkers/quiesce.py) over a socketpair.  A "sent" step is a
 * request the client must send (its "execute" is checked); a "received"
 * step is written back, with a sync reply's id replaced by the id the
 * client sent (ids are random).  The recording is latin-1 text: U+00FF is
 * the 0xFF delimiter byte.
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
#include <jansson.h>

#include "fakepeer.h"
#include "qga.h"

struct peer {
    int fd;
    json_t *steps;          /* [[dir, text], ...] */
    const char *prefix;     /* written before the first reply, or NULL */
    int mismatches;
    int requests;
};

static json_t *
load(const char *which)
{
    const char *path = getenv("QGA_TRANSCRIPT");
    json_error_t je;
    json_t *all = json_load_file(path ? path : "qga_transcript.json", 0, &je);
    json_t *s;

    if (!all)
        fail_msg("cannot load transcript: %s", je.text);
    s = json_incref(json_array_get(json_object_get(all, which), 0));
    json_decref(all);
    assert_non_null(s);
    return s;
}

/* latin-1 text (as jansson's UTF-8) to bytes */
static size_t
to_bytes(const char *s, char *out, size_t cap)
{
    size_t n = 0;
    const unsigned char *p = (const unsigned char *)s;

    while (*p && n < cap) {
        if (*p >= 0xc0 && p[1]) {
            out[n++] = (char)(((p[0] & 0x1f) << 6) | (p[1] & 0x3f));
            p += 2;
        } else {
            out[n++] = (char)*p++;
        }
    }
    return n;
}

static void *
peer_main(void *arg)
{
    struct peer *p = arg;
    json_int_t id = 0;
    size_t i;
    json_t *st;
    int first = 1;

    json_array_foreach(p->steps, i, st) {
        const char *dir = json_string_value(json_array_get(st, 0));
        const char *text = json_string_value(json_array_get(st, 1));
        char line[4096], want[4096], bytes[4096];

        if (strcmp(dir, "sent") == 0) {
            json_t *got, *exp;
            if (fakepeer_read_line(p->fd, line, sizeof(line)) < 0)
                return NULL;
            p->requests++;
            got = json_loads(line, 0, NULL);
            snprintf(want, sizeof(want), "%s", text);
            exp = json_loads(want, 0, NULL);
            if (!fakepeer_same_execute(got, exp))
                p->mismatches++;
            else if (json_object_get(json_object_get(got, "arguments"), "id"))
                id = json_integer_value(json_object_get(
                    json_object_get(got, "arguments"), "id"));
            json_decref(got);
            json_decref(exp);
        } else {
            size_t n = to_bytes(text, bytes, sizeof(bytes));
            if (first && p->prefix) {
                if (write(p->fd, p->prefix, strlen(p->prefix)) < 0)
                    return NULL;
            }
            first = 0;
            if (n > 0 && (unsigned char)bytes[0] == 0xff) {
                n = (size_t)snprintf(bytes, sizeof(bytes),
                                     "\xff{\"return\": %lld}\n",
                                     (long long)id);
            }
            if (write(p->fd, bytes, n) < 0)
                return NULL;
        }
    }
    /* then read (and never answer) until the client goes away */
    {
        char line[4096];
        while (fakepeer_read_line(p->fd, line, sizeof(line)) == 0)
            p->requests++;
    }
    return NULL;
}

static struct qga_conn *
start(struct peer *p, pthread_t *th, const char *which, const char *prefix)
{
    int sv[2];

    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    memset(p, 0, sizeof(*p));
    p->fd = sv[1];
    p->steps = load(which);
    p->prefix = prefix;
    assert_int_equal(pthread_create(th, NULL, peer_main, p), 0);
    return qga_open_fd(sv[0]);
}

static void
finish(struct peer *p, pthread_t th, struct qga_conn *q)
{
    qga_free(q);
    pthread_join(th, NULL);
    close(p->fd);
    json_decref(p->steps);
}

static void
test_live_sync_freeze_thaw(void **state)
{
    struct peer p;
    pthread_t th;
    char err[256];
    int nfs = -1;
    struct qga_conn *q = start(&p, &th, "live", NULL);

    (void)state;
    assert_int_equal(qga_sync(q, 12345, 1000, err, sizeof(err)), 0);
    assert_int_equal(qga_freeze(q, 5000, &nfs, err, sizeof(err)), 0);
    assert_int_equal(nfs, 4);
    nfs = -1;
    assert_int_equal(qga_thaw(q, 5000, &nfs, err, sizeof(err)), 0);
    assert_int_equal(nfs, 4);
    finish(&p, th, q);
    assert_int_equal(p.mismatches, 0);
}

/* Stale replies of earlier timed-out calls sit before the delimiter. */
static void
test_sync_discards_stale_replies(void **state)
{
    struct peer p;
    pthread_t th;
    char err[256];
    int nfs = -1;
    struct qga_conn *q = start(&p, &th, "live",
                               "{\"return\": 4}\n{\"return\": 99}\n");

    (void)state;
    assert_int_equal(qga_sync(q, 777, 1000, err, sizeof(err)), 0);
    assert_int_equal(qga_freeze(q, 5000, &nfs, err, sizeof(err)), 0);
    assert_int_equal(nfs, 4);
    finish(&p, th, q);
    assert_int_equal(p.mismatches, 0);
}

/* A guest agent that never answers: the sync fails with a timeout. */
static void
test_dead_agent_times_out(void **state)
{
    struct peer p;
    pthread_t th;
    char err[256] = "";
    struct qga_conn *q = start(&p, &th, "dead", NULL);

    (void)state;
    assert_int_equal(qga_sync(q, 1, 200, err, sizeof(err)), -1);
    assert_int_equal(qga_last_error(q), QGA_E_TIMEOUT);
    assert_non_null(strstr(err, "guest-sync-delimited"));
    finish(&p, th, q);
}

static void
test_open_missing_socket(void **state)
{
    struct qga_conn *q = (void *)1;
    char err[256] = "";

    (void)state;
    assert_int_equal(qga_open("/nonexistent/qga.sock", &q, err, sizeof(err)),
                     -1);
    assert_null(q);
    assert_non_null(strstr(err, "connect"));
    qga_free(NULL);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_live_sync_freeze_thaw),
        cmocka_unit_test(test_sync_discards_stale_replies),
        cmocka_unit_test(test_dead_agent_times_out),
        cmocka_unit_test(test_open_missing_socket),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
