/* test_writer.c - cmocka tests of the record format, ring messages and
 * configuration parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config.h"
#include "record.h"
#include "ring.h"

static void test_crc_vector(void **state)
{
    (void)state;
    /* The standard CRC-32 check value. */
    assert_int_equal(record_crc32((const unsigned char *)"123456789", 9),
                     0xCBF43926u);
}

static void test_record_layout(void **state)
{
    unsigned char buf[RECORD_SIZE];
    struct record in = { .epoch = 7, .seq = 0x0102030405060708ull,
                         .vm = 3, .disk = 2, .run = 0xAABBull };
    struct record out;

    (void)state;
    record_encode(&in, buf);
    assert_memory_equal(buf, "CPWR", 4);
    assert_int_equal(buf[4], 7);
    assert_int_equal(buf[8], 0x08);     /* little-endian */
    assert_int_equal(buf[15], 0x01);
    assert_int_equal(buf[16], 3);
    assert_int_equal(buf[20], 2);
    assert_int_equal(buf[24], 0xBB);
    for (int i = 32; i < RECORD_CRC_OFFSET; i++)
        assert_int_equal(buf[i], 0);
    assert_int_equal(record_decode(buf, &out), 0);
    assert_int_equal(out.epoch, 7);
    assert_true(out.seq == in.seq);
    assert_int_equal(out.vm, 3);
    assert_int_equal(out.disk, 2);
    assert_true(out.run == in.run);
}

static void test_record_rejects(void **state)
{
    unsigned char buf[RECORD_SIZE];
    struct record in = { .epoch = 1, .seq = 5, .vm = 1, .disk = 0, .run = 9 };
    struct record out;

    (void)state;
    record_encode(&in, buf);
    buf[100] ^= 1;                       /* a flipped padding bit */
    assert_int_equal(record_decode(buf, &out), -1);
    record_encode(&in, buf);
    buf[0] = 'X';                        /* no magic */
    assert_int_equal(record_decode(buf, &out), -1);
    memset(buf, 0, sizeof(buf));         /* an unwritten slot */
    assert_int_equal(record_decode(buf, &out), -1);
}

static void test_ring_msg(void **state)
{
    unsigned char buf[RING_MSG_SIZE];
    struct ring_msg in = { .type = RING_STOP, .run = 42, .seq = 1000 };
    struct ring_msg out;

    (void)state;
    ring_msg_encode(&in, buf);
    assert_int_equal(ring_msg_decode(buf, &out), 0);
    assert_int_equal(out.type, RING_STOP);
    assert_true(out.run == 42 && out.seq == 1000);
    buf[4] = RING_COUNT;                 /* --resume's census */
    assert_int_equal(ring_msg_decode(buf, &out), 0);
    assert_int_equal(out.type, RING_COUNT);
    buf[4] = RING_COUNT + 1;             /* the first unknown type */
    assert_int_equal(ring_msg_decode(buf, &out), -1);
    buf[4] = 0;
    assert_int_equal(ring_msg_decode(buf, &out), -1);
    buf[4] = 9;                          /* unknown type */
    assert_int_equal(ring_msg_decode(buf, &out), -1);
}

static void test_config_env(void **state)
{
    struct config cfg;
    char err[256];

    (void)state;
    setenv("CP_DISKS", "/dev/vda /dev/vdb /dev/vdc", 1);
    setenv("CP_VM", "2", 1);
    setenv("CP_IP", "10.77.101.2/16", 1);
    setenv("CP_PEERS", "10.77.101.1,10.77.101.2", 1);
    setenv("CP_ARGS", "--count=50,--delay-us,100", 1);
    config_init(&cfg);
    assert_int_equal(config_from_env(&cfg, true, err, sizeof(err)), 0);
    assert_int_equal(config_finish(&cfg, err, sizeof(err)), 0);
    assert_int_equal(cfg.ndisks, 3);
    assert_string_equal(cfg.disks[2], "/dev/vdc");
    assert_int_equal(cfg.vm, 2);
    assert_true(config_distributed(&cfg));
    assert_int_equal(cfg.ring_index, 1);
    assert_int_equal(config_peer_port(&cfg, 0), CONFIG_DEFAULT_PORT);
    assert_true(cfg.count == 50);
    assert_int_equal(cfg.delay_us, 100);

    /* With a command line, CP_ARGS is not applied again, and --disk
     * replaces the CP_DISKS list. */
    {
        char *argv[] = { "--disk", "/tmp/a", "--disk", "/tmp/b" };

        config_init(&cfg);
        assert_int_equal(config_from_env(&cfg, false, err, sizeof(err)), 0);
        assert_true(cfg.count == 0);
        assert_int_equal(cfg.ndisks, 3);
        assert_int_equal(config_parse_args(&cfg, 4, argv, err, sizeof(err)),
                         0);
        assert_int_equal(cfg.ndisks, 2);
        assert_string_equal(cfg.disks[1], "/tmp/b");
    }
    unsetenv("CP_DISKS");
    unsetenv("CP_VM");
    unsetenv("CP_IP");
    unsetenv("CP_PEERS");
    unsetenv("CP_ARGS");
}

static void test_config_errors(void **state)
{
    struct config cfg;
    char err[256];
    char *bad_flag[] = { "--bogus" };
    char *bad_num[] = { "--count=12x" };
    char *bad_peer[] = { "--peers", "host.example:7700" };
    char *missing[] = { "--disk" };
    char *not_in_ring[] = { "--disk", "f", "--peers", "127.0.0.1:1,"
                            "127.0.0.1:2", "--self", "10.0.0.1" };

    (void)state;
    config_init(&cfg);
    assert_int_equal(config_parse_args(&cfg, 1, bad_flag, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "unknown flag"));
    assert_int_equal(config_parse_args(&cfg, 1, bad_num, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "bad number"));
    assert_int_equal(config_parse_args(&cfg, 2, bad_peer, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "not an IPv4"));
    assert_int_equal(config_parse_args(&cfg, 1, missing, err, sizeof(err)),
                     -1);
    config_init(&cfg);
    assert_int_equal(config_finish(&cfg, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "no disks"));
    config_init(&cfg);
    assert_int_equal(config_parse_args(&cfg, 6, not_in_ring, err,
                                       sizeof(err)), 0);
    assert_int_equal(config_finish(&cfg, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "not in the peers"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc_vector),
        cmocka_unit_test(test_record_layout),
        cmocka_unit_test(test_record_rejects),
        cmocka_unit_test(test_ring_msg),
        cmocka_unit_test(test_config_env),
        cmocka_unit_test(test_config_errors),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
