/*
 * cp-sharedlog: entry point.  One binary runs every role:
 *
 *   cp-sharedlog [--role all|storage|order|client|admin] [--node I]
 *                [--peers A,B,...] [--disk PATH] [--ops N] [--delay-ms MS]
 *                [--interval-ms MS] [--no-fsync] [--simulate-power-loss]
 *                [--finalize SHARD --grace CUTS | --trim GSN] [-n]
 *
 * --role all (the default, as in the guest) runs on node i the storage
 * server i, the ordering replica i when i < 3, and client i+1, as one
 * process group; --role servers runs the same without the client (a
 * restored copy that is only checked).  The configuration comes from CP_PEERS, CP_IP, CP_DISKS
 * and CP_ARGS in the guest, or from the flags on the host.
 */
#include "sl.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <signal.h>
#include <unistd.h>

static void usage(void)
{
    fprintf(stderr,
            "usage: cp-sharedlog [--role all|servers|storage|order|client|admin]\n"
            "       [--node I] [--peers IP[:PORT],...] [--disk PATH]\n"
            "       [--ops N] [--delay-ms MS] [--interval-ms MS] [--progress N]\n"
            "       [--no-fsync] [--simulate-power-loss]\n"
            "       [--finalize SHARD --grace CUTS | --trim GSN] [-n]\n");
    exit(2);
}

static void child(void)
{
    /* children die with the parent (kill -9 of the group also works) */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
}

int main(int argc, char **argv)
{
    static struct sl_config cfg;
    const char *role = "all", *disk = NULL, *peers = getenv("CP_PEERS");
    int node = -1, nofsync = 0, sim = 0, check_only = 0, ac;
    long finalize = -1, grace = 10, trim = -1;
    struct sl_client_opts co = { .ops = -1, .progress = 100 };
    char **av, err[256], diskbuf[256];
    static const struct option longopts[] = {
        { "role", required_argument, NULL, 'r' },
        { "node", required_argument, NULL, 'i' },
        { "peers", required_argument, NULL, 'p' },
        { "disk", required_argument, NULL, 'd' },
        { "ops", required_argument, NULL, 'o' },
        { "delay-ms", required_argument, NULL, 'D' },
        { "interval-ms", required_argument, NULL, 'I' },
        { "no-fsync", no_argument, NULL, 'F' },
        { "simulate-power-loss", no_argument, NULL, 'S' },
        { "finalize", required_argument, NULL, 'f' },
        { "grace", required_argument, NULL, 'g' },
        { "trim", required_argument, NULL, 't' },
        { "progress", required_argument, NULL, 'P' },
        { NULL, 0, NULL, 0 },
    };

    cfg.interval_ms = 10;
    if (wl_args_merge(argc, argv, &ac, &av) < 0)
        wl_fatal("out of memory");
    for (int ch; (ch = getopt_long(ac, av, "n", longopts, NULL)) != -1;) {
        switch (ch) {
        case 'r': role = optarg; break;
        case 'i': node = atoi(optarg); break;
        case 'p': peers = optarg; break;
        case 'd': disk = optarg; break;
        case 'o': co.ops = atol(optarg); break;
        case 'D': co.delay_ms = atoi(optarg); break;
        case 'I': cfg.interval_ms = atoi(optarg); break;
        case 'F': nofsync = 1; break;
        case 'S': sim = 1; break;
        case 'f': finalize = atol(optarg); break;
        case 'g': grace = atol(optarg); break;
        case 't': trim = atol(optarg); break;
        case 'P': co.progress = atoi(optarg); break;
        case 'n': check_only = 1; break;
        default: usage();
        }
    }
    if (!peers)
        wl_fatal("no peer list (--peers or CP_PEERS)");
    cfg.nnodes = wl_peers_parse(peers, SL_DEFAULT_PORT, cfg.addrs,
                                SL_MAX_NODES, err, sizeof(err));
    if (cfg.nnodes < 0)
        wl_fatal("%s", err);
    if (cfg.nnodes < 2 || cfg.nnodes % 2)
        wl_fatal("need an even number of nodes (2 storage servers per "
                 "shard), got %d", cfg.nnodes);
    if (cfg.interval_ms < 1)
        wl_fatal("--interval-ms must be positive");
    if (co.progress < 1)
        wl_fatal("--progress must be positive");
    if (strcmp(role, "admin") == 0) {
        uint8_t cmd[16];
        int rc;
        if (finalize >= 0 && finalize < cfg.nnodes / 2) {
            cmd[0] = SL_CMD_FINALIZE;
            wl_put32(cmd + 1, (uint32_t)finalize);
            wl_put64(cmd + 5, (uint64_t)grace);
            rc = sl_admin(&cfg, cmd, 13);
            free(av);
            return rc;
        }
        if (trim >= 0) {
            cmd[0] = SL_CMD_TRIM;
            wl_put64(cmd + 1, (uint64_t)trim);
            rc = sl_admin(&cfg, cmd, 9);
            free(av);
            return rc;
        }
        wl_fatal("admin needs --finalize SHARD (< %d) or --trim GSN",
                 cfg.nnodes / 2);
    }
    node = wl_node_resolve(node, cfg.addrs, cfg.nnodes, SL_DEFAULT_PORT);
    cfg.node = node;
    disk = wl_disk_resolve(disk, diskbuf, sizeof(diskbuf));
    struct wl_dev *d0 = wl_dev_open_or_die(disk, 0, 0);
    if (check_only) {
        /* -n never writes: a blank disk is only reported */
        char magic[8];
        if (wl_dev_read(d0, 0, magic, 8) < 0)
            wl_fatal("%s: cannot read", disk);
        if (memcmp(magic, SL_SB_MAGIC, 8) != 0) {
            printf("disk %s is blank: it would be formatted as node %d "
                   "of %d\n", disk, node, cfg.nnodes);
            wl_dev_free(d0);
            return 0;
        }
    }
    if (sl_superblock_load(d0, &cfg, err, sizeof(err)) < 0)
        wl_fatal("%s: %s", disk, err);
    wl_dev_free(d0);
    if (check_only) {
        printf("node %d of %d (shard %d), disk %s ok\n", node, cfg.nnodes,
               sl_shard_of(node), disk);
        return 0;
    }
    wl_log("cp-sharedlog role=%s node=%d nodes=%d disk=%s%s%s", role, node,
           cfg.nnodes, disk, nofsync ? " NO-FSYNC" : "",
           sim ? " simulated-page-cache" : "");
    if (strcmp(role, "storage") == 0)
        return sl_storage_run(&cfg, wl_dev_open_or_die(disk, nofsync, sim));
    if (strcmp(role, "order") == 0)
        return sl_order_run(&cfg, wl_dev_open_or_die(disk, nofsync, sim));
    if (strcmp(role, "client") == 0)
        return sl_client_run(&cfg, wl_dev_open_or_die(disk, 0, sim), &co);
    if (strcmp(role, "all") && strcmp(role, "servers"))
        usage();
    if (node < sl_norder(&cfg)) {
        pid_t pid = fork();
        if (pid < 0)
            wl_fatal("fork failed");
        if (pid == 0) {
            child();
            return sl_order_run(&cfg, wl_dev_open_or_die(disk, nofsync, sim));
        }
    }
    pid_t pid = strcmp(role, "servers") ? fork() : 1;
    if (pid < 0)
        wl_fatal("fork failed");
    if (pid == 0) {
        child();
        /* the journal is the oracle: synced even under --no-fsync */
        return sl_client_run(&cfg, wl_dev_open_or_die(disk, 0, sim), &co);
    }
    return sl_storage_run(&cfg, wl_dev_open_or_die(disk, nofsync, sim));
}
