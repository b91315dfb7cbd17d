/* cmocka tests of proto.c: frames, UTF-8, request validation. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <cmocka.h>

#include "proto.h"

static int
parse(const char *s, struct proto_request *req, int *bad,
      struct proto_error *err)
{
    return proto_parse_request((const uint8_t *)s, strlen(s), req, bad, err);
}

static void
expect_error(const char *s, const char *code, int want_bad)
{
    struct proto_request req;
    struct proto_error err = {0};
    int bad = -1;

    assert_int_equal(parse(s, &req, &bad, &err), -1);
    assert_string_equal(err.code, code);
    assert_int_equal(bad, want_bad);
    proto_request_clear(&req);
}

static void
test_frame_truncated(void **state)
{
    uint8_t buf[8] = {0, 0, 0, 5, '{', '}'};
    struct proto_error err;
    size_t n = 0;

    (void)state;
    assert_int_equal(proto_frame_check(buf, 0, &n, &err), 0);
    assert_int_equal(proto_frame_check(buf, 3, &n, &err), 0);
    assert_int_equal(proto_frame_check(buf, 6, &n, &err), 0);
    buf[3] = 2;
    assert_int_equal(proto_frame_check(buf, 6, &n, &err), 1);
    assert_int_equal(n, 2);
}

static void
test_frame_oversized(void **state)
{
    uint8_t big[4] = {0x00, 0x10, 0x00, 0x01};   /* 1 MiB + 1 */
    uint8_t max[4] = {0x00, 0x10, 0x00, 0x00};   /* exactly 1 MiB */
    uint8_t huge[4] = {0xff, 0xff, 0xff, 0xff};
    uint8_t zero[4] = {0, 0, 0, 0};
    struct proto_error err;
    size_t n;

    (void)state;
    assert_int_equal(proto_frame_check(big, 4, &n, &err), -1);
    assert_string_equal(err.code, "BAD_FRAME");
    assert_int_equal(proto_frame_check(huge, 4, &n, &err), -1);
    assert_int_equal(proto_frame_check(zero, 4, &n, &err), -1);
    assert_int_equal(proto_frame_check(max, 4, &n, &err), 0);
}

static void
test_utf8(void **state)
{
    (void)state;
    assert_true(proto_utf8_valid((const uint8_t *)"abc \xc3\xa9 \xe2\x82\xac "
                                 "\xf0\x9f\x98\x80", 15));
    assert_false(proto_utf8_valid((const uint8_t *)"\xc3", 1));   /* cut */
    assert_false(proto_utf8_valid((const uint8_t *)"\xc0\xaf", 2)); /* overlong */
    assert_false(proto_utf8_valid((const uint8_t *)"\xed\xa0\x80", 3)); /* surrogate */
    assert_false(proto_utf8_valid((const uint8_t *)"\xf4\x90\x80\x80", 4));
    assert_false(proto_utf8_valid((const uint8_t *)"\xff", 1));
    assert_false(proto_utf8_valid((const uint8_t *)"a\0b", 3));
}

static void
test_invalid_utf8_request(void **state)
{
    (void)state;
    expect_error("{\"id\":1,\"cmd\":\"hel\xc3\x28lo\"}", "BAD_FRAME", 1);
    expect_error("{\"id\":1,\"cmd\":\"hello\",\"args\":{\"x\":\"\xed\xa0\x80\"}}",
                 "BAD_FRAME", 1);
}

static void
test_bad_json(void **state)
{
    (void)state;
    expect_error("{\"id\":1,\"cmd\":\"hello\"", "BAD_FRAME", 1);   /* truncated */
    expect_error("[1,2]", "BAD_FRAME", 1);
    expect_error("\"hello\"", "BAD_FRAME", 1);
    expect_error("{\"id\":1,\"id\":2,\"cmd\":\"hello\"}", "BAD_FRAME", 1);
}

static void
test_id_and_cmd(void **state)
{
    (void)state;
    expect_error("{\"cmd\":\"hello\"}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1.5,\"cmd\":\"hello\"}", "BAD_REQUEST", 0);
    expect_error("{\"id\":[1],\"cmd\":\"hello\"}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":7}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"hello\",\"extra\":1}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"hello\",\"args\":[]}", "BAD_REQUEST", 0);
}

static void
test_unknown_command(void **state)
{
    struct proto_request req;
    struct proto_error err = {0};
    int bad;

    (void)state;
    assert_int_equal(parse("{\"id\":\"a\",\"cmd\":\"format-disk\"}", &req, &bad,
                           &err), -1);
    assert_string_equal(err.code, "UNKNOWN_COMMAND");
    assert_int_equal(bad, 0);
    /* the id is kept so that the error reply can carry it */
    assert_non_null(req.id);
    assert_string_equal(json_string_value(req.id), "a");
    proto_request_clear(&req);
    expect_error("{\"id\":1,\"cmd\":\"\"}", "UNKNOWN_COMMAND", 0);
    expect_error("{\"id\":1,\"cmd\":\"HELLO\"}", "UNKNOWN_COMMAND", 0);
}

static void
test_wrong_field_types(void **state)
{
    (void)state;
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":5,"
                 "\"vms\":[\"a\"],\"lease_ms\":100}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":\"a\",\"lease_ms\":100}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[],\"lease_ms\":100}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[\"a\",\"a\"],\"lease_ms\":100}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[\"a\"],\"lease_ms\":\"100\"}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[\"a\"],\"lease_ms\":0}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[\"a\"]}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t/../x\","
                 "\"vms\":[\"a\"],\"lease_ms\":5}}", "BAD_REQUEST", 0);
    /* prepare's optional freeze_timeout_ms: an integer 1..600000 */
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[\"a\"],\"lease_ms\":5,\"freeze_timeout_ms\":0}}",
                 "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[\"a\"],\"lease_ms\":5,\"freeze_timeout_ms\":\"9\"}}",
                 "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"prepare\",\"args\":{\"txn\":\"t\","
                 "\"vms\":[\"a\"],\"lease_ms\":5,\"freeze_timeout_ms\":600001}}",
                 "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"commit\",\"args\":{\"txn\":\"t\","
                 "\"snapshots\":{\"vm/disk0\":3},\"budget_ms\":5}}",
                 "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"snapshot.delete\",\"args\":{\"disk\":\"a\","
                 "\"name\":\"x y\"}}", "BAD_REQUEST", 0);
    /* snapshot.delete's optional id: a snap id, 0..2^53 */
    expect_error("{\"id\":1,\"cmd\":\"snapshot.delete\",\"args\":{\"disk\":\"a\","
                 "\"name\":\"x\",\"id\":-1}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"snapshot.delete\",\"args\":{\"disk\":\"a\","
                 "\"name\":\"x\",\"id\":\"4\"}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"snapshot.delete\",\"args\":{\"disk\":\"a\","
                 "\"name\":\"x\",\"id\":9007199254740993}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"snapshot.delete\",\"args\":{\"disk\":\"a\","
                 "\"name\":\"x\",\"id\":4,\"owner\":\"t 1\"}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"hello\",\"args\":{\"x\":1}}",
                 "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"abort\",\"args\":{\"txn\":\"t\","
                 "\"snapshot\":{}}}", "BAD_REQUEST", 0);
    /* vm.guest_exec's args: strings only; input: a string */
    expect_error("{\"id\":1,\"cmd\":\"vm.guest_exec\",\"args\":{\"vm\":\"a\","
                 "\"path\":\"/bin/sh\",\"args\":[\"-c\",1]}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"vm.guest_exec\",\"args\":{\"vm\":\"a\","
                 "\"path\":\"/bin/sh\",\"args\":\"-c\"}}", "BAD_REQUEST", 0);
    expect_error("{\"id\":1,\"cmd\":\"vm.guest_exec\",\"args\":{\"vm\":\"a\","
                 "\"path\":\"/bin/sh\",\"input\":[]}}", "BAD_REQUEST", 0);
}

static void
test_valid_requests(void **state)
{
    struct proto_request req;
    struct proto_error err = {0};
    int bad;

    (void)state;
    assert_int_equal(parse("{\"id\":7,\"cmd\":\"hello\"}", &req, &bad, &err), 0);
    assert_int_equal(req.cmd, PROTO_CMD_HELLO);
    assert_true(json_is_object(req.args));
    proto_request_clear(&req);
    assert_int_equal(parse("{\"id\":8,\"cmd\":\"prepare\",\"args\":{\"txn\":"
                           "\"t\",\"vms\":[\"a\"],\"lease_ms\":5,\"quiesce\":"
                           "\"fs-freeze\",\"freeze_timeout_ms\":1200}}", &req, &bad,
                           &err), 0);
    assert_int_equal(req.cmd, PROTO_CMD_PREPARE);
    proto_request_clear(&req);
    assert_int_equal(parse("{\"id\":\"x\",\"cmd\":\"commit\",\"args\":{\"txn\":"
                           "\"t-1\",\"snapshots\":{\"vm1/disk0\":\"cp.g.t-1\"},"
                           "\"budget_ms\":500}}", &req, &bad, &err), 0);
    assert_int_equal(req.cmd, PROTO_CMD_COMMIT);
    assert_int_equal(json_integer_value(json_object_get(req.args, "budget_ms")),
                     500);
    proto_request_clear(&req);
    assert_int_equal(parse("{\"id\":9,\"cmd\":\"snapshot.delete\",\"args\":{"
                           "\"disk\":\"vm1/disk0\",\"name\":\"cp.g.t-1\",\"id\":0,"
                           "\"owner\":\"t-1\"}}", &req, &bad, &err), 0);
    assert_int_equal(req.cmd, PROTO_CMD_SNAP_DELETE);
    proto_request_clear(&req);
    /* a command's arguments may repeat and be empty */
    assert_int_equal(parse("{\"id\":9,\"cmd\":\"vm.guest_exec\",\"args\":{"
                           "\"vm\":\"a\",\"path\":\"/bin/sh\",\"args\":[\"-c\","
                           "\"-c\",\"\"],\"input\":\"\"}}", &req, &bad, &err), 0);
    assert_int_equal(req.cmd, PROTO_CMD_VM_GUEST_EXEC);
    proto_request_clear(&req);
    proto_request_clear(NULL);
}

static void
test_reply_encoding(void **state)
{
    size_t len = 0;
    uint8_t *f;
    json_t *o;
    json_error_t je;
    json_t *id = json_integer(3);

    (void)state;
    f = proto_reply_err(id, "EXPIRED", "lease expired", NULL,
                        &len);
    assert_non_null(f);
    assert_int_equal(((size_t)f[2] << 8 | f[3]), len - 4);
    o = json_loadb((char *)f + 4, len - 4, 0, &je);
    assert_non_null(o);
    assert_false(json_is_true(json_object_get(o, "ok")));
    assert_string_equal(json_string_value(json_object_get(
        json_object_get(o, "error"), "code")), "EXPIRED");
    json_decref(o);
    json_decref(id);
    free(f);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frame_truncated),
        cmocka_unit_test(test_frame_oversized),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_invalid_utf8_request),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_id_and_cmd),
        cmocka_unit_test(test_unknown_command),
        cmocka_unit_test(test_wrong_field_types),
        cmocka_unit_test(test_valid_requests),
        cmocka_unit_test(test_reply_encoding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
