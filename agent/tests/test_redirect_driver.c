/*
 * cmocka tests of a `redirect` journal entry for a VM whose driver cannot
 * merge overlays (redirect.c): a VM that is now a libvirt domain (raw QMP
 * off), on libvirt's own test driver (test:///default).  Reported: such an
 * entry was retried forever ("raw QMP is off") and every prepare of the VM
 * was BUSY.  The entry is resolved as for a QEMU that is gone: what holds
 * no guest write goes, what holds some (or cannot be read) is kept and
 * reported, and while Ceph cannot be asked the entry stays (retried).
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

#include "agent.h"
#include "journal.h"
#include "mono.h"
#include "redirect.h"

static struct agent a;
static char jpath[] = "/tmp/cp-rddrv-XXXXXX";

static double
clock_zero(void *opaque)
{
    (void)opaque;
    return 0;
}

/* One libvirt VM, "test" (the test driver's running domain), with the
 * disks given; a journal holding `redirect t-old test`. */
static void
setup_vm(enum cfg_backend backend, int ndisks)
{
    struct journal_entry e = {.kind = JOURNAL_REDIRECT};
    char err[256];
    double end = mono_ms() + 10000;
    int fd;

    memset(&a, 0, sizeof(a));
    snprintf(a.cfg.host, sizeof(a.cfg.host), "h1");
    a.cfg.qmp_timeout_ms = 2000;
    snprintf(a.cfg.libvirt_uri, sizeof(a.cfg.libvirt_uri), "test:///default");
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cond, NULL);
    txn_table_init(&a.txns, clock_zero, NULL);
    snprintf(a.cfg.vms[0].name, sizeof(a.cfg.vms[0].name), "test");
    snprintf(a.cfg.vms[0].domain, sizeof(a.cfg.vms[0].domain), "test");
    snprintf(a.cfg.vms[0].driver, sizeof(a.cfg.vms[0].driver), "libvirt");
    a.cfg.vms[0].start_timeout_ms = 10000;
    a.cfg.vms[0].method = CFG_METHOD_QMP;
    for (int d = 0; d < ndisks; d++) {
        struct cfg_disk *cd = &a.cfg.vms[0].disks[d];
        snprintf(cd->node, sizeof(cd->node), "vd%c", 'a' + d);
        cd->backend = backend;
        snprintf(cd->pool, sizeof(cd->pool), "rbd");
        snprintf(cd->image, sizeof(cd->image), "test-disk%d", d);
        snprintf(cd->file, sizeof(cd->file), "/var/tmp/test-disk%d.qcow2", d);
    }
    a.cfg.vms[0].ndisks = ndisks;
    a.cfg.nvms = 1;
    snprintf(jpath, sizeof(jpath), "/tmp/cp-rddrv-XXXXXX");
    assert_true((fd = mkstemp(jpath)) >= 0);
    close(fd);
    unlink(jpath);
    assert_int_equal(journal_open(jpath, &a.journal, err, sizeof(err)), 0);
    snprintf(e.txn, sizeof(e.txn), "t-old");
    snprintf(e.vm, sizeof(e.vm), "test");
    assert_int_equal(journal_put(a.journal, &e, 1, err, sizeof(err)), 0);
    assert_int_equal(vm_host_open(&a.host, &a.cfg, err, sizeof(err)), 0);
    while (vm_host_ready(&a.host, err, sizeof(err)) < 0 && mono_ms() < end)
        usleep(20000);
    assert_int_equal(vm_host_ready(&a.host, err, sizeof(err)), 0);
    assert_int_equal(vm_open(&a.vms[0], &a.cfg.vms[0], &a.host), 0);
    vm_attach(&a.vms[0], &a.host);
    a.nvms = 1;
}

static void
teardown_vm(void)
{
    redirect_bg_wait(&a, &a.vms[0], 10000);
    vm_close(&a.vms[0]);
    vm_host_close(&a.host);
    journal_free(a.journal);
    unlink(jpath);
    txn_table_clear(&a.txns);
    pthread_cond_destroy(&a.cond);
    pthread_mutex_destroy(&a.mu);
}

static int
redirect_entries(void)
{
    struct journal_entry *e = NULL;
    int n = 0, k = 0;

    assert_int_equal(journal_entries(a.journal, &e, &n), 0);
    for (int i = 0; i < n; i++)
        k += e[i].kind == JOURNAL_REDIRECT;
    free(e);
    return k;
}

/* A prepare's settle, until it stops asking for a retry or 10 s. */
static int
settle(char *err, size_t errlen)
{
    double end = mono_ms() + 10000;
    int rc;

    while ((rc = redirect_settle(&a, &a.vms[0], mono_ms() + 1000,
                                 mono_ms() + 100, err, errlen)) < 0 &&
           mono_ms() < end)
        usleep(20000);
    return rc;
}

/* No disk holds an overlay (none, or qcow2 disks, never redirected): the
 * entry goes, and the VM can be cut again. */
static void
test_entry_without_overlays_resolved(void **state)
{
    char err[512] = "";

    (void)state;
    setup_vm(CFG_BACKEND_QCOW2, 2);
    assert_int_equal(redirect_entries(), 1);
    if (redirect_merge(&a, &a.vms[0], "t-old", "recovery", err,
                       sizeof(err)) != 0)
        fail_msg("merge: %s", err);
    assert_int_equal(redirect_entries(), 0);
    assert_int_equal(settle(err, sizeof(err)), 0);
    teardown_vm();
}

/* RBD disks, and Ceph not connected: nobody can tell whether the overlays
 * hold guest writes, so the entry stays and the merge is retried (the
 * message says why), never dropped. */
static void
test_entry_kept_while_ceph_cannot_be_asked(void **state)
{
    char err[512] = "";

    (void)state;
    setup_vm(CFG_BACKEND_RBD, 1);
    assert_int_equal(redirect_merge(&a, &a.vms[0], "t-old", "recovery", err,
                                    sizeof(err)), -1);
    if (!strstr(err, "Ceph is not connected yet"))
        fail_msg("%s", err);
    assert_int_equal(redirect_entries(), 1);
    teardown_vm();
}

/* The prepare path: settle starts the merge in the background and is
 * BUSY meanwhile; once it is done, the VM can be cut. */
static void
test_prepare_not_busy_forever(void **state)
{
    char err[512] = "";

    (void)state;
    setup_vm(CFG_BACKEND_QCOW2, 1);
    if (settle(err, sizeof(err)) != 0)
        fail_msg("still busy after 10 s: %s", err);
    assert_int_equal(redirect_entries(), 0);
    teardown_vm();
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entry_without_overlays_resolved),
        cmocka_unit_test(test_entry_kept_while_ceph_cannot_be_asked),
        cmocka_unit_test(test_prepare_not_busy_forever),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
