/*
 * cmocka tests of the VM driver table (vm.c): a VM's `driver =` picks its
 * row, config checks are the driver's, and the libvirt driver's calls work
 * against libvirt's own test driver (test:///default, in libvirt itself,
 * no daemon), which starts with one running domain named "test" and
 * delivers domain lifecycle events through the event loop like libvirtd.
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
#include <jansson.h>

#include <libvirt/libvirt.h>

#include "config.h"
#include "mono.h"
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
    assert_int_equal(load(TLS LIBVIRT "[vm a]\ndriver = libvirt\n"
                          "qga = /run/a.qga\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "qga = is for the qmp driver"));
    /* qcow2 on libvirt needs raw QMP, which taints: off unless asked */
    assert_int_equal(load(TLS LIBVIRT "[vm a]\ndriver = libvirt\n"
                          "disk.vda = qcow2:/x.qcow2\n", err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "needs [libvirt] qmp_passthrough = yes"));
    assert_int_equal(load(TLS LIBVIRT "qmp_passthrough = yes\n[vm a]\n"
                          "driver = libvirt\ndisk.vda = qcow2:/x.qcow2\n",
                          err, sizeof(err)), 0);
    assert_int_equal(load(TLS LIBVIRT "[vm a]\ndriver = libvirt\n"
                          "xml = /nonexistent/a.xml\n", err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "[vm a] xml: /nonexistent/a.xml: No such"));
    assert_int_equal(load(TLS "[vm a]\nqmp = /s\nxml = /a.xml\n", err,
                          sizeof(err)), -1);
    assert_non_null(strstr(err, "are for the libvirt driver"));
    assert_int_equal(load(TLS LIBVIRT "[vm a]\ndriver = libvirt\n"
                          "mountpoints = /data tmp\n", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "bad value for mountpoints"));
}

/* The driver's connection comes up in the background. */
static void
wait_ready(struct vm_host *h)
{
    char err[512];
    double end = mono_ms() + 5000;

    while (vm_host_ready(h, err, sizeof(err)) < 0) {
        assert_true(mono_ms() < end);
        usleep(10000);
    }
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
    wait_ready(&h);
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

/* A domain another client defines and starts while the agent runs: an
 * rbd disk named by its target, and a guest agent channel. */
static const char new_domain[] =
    "<domain type='test'><name>cp-new</name><memory>65536</memory>"
    "<os><type>hvm</type></os><devices>"
    "<disk type='network' device='disk'>"
    "<source protocol='rbd' name='rbd/cp-new-disk0'/>"
    "<target dev='vda' bus='virtio'/></disk>"
    "<disk type='file' device='cdrom'><target dev='hdc'/></disk>"
    "<channel type='unix'>"
    "<target type='virtio' name='org.qemu.guest_agent.0'/></channel>"
    "</devices></domain>";

/* The VM discovery reports for cp-new, within 5 s (0 when none). */
static int
discovered(struct vm_host *h, struct cfg_vm *out)
{
    const struct vm_ops *lv = &vm_libvirt_ops;
    struct cfg_vm *found = calloc(CFG_MAX_VMS, sizeof(*found));
    double end = mono_ms() + 5000;
    int n, ok = 0;

    do {
        n = lv->discover(vm_host_conn(h, 1), &cfg, found, CFG_MAX_VMS);
        for (int i = 0; i < n && !ok; i++)
            if (strcmp(found[i].name, "cp-new") == 0) {
                *out = found[i];
                ok = 1;
            }
        if (!ok)
            usleep(20000);
    } while (!ok && mono_ms() < end);
    free(found);
    return ok;
}

static void
test_live_inventory_and_guest_freeze(void **state)
{
    char err[512] = "";
    struct vm_host h;
    struct vm v;
    struct vm_guest *g = NULL;
    virConnectPtr other;
    virDomainPtr d;
    json_t *o;
    double end;
    int nfs = 0;

    (void)state;
    assert_ptr_equal(vm_driver_at(1), &vm_libvirt_ops);
    assert_int_equal(load(TLS LIBVIRT "discover = yes\n", err, sizeof(err)),
                     0);
    assert_int_equal(vm_host_open(&h, &cfg, err, sizeof(err)), 0);
    wait_ready(&h);
    /* started after the agent's connection: seen through events */
    assert_non_null(other = virConnectOpen("test:///default"));
    assert_non_null(d = virDomainDefineXML(other, new_domain));
    assert_int_equal(virDomainCreate(d), 0);
    assert_true(discovered(&h, &cfg.vms[cfg.nvms]));
    assert_int_equal(cfg.vms[cfg.nvms].ndisks, 1);      /* not the cdrom */
    assert_string_equal(cfg.vms[cfg.nvms].disks[0].node, "vda");
    assert_string_equal(cfg.vms[cfg.nvms].disks[0].pool, "rbd");
    assert_string_equal(cfg.vms[cfg.nvms].disks[0].image, "cp-new-disk0");
    assert_int_equal(cfg.vms[cfg.nvms].discovered, 1);
    assert_int_equal(vm_open(&v, &cfg.vms[cfg.nvms++], &h), 0);
    /* discovered once defined; running once the start's event is in */
    end = mono_ms() + 5000;
    for (;;) {
        o = json_object();
        assert_int_equal(v.ops->describe(&v, o), 0);
        if (strcmp(json_string_value(json_object_get(o, "state")),
                   "running") == 0)
            break;
        json_decref(o);
        assert_true(mono_ms() < end);
        usleep(20000);
    }
    assert_true(json_is_false(json_object_get(o, "stale")));
    assert_true(json_is_true(json_object_get(o, "guest_agent")));
    assert_int_equal(strlen(json_string_value(json_object_get(o, "uuid"))),
                     36);
    json_decref(o);
    /* fs-freeze through libvirt (the test driver has / and /boot) */
    assert_int_equal(v.ops->guest_configured(&v), 1);
    assert_int_equal(v.ops->guest_open(&v, &g, err, sizeof(err)), 0);
    assert_int_equal(v.ops->guest_freeze(g, 2000, &nfs, err, sizeof(err)), 0);
    assert_int_equal(nfs, 2);
    assert_int_equal(v.ops->guest_thaw(g, &nfs, err, sizeof(err)), 0);
    assert_int_equal(nfs, 2);
    /* [vm] mountpoints: only those */
    snprintf(cfg.vms[cfg.nvms - 1].mountpoints,
             sizeof(cfg.vms[0].mountpoints), "/boot");
    assert_int_equal(v.ops->guest_freeze(g, 2000, &nfs, err, sizeof(err)), 0);
    assert_int_equal(nfs, 1);
    assert_int_equal(v.ops->guest_thaw(g, &nfs, err, sizeof(err)), 0);
    assert_int_equal(nfs, 1);
    v.ops->guest_close(g);
    /* undefined elsewhere: the discovered VM is gone from the inventory */
    assert_int_equal(virDomainDestroy(d), 0);
    assert_int_equal(virDomainUndefine(d), 0);
    virDomainFree(d);
    virConnectClose(other);
    end = mono_ms() + 5000;
    for (;;) {
        o = json_object();
        if (v.ops->describe(&v, o) == 1)
            break;
        json_decref(o);
        assert_true(mono_ms() < end);
        usleep(20000);
    }
    json_decref(o);
    vm_close(&v);
    vm_host_close(&h);
}

static void
test_mountpoints_and_no_channel(void **state)
{
    char err[512] = "";
    struct vm_host h;
    struct vm v;
    struct vm_guest *g = NULL;

    (void)state;
    /* "test" has no guest agent channel: no freeze is even tried */
    assert_int_equal(load(TLS LIBVIRT "[vm test]\ndriver = libvirt\n"
                          "mountpoints = /boot\n", err, sizeof(err)), 0);
    assert_int_equal(vm_host_open(&h, &cfg, err, sizeof(err)), 0);
    wait_ready(&h);
    assert_int_equal(vm_open(&v, &cfg.vms[0], &h), 0);
    assert_int_equal(v.ops->guest_configured(&v), 0);
    assert_int_equal(v.ops->guest_open(&v, &g, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "no guest agent channel"));
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
        cmocka_unit_test(test_live_inventory_and_guest_freeze),
        cmocka_unit_test(test_mountpoints_and_no_channel),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
