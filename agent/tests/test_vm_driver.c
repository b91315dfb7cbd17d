/*
 * cmocka tests of the VM driver table (vm.c): a VM's `driver =` picks its
 * row, config checks are the driver's, and the libvirt driver's calls work
 * against libvirt's own test driver (test:///default, in libvirt itself,
 * no daemon), which starts with one running domain named "test".
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "vm.h"

static struct agent_config cfg;

static int
load(const char *text, char *err, size_t errlen)
{
    char path[] = "/tmp/cp-vmdrv-XXXXXX";
    int fd = mkstemp(path), rc;

    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    rc = config_load(path, &cfg, err, errlen);
    unlink(path);
    return rc;
}

#define TLS "[tls]\nca = /c\ncert = /p\nkey = /k\n"
#define LIBVIRT "[libvirt]\nuri = test:///default\n"

static void
test_table(void **state)
{
    int n = 0;

    (void)state;
    assert_ptr_equal(vm_driver_find("qmp"), &vm_qmp_ops);
    assert_ptr_equal(vm_driver_find("libvirt"), &vm_libvirt_ops);
    assert_null(vm_driver_find("xen"));
    assert_null(vm_driver_find(""));
    assert_null(vm_driver_find(NULL));
    while (vm_driver_at(n))
        n++;
    assert_int_equal(n, 2);
    assert_null(vm_driver_at(-1));
    /* what every VM needs, whatever its driver */
    for (int i = 0; i < n; i++) {
        const struct vm_ops *d = vm_driver_at(i);
        assert_non_null(d->pause);
        assert_non_null(d->resume);
        assert_non_null(d->state);
        assert_non_null(d->guest_configured);
        assert_non_null(d->guest_open);
    }
}

static void
test_config_picks_the_driver(void **state)
{
    char err[512] = "";
    struct vm a, b;

    (void)state;
    assert_int_equal(load(TLS LIBVIRT "[vm a]\nqmp = /s\n"
                          "[vm b]\ndriver = libvirt\n", err, sizeof(err)), 0);
    assert_string_equal(cfg.vms[0].driver, "qmp");     /* the default */
    assert_string_equal(cfg.vms[1].driver, "libvirt");
    assert_string_equal(cfg.vms[1].domain, "b");       /* libvirt's default */
    assert_int_equal(vm_open(&a, &cfg.vms[0], NULL), 0);
    assert_int_equal(vm_open(&b, &cfg.vms[1], NULL), 0);
    assert_ptr_equal(a.ops, &vm_qmp_ops);
    assert_ptr_equal(b.ops, &vm_libvirt_ops);
    vm_close(&a);
    vm_close(&b);
}

static void
test_config_checks_are_the_drivers(void **state)
{
    char err[512] = "";

    (void)state;
    assert_int_equal(load(TLS "[vm a]\ndriver = xen\n", err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "bad value for driver: xen"));
    assert_int_equal(load(TLS "[vm a]\ndisk.d0 = qcow2:/x\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "[vm a] needs qmp = SOCKET"));
    assert_int_equal(load(TLS "[vm a]\ndriver = libvirt\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "uses libvirt but [libvirt] uri is not set"));
    assert_int_equal(load(TLS LIBVIRT "[vm a]\ndriver = libvirt\n"
                          "start = /bin/true\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "start = is for the qmp driver"));
}

static void
test_standby_is_a_qmp_vm_without_socket(void **state)
{
    char err[512] = "";
    struct vm a;

    (void)state;
    assert_int_equal(load(TLS "[vm a]\nqmp = /nonexistent/a.qmp\n"
                          "start = /bin/true\n", err, sizeof(err)), 0);
    assert_int_equal(vm_open(&a, &cfg.vms[0], NULL), 0);
    assert_int_equal(vm_is_standby(&a), 1);
    assert_string_equal(vm_state(&a, 500), "shutoff");
    vm_close(&a);
}

static void
test_libvirt_driver_on_the_test_driver(void **state)
{
    char err[512] = "";
    struct vm_host h;
    struct qmp_err qe;
    struct vm v;

    (void)state;
    assert_int_equal(load(TLS LIBVIRT "[vm test]\ndriver = libvirt\n", err,
                          sizeof(err)), 0);
    assert_int_equal(vm_host_open(&h, &cfg, err, sizeof(err)), 0);
    assert_int_equal(vm_open(&v, &cfg.vms[0], &h), 0);
    assert_string_equal(vm_state(&v, 2000), "running");
    assert_int_equal(vm_stop(&v, 2000, &qe), 0);
    assert_string_equal(vm_state(&v, 2000), "paused");
    assert_int_equal(vm_cont(&v, 2000, &qe), 0);
    assert_string_equal(vm_state(&v, 2000), "running");
    /* resuming a running VM is success (agent-protocol §4.6) */
    assert_int_equal(vm_cont(&v, 2000, &qe), 0);
    assert_int_equal(vm_poweroff(&v, 2000, &qe), 0);
    assert_string_equal(vm_state(&v, 2000), "shutoff");
    vm_close(&v);
    vm_host_close(&h);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_config_picks_the_driver),
        cmocka_unit_test(test_config_checks_are_the_drivers),
        cmocka_unit_test(test_standby_is_a_qmp_vm_without_socket),
        cmocka_unit_test(test_libvirt_driver_on_the_test_driver),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
