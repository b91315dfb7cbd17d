/*
 * cmocka tests of the "qmp-transaction" snapshot backend (storage/snap_qmp.c)
 * driven through the agent's own path to QEMU: a qmp-driver struct vm
 * whose monitor (vm_snap_disk) is the QMP client, talking to QEMU replies
 * recorded from the real QEMU (tests/qmp-replies, fakepeer.h).  The peer
 * checks every request's arguments against the recording, so a backend
 * that builds a different transaction fails here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakepeer.h"
#include "mono.h"
#include "rbdsnap.h"
#include "snap.h"
#include "vm.h"

struct fixture {
    struct fakepeer_qmp r;
    struct cfg_vm cfg;
    struct vm v;
};

/* A qmp VM with disks named as in the recording, connected to a peer that
 * replays greeting, capabilities, then files. */
static void
start(struct fixture *f, const char **files, int strict, int hang_after,
      const char *node0)
{
    const char *all[16] = {"greeting.txt", "capabilities.txt"};
    struct qmp_err qe;
    int n = 2, fd;

    for (; *files; files++)
        all[n++] = *files;
    memset(f, 0, sizeof(*f));
    snprintf(f->cfg.name, sizeof(f->cfg.name), "vm1");
    snprintf(f->cfg.qmp, sizeof(f->cfg.qmp), "/nonexistent/replay.qmp");
    snprintf(f->cfg.driver, sizeof(f->cfg.driver), "qmp");
    f->cfg.method = CFG_METHOD_QMP;
    f->cfg.ndisks = 2;
    snprintf(f->cfg.disks[0].node, sizeof(f->cfg.disks[0].node), "%s", node0);
    snprintf(f->cfg.disks[1].node, sizeof(f->cfg.disks[1].node), "disk1");
    f->r.strict_args = strict;
    fd = fakepeer_qmp_start(&f->r, all, 0, hang_after);
    assert_int_equal(vm_open(&f->v, &f->cfg, NULL), 0);
    assert_ptr_equal(f->v.snap, &snap_qmp_ops);
    /* the qmp driver's per-VM state is its QMP client (vm_qmp.c) */
    assert_int_equal(qmp_open_fd(f->v.priv, fd, 2000, &qe), 0);
}

static void
finish(struct fixture *f)
{
    vm_close(&f->v);        /* closes the client end: the peer returns */
    fakepeer_qmp_finish(&f->r);
    assert_int_equal(f->r.mismatches, 0);
}

static void
members(struct fixture *f, struct snap_member *m, int n, const char *name)
{
    memset(m, 0, sizeof(*m) * (size_t)n);
    for (int k = 0; k < n; k++) {
        vm_snap_disk(&f->v, k, &m[k].disk);
        m[k].name = name;
    }
}

static void
test_create_is_one_transaction(void **state)
{
    const char *files[] = {"transaction-snapshot.txt", NULL};
    struct fixture f;
    struct snap_member m[2];
    struct snap_err err = {0};
    struct qmp_err qe;
    int timed_out = -1;

    (void)state;
    start(&f, files, 1, -1, "disk0");
    assert_int_equal(vm_stop(&f.v, 2000, &qe), 0);
    members(&f, m, 2, "cp.g.t1");
    assert_int_equal(snap_qmp_ops.create(m, 2, mono_ms() + 2000, &timed_out,
                                         &err), 0);
    assert_int_equal(timed_out, 0);
    assert_true(m[0].ok && m[1].ok);
    assert_string_equal(m[0].err, "");
    assert_int_equal(vm_cont(&f.v, 2000, &qe), 0);
    finish(&f);
}

static void
test_refused_transaction_fails_every_disk(void **state)
{
    const char *files[] = {"error-bad-device.txt", NULL};
    struct fixture f;
    struct snap_member m[1];
    struct snap_err err = {0};
    int timed_out = -1;

    (void)state;
    start(&f, files, 1, -1, "nodisk");
    members(&f, m, 1, "s1");
    /* QEMU's refusal is a per-disk result, not a failure to start */
    assert_int_equal(snap_qmp_ops.create(m, 1, mono_ms() + 2000, &timed_out,
                                         &err), 0);
    assert_int_equal(timed_out, 0);
    assert_false(m[0].ok);
    assert_non_null(strstr(m[0].err, "nodisk"));
    finish(&f);
}

static void
test_hung_qemu_is_a_timeout(void **state)
{
    /* its first request is a transaction: read, never answered */
    const char *files[] = {"error-bad-device.txt", NULL};
    struct fixture f;
    struct snap_member m[2];
    struct snap_err err = {0};
    double t0;
    int timed_out = 0;

    (void)state;
    start(&f, files, 0, 1, "disk0");   /* capabilities, then it hangs */
    members(&f, m, 2, "cp.g.t1");
    t0 = mono_ms();
    assert_int_equal(snap_qmp_ops.create(m, 2, t0 + 150, &timed_out, &err),
                     0);
    assert_true(mono_ms() - t0 < 1000);
    assert_int_equal(timed_out, 1);
    assert_false(m[0].ok || m[1].ok);
    finish(&f);
}

static void
test_list_reads_the_node_from_query_block(void **state)
{
    const char *files[] = {"query-block-snapshots.txt", NULL};
    struct fixture f;
    struct snap_disk d;
    struct snap_err err = {0};
    json_t *list = NULL;

    (void)state;
    start(&f, files, 1, -1, "disk0");
    vm_snap_disk(&f.v, 1, &d);
    assert_ptr_equal(snap_disk_backend(&d), &snap_qmp_ops);
    assert_int_equal(snap_qmp_ops.list(&d, 2000, &list, &err), 0);
    assert_int_equal(json_array_size(list), 1);
    assert_string_equal(json_string_value(json_object_get(
        json_array_get(list, 0), "name")), "cp.g.t1");
    assert_string_equal(json_string_value(json_object_get(
        json_array_get(list, 0), "id")), "1");
    json_decref(list);
    finish(&f);
}

static void
test_remove_of_an_absent_snapshot_is_enoent(void **state)
{
    const char *files[] = {"error-snapshot-delete-absent.txt", NULL};
    struct fixture f;
    struct snap_disk d;
    struct snap_err err = {0};

    (void)state;
    start(&f, files, 1, -1, "disk0");
    vm_snap_disk(&f.v, 0, &d);
    assert_int_equal(snap_qmp_ops.remove(&d, "nosuch", 2000, &err),
                     SNAP_ENOENT);
    finish(&f);
}

static void
test_bound_of_a_file_node_is_no_storage_wait(void **state)
{
    const char *files[] = {"query-named-block-nodes-qcow2.txt", NULL};
    struct fixture f;
    struct snap_disk d;
    struct snap_bound b;
    struct snap_err err = {0};

    (void)state;
    start(&f, files, 1, -1, "disk0");
    vm_snap_disk(&f.v, 0, &d);
    assert_int_equal(snap_qmp_ops.pause_bound(&d, 2000, &b, &err), 0);
    assert_int_equal(b.storage, 0);
    assert_int_equal(b.bound_ms, 0);
    finish(&f);
}

/* The conf QEMU opened its rbd node with, as recorded; written here. */
#define RBD_REC_CONF "/tmp/cp-qmp-rec-rbd/qemu.conf"

static void
write_conf(const char *path, const char *text)
{
    FILE *fp;

    mkdir("/tmp/cp-qmp-rec-rbd", 0700);
    fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void
bound_of_rbd(const char *conf, struct snap_bound *b, int *rc)
{
    const char *files[] = {"query-named-block-nodes-rbd.txt", NULL};
    struct fixture f;
    struct snap_disk d;
    struct snap_err err = {0};

    write_conf(RBD_REC_CONF, conf);
    start(&f, files, 1, -1, "disk0");
    vm_snap_disk(&f.v, 0, &d);
    *rc = snap_qmp_ops.pause_bound(&d, 2000, b, &err);
    finish(&f);
    unlink(RBD_REC_CONF);
}

/* QEMU's own Ceph client (recorded: conf=RBD_REC_CONF, user=admin): its
 * request timeouts are the bound; none means no limit. */
static void
test_bound_of_an_rbd_node_is_qemus_op_timeouts(void **state)
{
    struct snap_bound b;
    int rc;

    (void)state;
    bound_of_rbd("[global]\nfsid = 1\n[client]\nrados osd op timeout = 5\n"
                 "[client.admin]\nrados mon op timeout = 7\n", &b, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(b.storage, 1);
    assert_int_equal(b.bound_ms, 12000);
    assert_non_null(strstr(b.why, "client.admin"));
    assert_non_null(strstr(b.why, RBD_REC_CONF));
    bound_of_rbd("[global]\nfsid = 1\n[client]\nrados osd op timeout = 5\n",
                 &b, &rc);
    assert_int_equal(rc, 0);
    assert_int_equal(b.storage, 1);
    assert_int_equal(b.bound_ms, -1);
    assert_non_null(strstr(b.why, "rados_mon_op_timeout=0"));
}

/* The same lookup without QEMU: sections by client name, legacy
 * key=value pairs on top, an unreadable conf is an error. */
static void
test_client_timeouts_from_conf(void **state)
{
    const char *kv[] = {"rados_mon_op_timeout", "9"};
    char err[256];
    int osd = -1, mon = -1;

    (void)state;
    write_conf(RBD_REC_CONF, "[global]\nfsid = 1\n[client]\n"
               "rados osd op timeout = 5\n[client.qemu]\n"
               "rados mon op timeout = 7s\n");
    assert_int_equal(rbdsnap_client_timeouts(RBD_REC_CONF, "qemu", NULL, 0,
                                             &osd, &mon, err, sizeof(err)), 0);
    assert_int_equal(osd, 5);
    assert_int_equal(mon, 7);
    assert_int_equal(rbdsnap_client_timeouts(RBD_REC_CONF, NULL, NULL, 0,
                                             &osd, &mon, err, sizeof(err)), 0);
    assert_int_equal(osd, 5);
    assert_int_equal(mon, 0);
    assert_int_equal(rbdsnap_client_timeouts(RBD_REC_CONF, "admin", kv, 1,
                                             &osd, &mon, err, sizeof(err)), 0);
    assert_int_equal(mon, 9);
    unlink(RBD_REC_CONF);
    assert_int_equal(rbdsnap_client_timeouts(RBD_REC_CONF, NULL, NULL, 0,
                                             &osd, &mon, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "cannot read"));
}

static void
test_backend_table(void **state)
{
    struct snap_disk d = {.node = "disk0"};

    (void)state;
    assert_ptr_equal(snap_backend_find("rbd"), &snap_rbd_ops);
    assert_ptr_equal(snap_backend_find("qmp-transaction"), &snap_qmp_ops);
    assert_null(snap_backend_find("auto"));
    assert_null(snap_backend_find(NULL));
    /* remove and list follow the open image, not the VM's method */
    assert_ptr_equal(snap_disk_backend(&d), &snap_qmp_ops);
    d.img = (struct rbdsnap_image *)&d;     /* any non-NULL handle */
    assert_ptr_equal(snap_disk_backend(&d), &snap_rbd_ops);
}

int
main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_is_one_transaction),
        cmocka_unit_test(test_refused_transaction_fails_every_disk),
        cmocka_unit_test(test_hung_qemu_is_a_timeout),
        cmocka_unit_test(test_list_reads_the_node_from_query_block),
        cmocka_unit_test(test_remove_of_an_absent_snapshot_is_enoent),
        cmocka_unit_test(test_bound_of_a_file_node_is_no_storage_wait),
        cmocka_unit_test(test_bound_of_an_rbd_node_is_qemus_op_timeouts),
        cmocka_unit_test(test_client_timeouts_from_conf),
        cmocka_unit_test(test_backend_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
