/*
 * cp-kvstore: entry point.  One binary runs every role:
 *
 *   cp-kvstore [--role all|server|client] [--node I] [--peers A,B,...]
 *              [--disk PATH] [--partitions N] [--ops N] [--delay-ms MS]
 *              [--no-fsync] [--simulate-power-loss] [-n]
 *
 * In the tiny guest everything comes from the environment: CP_PEERS
 * (ring order), CP_IP (our address, which gives --node), CP_DISKS (the
 * first disk is ours) and CP_ARGS (extra flags, comma-separated).  On the
 * host the same flags run several nodes on 127.0.0.1 with files as disks.
 */
#include "kv.h"
#include "kv_part.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KV_DEFAULT_PORT 7700

static void usage(void)
{
    fprintf(stderr,
            "usage: cp-kvstore [--role all|server|client] [--node I]\n"
            "       [--peers IP[:PORT],...] [--disk PATH] [--partitions N]\n"
            "       [--ops N] [--delay-ms MS] [--no-fsync]\n"
            "       [--simulate-power-loss] [--compact-removes N] [--progress N] [-n]\n");
    exit(2);
}

/* The ring from --peers/CP_PEERS, in order; its addresses also go to
 * addrs, for wl_node_resolve. */
static int parse_peers(const char *s, struct kv_config *c,
                       struct wl_addr *addrs)
{
    char err[256];
    int n = wl_peers_parse(s, KV_DEFAULT_PORT, addrs, KV_MAX_NODES, err,
                           sizeof(err));

    if (n < 0) {
        fprintf(stderr, "cp-kvstore: %s\n", err);
        return -1;
    }
    c->nnodes = n;
    for (int i = 0; i < n; i++)
        c->members[i].addr = addrs[i];
    return n > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    static struct kv_config cfg;
    const char *role = "all", *disk = NULL, *peers = getenv("CP_PEERS");
    int node = -1, nofsync = 0, sim = 0, check_only = 0, ac;
    struct kv_client_opts co = { .ops = -1, .delay_ms = 0, .progress = 100 };
    char **av, err[256], diskbuf[256];
    static struct wl_addr addrs[KV_MAX_NODES];
    static const struct option longopts[] = {
        { "role", required_argument, NULL, 'r' },
        { "node", required_argument, NULL, 'i' },
        { "peers", required_argument, NULL, 'p' },
        { "disk", required_argument, NULL, 'd' },
        { "partitions", required_argument, NULL, 'P' },
        { "ops", required_argument, NULL, 'o' },
        { "delay-ms", required_argument, NULL, 'D' },
        { "no-fsync", no_argument, NULL, 'F' },
        { "simulate-power-loss", no_argument, NULL, 'S' },
        { "compact-removes", required_argument, NULL, 'C' },
        { "progress", required_argument, NULL, 'G' },
        { NULL, 0, NULL, 0 },
    };

    cfg.nparts = 8;
    if (wl_args_merge(argc, argv, &ac, &av) < 0)
        wl_fatal("out of memory");
    for (int ch; (ch = getopt_long(ac, av, "n", longopts, NULL)) != -1;) {
        switch (ch) {
        case 'r': role = optarg; break;
        case 'i': node = atoi(optarg); break;
        case 'p': peers = optarg; break;
        case 'd': disk = optarg; break;
        case 'P': cfg.nparts = atoi(optarg); break;
        case 'o': co.ops = atol(optarg); break;
        case 'D': co.delay_ms = atoi(optarg); break;
        case 'F': nofsync = 1; break;
        case 'S': sim = 1; break;
        case 'C': kv_compact_removes = (unsigned)atoi(optarg); break;
        case 'G': co.progress = atoi(optarg); break;
        case 'n': check_only = 1; break;
        default: usage();
        }
    }
    if (!peers || parse_peers(peers, &cfg, addrs) < 0)
        wl_fatal("no usable peer list (--peers or CP_PEERS)");
    if (co.progress < 1)
        wl_fatal("--progress must be positive");
    if (cfg.nparts < 1 || cfg.nparts > 4096)
        wl_fatal("--partitions must be 1..4096");
    node = wl_node_resolve(node, addrs, cfg.nnodes, KV_DEFAULT_PORT);
    cfg.node = node;
    disk = wl_disk_resolve(disk, diskbuf, sizeof(diskbuf));
    if (strcmp(role, "all") && strcmp(role, "server") &&
        strcmp(role, "client"))
        usage();
    co.client_id = node + 1;

    /* Format and load the superblock with fsync on, whatever the mode:
     * the negative control is about the data path, not the layout. */
    struct wl_dev *d0 = wl_dev_open_or_die(disk, 0, 0);
    if (check_only) {
        /* -n never writes: a blank disk is only reported */
        char magic[8];
        if (wl_dev_read(d0, 0, magic, 8) < 0)
            wl_fatal("%s: cannot read", disk);
        if (memcmp(magic, KV_SB_MAGIC, 8) != 0) {
            printf("disk %s is blank: it would be formatted as node %d "
                   "of %d\n", disk, node, cfg.nnodes);
            wl_dev_free(d0);
            return 0;
        }
    }
    if (kv_superblock_load(d0, &cfg, err, sizeof(err)) < 0)
        wl_fatal("%s: %s", disk, err);
    wl_dev_free(d0);
    if (check_only) {
        printf("node %d of %d, %d partitions, epoch %llu, disk %s ok\n",
               cfg.node, cfg.nnodes, cfg.nparts,
               (unsigned long long)cfg.epoch, disk);
        return 0;
    }
    wl_log("cp-kvstore role=%s node=%d nodes=%d parts=%d disk=%s%s%s", role,
           node, cfg.nnodes, cfg.nparts, disk, nofsync ? " NO-FSYNC" : "",
           sim ? " simulated-page-cache" : "");
    if (strcmp(role, "all") == 0) {
        pid_t pid = fork();
        if (pid < 0)
            wl_fatal("fork failed");
        if (pid == 0) {
            /* the client dies with its server */
            signal(SIGTERM, SIG_DFL);
            return kv_client_run(&cfg, wl_dev_open_or_die(disk, 0, sim), &co);
        }
        return kv_server_run(&cfg, wl_dev_open_or_die(disk, nofsync, sim),
                             cfg.members[node].addr.host);
    }
    if (strcmp(role, "server") == 0)
        return kv_server_run(&cfg, wl_dev_open_or_die(disk, nofsync, sim),
                             cfg.members[node].addr.host);
    return kv_client_run(&cfg, wl_dev_open_or_die(disk, 0, sim), &co);
}
