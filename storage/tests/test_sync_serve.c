/* Unit tests of cutpoint-sync --serve's request lines and error events
 * (sync_serve.h), without Ceph: what a request may say, what it inherits
 * from the session, and what is refused with which message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sync_args.h"
#include "sync_engine.h"
#include "sync_serve.h"

static struct sync_opts
session(void)
{
    struct sync_opts o;

    sync_opts_init(&o);
    o.src.conf = "/p.conf";
    o.dst.conf = "/d.conf";
    o.src.id = o.dst.id = "cutpoint";
    o.src.pool = "vms";
    o.dst.pool = "dr-vms";
    o.rate_mbps = 20;
    o.epoch = 2;
    o.serve = 1;
    return o;
}

static void
test_full_request(void **state)
{
    struct sync_opts base = session(), o;
    const char *bad, *id;
    json_t *req;

    (void)state;
    req = sync_serve_parse("{\"id\":\"m1\",\"image\":\"vm1-d0\",\"snap\":\"cp.g.7\","
                           "\"base\":\"cp.g.6\",\"src_pool\":\"a\",\"dst_pool\":"
                           "\"b\",\"epoch\":3,\"rate_mbps\":0,\"verify_full\":true,"
                           "\"full_resync\":false}", &base, &o, &bad, &id);
    assert_non_null(req);
    assert_null(bad);
    assert_string_equal(id, "m1");
    assert_string_equal(o.image, "vm1-d0");
    assert_string_equal(o.target, "cp.g.7");
    assert_string_equal(o.base, "cp.g.6");
    assert_string_equal(o.src.pool, "a");
    assert_string_equal(o.dst.pool, "b");
    assert_true(o.epoch == 3);
    assert_true(o.rate_mbps == 0.0);
    assert_int_equal(o.verify_full, 1);
    assert_int_equal(o.full_resync, 0);
    /* the session's connection settings are kept */
    assert_string_equal(o.src.conf, "/p.conf");
    assert_string_equal(o.dst.id, "cutpoint");
    json_decref(req);
}

static void
test_defaults_from_session(void **state)
{
    struct sync_opts base = session(), o;
    const char *bad, *id;
    json_t *req;

    (void)state;
    req = sync_serve_parse("{\"image\":\"i\",\"snap\":\"s\",\"base\":null}", &base,
                           &o, &bad, &id);
    assert_non_null(req);
    assert_null(id);
    assert_null(o.base);
    assert_string_equal(o.src.pool, "vms");
    assert_string_equal(o.dst.pool, "dr-vms");
    assert_true(o.rate_mbps == 20.0);
    assert_true(o.epoch == 2);
    json_decref(req);
}

static void
test_refused(void **state)
{
    static const struct {
        const char *line;
        const char *why;      /* a part of the message */
    } cases[] = {
        {"", "one JSON object"},
        {"[1]", "one JSON object"},
        {"{\"image\":\"i\"", "one JSON object"},
        {"{\"image\":\"i\"}", "required"},
        {"{\"snap\":\"s\"}", "required"},
        {"{\"image\":\"\",\"snap\":\"s\"}", "image wants"},
        {"{\"image\":7,\"snap\":\"s\"}", "image wants"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"base\":\"s\"}", "same snapshot"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"base\":3}", "base wants"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"epoch\":-1}", "epoch wants"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"epoch\":9007199254740992}",
         "epoch wants"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"epoch\":1.5}", "epoch wants"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"rate_mbps\":-1}", "rate_mbps"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"rate_mbps\":\"5\"}", "rate_mbps"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"verify_full\":1}", "verify_full"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"full_resync\":\"yes\"}",
         "full_resync"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"dst_pool\":\"\"}", "dst_pool"},
        {"{\"image\":\"i\",\"snap\":\"s\",\"verify_only\":true}", "unknown key"},
        {"{\"image\":\"i\",\"image\":\"j\",\"snap\":\"s\"}", "one JSON object"},
        {"{\"image\":\"i\\u0000x\",\"snap\":\"s\"}", "one JSON object"},
    };
    struct sync_opts base = session(), o;
    const char *bad, *id;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_null(sync_serve_parse(cases[i].line, &base, &o, &bad, &id));
        assert_non_null(bad);
        if (strstr(bad, cases[i].why) == NULL)
            fail_msg("case %zu (%s): message '%s' lacks '%s'", i,
                     cases[i].line, bad, cases[i].why);
    }
}

static void
test_bad_request_keeps_its_id(void **state)
{
    struct sync_opts base = session(), o;
    const char *bad, *id;

    (void)state;
    assert_null(sync_serve_parse("{\"id\":\"m9\",\"image\":\"i\"}", &base, &o,
                                 &bad, &id));
    assert_string_equal(id, "m9");
    assert_null(sync_serve_parse("{\"id\":\"\",\"image\":\"i\",\"snap\":\"s\"}",
                                 &base, &o, &bad, &id));
    assert_non_null(strstr(bad, "id wants"));
    assert_null(id);
}

static void
test_error_event_and_exit_codes(void **state)
{
    json_t *ev;
    char *s;

    (void)state;
    assert_int_equal(sync_exit_code(SYNC_OK), 0);
    assert_int_equal(sync_exit_code(SYNC_ERR), 1);
    assert_int_equal(sync_exit_code(SYNC_ENOBASE), 3);
    assert_int_equal(sync_exit_code(SYNC_EVERIFY), 4);
    assert_int_equal(sync_exit_code(SYNC_ENOSRC), 5);
    assert_int_equal(sync_exit_code(SYNC_EFENCED), 6);
    ev = sync_error_event(6, "m1", "img", "cp.2", "fenced");
    s = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_string_equal(s, "{\"event\":\"error\",\"exit\":6,\"id\":\"m1\","
                        "\"image\":\"img\",\"target\":\"cp.2\","
                        "\"message\":\"fenced\"}");
    free(s);
    json_decref(ev);
    ev = sync_error_event(2, NULL, NULL, NULL, "bad");
    s = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_string_equal(s, "{\"event\":\"error\",\"exit\":2,\"message\":\"bad\"}");
    free(s);
    json_decref(ev);
}

static void
test_serve_args(void **state)
{
    char *ok[] = {"cutpoint-sync", "--serve", "--src-conf", "/p", "--dst-conf",
                  "/d", "--jobs", "8"};
    char *img[] = {"cutpoint-sync", "--serve", "--src-conf", "/p",
                   "--dst-conf", "/d", "--image", "x"};
    char *vonly[] = {"cutpoint-sync", "--serve", "--src-conf", "/p",
                     "--dst-conf", "/d", "--verify-only"};
    char *noconf[] = {"cutpoint-sync", "--serve", "--src-conf", "/p"};
    struct sync_opts o;
    const char *bad;

    (void)state;
    assert_int_equal(sync_args_parse(8, ok, &o, &bad), SYNC_ARGS_SERVE);
    assert_int_equal(o.serve, 1);
    assert_int_equal(o.workers, 8);
    assert_int_equal(sync_args_parse(8, img, &o, &bad), SYNC_ARGS_USAGE);
    assert_non_null(strstr(bad, "from stdin"));
    assert_int_equal(sync_args_parse(7, vonly, &o, &bad), SYNC_ARGS_USAGE);
    assert_non_null(strstr(bad, "--verify-only"));
    assert_int_equal(sync_args_parse(4, noconf, &o, &bad), SYNC_ARGS_USAGE);
    assert_non_null(strstr(bad, "--dst-conf"));
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_request),
        cmocka_unit_test(test_defaults_from_session),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_bad_request_keeps_its_id),
        cmocka_unit_test(test_error_event_and_exit_codes),
        cmocka_unit_test(test_serve_args),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
