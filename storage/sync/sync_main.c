/*
 * cutpoint-sync: replicate one RBD snapshot from the primary cluster to
 * the DR cluster.  See docs/replication.md for the options, the JSON
 * events on stdout and the exit codes.
 */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sync_engine.h"
#include "sync_fence.h"

/* Exit codes, documented in docs/replication.md. */
enum {
    EXIT_OK = 0,
    EXIT_ERROR = 1,
    EXIT_USAGE = 2,
    EXIT_NOBASE = 3,
    EXIT_VERIFY = 4,
    EXIT_NOSRC = 5,
    EXIT_FENCED = 6,
};

static void
usage(FILE *f)
{
    fprintf(f,
"usage: cutpoint-sync --src-conf FILE --dst-conf FILE --image NAME\n"
"                     --snap TARGET [--base BASE] [options]\n"
"  --src-conf FILE      primary ceph.conf\n"
"  --src-id ID          primary client id (default admin)\n"
"  --src-keyring FILE   primary keyring (default: from ceph.conf)\n"
"  --src-pool POOL      primary pool (default rbd)\n"
"  --dst-conf/--dst-id/--dst-keyring/--dst-pool   the same for DR\n"
"  --image NAME         image name (the same at both sites)\n"
"  --snap TARGET        snapshot to replicate\n"
"  --base BASE          snapshot already at DR to copy the delta from\n"
"                       (omit for a full copy)\n"
"  --full-resync        copy the whole image (also when BASE is missing\n"
"                       at DR)\n"
"  --verify-full        compare SHA-256 of both whole snapshots at the end\n"
"  --verify-only        only compare the two existing snapshots\n"
"  --extent-verify M    osd (default: the DR OSD computes each extent's\n"
"                       CRC-32C) or readback (read back, compare SHA-256)\n"
"  --rate-mbps N        limit data to N MB/s (10^6 bytes/s; 0 = no limit)\n"
"  --state-dir DIR      progress records (default /var/lib/cutpoint/sync)\n"
"  --chunk-kib N        extent piece size (default 4096)\n"
"  --jobs N             groups (4 MiB chunks) in flight (default 16)\n"
"  --progress-ms N      interval of progress events (default 500)\n"
"  --op-timeout S       fail a Ceph request (mon or OSD) after S seconds\n"
"                       instead of waiting forever (default 60)\n"
"  --epoch N            fencing epoch the source site is active under\n"
"                       (default 0); a DR image that is the live copy\n"
"                       since an epoch >= N is refused, nothing written\n"
"exit: 0 ok, 1 error, 2 usage, 3 base missing at DR, 4 verification\n"
"      failed, 5 image or snapshot missing at the primary, 6 fenced:\n"
"      the DR image is the live copy\n");
}

static void
log_line(const char *level, const char *line, void *arg)
{
    struct timespec ts;
    struct tm tm;
    char stamp[32];

    (void)arg;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(stderr, "ts=%s.%03ldZ prog=cutpoint-sync level=%s %s\n", stamp,
            ts.tv_nsec / 1000000L, level, line);
    fflush(stderr);
}

static void
event_line(const char *json, void *arg)
{
    (void)arg;
    fputs(json, stdout);
    fputc('\n', stdout);
    /* A supervisor reads these as they happen, through a pipe. */
    fflush(stdout);
}

static int
parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);

    if (end == s || *end != '\0' || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

static int
mkdir_p(const char *dir)
{
    char tmp[4096];
    size_t i, n = strlen(dir);

    if (n == 0 || n >= sizeof(tmp))
        return -1;
    memcpy(tmp, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (tmp[i] == '/' || tmp[i] == '\0') {
            char c = tmp[i];

            tmp[i] = '\0';
            if (mkdir(tmp, 0700) < 0) {
                struct stat st;

                if (stat(tmp, &st) < 0 || !S_ISDIR(st.st_mode))
                    return -1;
            }
            tmp[i] = c;
        }
    }
    return 0;
}

int
main(int argc, char **argv)
{
    enum { O_SRC_CONF = 256, O_SRC_ID, O_SRC_KEYRING, O_SRC_POOL, O_DST_CONF,
           O_DST_ID, O_DST_KEYRING, O_DST_POOL, O_IMAGE, O_SNAP, O_BASE,
           O_FULL, O_VFULL, O_VONLY, O_RATE, O_STATE, O_CHUNK, O_JOBS,
           O_PMS, O_EVERIFY, O_TIMEOUT, O_EPOCH, O_HELP };
    static const struct option longopts[] = {
        {"src-conf", required_argument, NULL, O_SRC_CONF},
        {"src-id", required_argument, NULL, O_SRC_ID},
        {"src-keyring", required_argument, NULL, O_SRC_KEYRING},
        {"src-pool", required_argument, NULL, O_SRC_POOL},
        {"dst-conf", required_argument, NULL, O_DST_CONF},
        {"dst-id", required_argument, NULL, O_DST_ID},
        {"dst-keyring", required_argument, NULL, O_DST_KEYRING},
        {"dst-pool", required_argument, NULL, O_DST_POOL},
        {"image", required_argument, NULL, O_IMAGE},
        {"snap", required_argument, NULL, O_SNAP},
        {"base", required_argument, NULL, O_BASE},
        {"full-resync", no_argument, NULL, O_FULL},
        {"verify-full", no_argument, NULL, O_VFULL},
        {"verify-only", no_argument, NULL, O_VONLY},
        {"rate-mbps", required_argument, NULL, O_RATE},
        {"state-dir", required_argument, NULL, O_STATE},
        {"chunk-kib", required_argument, NULL, O_CHUNK},
        {"jobs", required_argument, NULL, O_JOBS},
        {"progress-ms", required_argument, NULL, O_PMS},
        {"extent-verify", required_argument, NULL, O_EVERIFY},
        {"op-timeout", required_argument, NULL, O_TIMEOUT},
        {"epoch", required_argument, NULL, O_EPOCH},
        {"help", no_argument, NULL, O_HELP},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    struct sync_opts o;
    struct sync_result r;
    char err[1024];
    const char *bad = NULL;
    double v;
    int c, rc, code;
    json_t *ev;

    sync_opts_init(&o);
    o.src.id = o.dst.id = "admin";
    o.src.pool = o.dst.pool = "rbd";
    while ((c = getopt_long(argc, argv, "hV", longopts, NULL)) != -1) {
        switch (c) {
        case O_SRC_CONF: o.src.conf = optarg; break;
        case O_SRC_ID: o.src.id = optarg; break;
        case O_SRC_KEYRING: o.src.keyring = optarg; break;
        case O_SRC_POOL: o.src.pool = optarg; break;
        case O_DST_CONF: o.dst.conf = optarg; break;
        case O_DST_ID: o.dst.id = optarg; break;
        case O_DST_KEYRING: o.dst.keyring = optarg; break;
        case O_DST_POOL: o.dst.pool = optarg; break;
        case O_IMAGE: o.image = optarg; break;
        case O_SNAP: o.target = optarg; break;
        case O_BASE: o.base = optarg; break;
        case O_FULL: o.full_resync = 1; break;
        case O_VFULL: o.verify_full = 1; break;
        case O_VONLY: o.verify_only = 1; break;
        case O_RATE:
            if (parse_num(optarg, 0, 1e6, &o.rate_mbps) < 0)
                bad = "--rate-mbps wants a number from 0 to 1000000";
            break;
        case O_STATE: o.state_dir = optarg; break;
        case O_CHUNK:
            if (parse_num(optarg, 4, 65536, &v) < 0 || v != (int)v ||
                ((int)v & 3) != 0)
                bad = "--chunk-kib wants a multiple of 4 from 4 to 65536";
            else
                o.chunk = (uint64_t)v * 1024;
            break;
        case O_JOBS:
            if (parse_num(optarg, 1, 64, &v) < 0 || v != (int)v)
                bad = "--jobs wants an integer from 1 to 64";
            else
                o.workers = (int)v;
            break;
        case O_PMS:
            if (parse_num(optarg, 10, 60000, &v) < 0 || v != (int)v)
                bad = "--progress-ms wants an integer from 10 to 60000";
            else
                o.progress_ms = (int)v;
            break;
        case O_TIMEOUT:
            if (parse_num(optarg, 1, 3600, &v) < 0 || v != (int)v)
                bad = "--op-timeout wants an integer from 1 to 3600";
            else
                o.op_timeout_s = (int)v;
            break;
        case O_EPOCH:
            if (sync_fence_parse(optarg, &o.epoch) < 0)
                bad = "--epoch wants a whole number from 0 to "
                      "9007199254740991";
            break;
        case O_EVERIFY:
            if (strcmp(optarg, "osd") == 0)
                o.extent_verify = SYNC_VERIFY_OSD;
            else if (strcmp(optarg, "readback") == 0)
                o.extent_verify = SYNC_VERIFY_READBACK;
            else
                bad = "--extent-verify wants osd or readback";
            break;
        case 'V':
            printf("cutpoint-sync %s\n", CUTPOINT_VERSION);
            return EXIT_OK;
        case 'h':
        case O_HELP:
            usage(stdout);
            return EXIT_OK;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
        if (bad != NULL)
            break;
    }
    if (bad == NULL && optind < argc)
        bad = "unexpected positional argument";
    if (bad == NULL && (o.src.conf == NULL || o.dst.conf == NULL))
        bad = "--src-conf and --dst-conf are required";
    if (bad == NULL && (o.image == NULL || o.image[0] == '\0'))
        bad = "--image is required";
    if (bad == NULL && (o.target == NULL || o.target[0] == '\0'))
        bad = "--snap is required";
    if (bad == NULL && o.base != NULL && strcmp(o.base, o.target) == 0)
        bad = "--base and --snap name the same snapshot";
    if (bad == NULL && o.verify_only && (o.full_resync || o.base != NULL))
        bad = "--verify-only takes no --base or --full-resync";
    if (bad != NULL) {
        log_line("error", "msg=\"bad usage\"", NULL);
        fprintf(stderr, "cutpoint-sync: %s\n", bad);
        usage(stderr);
        return EXIT_USAGE;
    }
    o.on_event = event_line;
    o.on_log = log_line;
    if (!o.verify_only && mkdir_p(o.state_dir) < 0) {
        fprintf(stderr, "cutpoint-sync: cannot create state dir %s\n",
                o.state_dir);
        return EXIT_ERROR;
    }

    rc = sync_run(&o, &r, err, sizeof(err));
    switch (rc) {
    case SYNC_OK: code = EXIT_OK; break;
    case SYNC_ENOBASE: code = EXIT_NOBASE; break;
    case SYNC_EVERIFY: code = EXIT_VERIFY; break;
    case SYNC_ENOSRC: code = EXIT_NOSRC; break;
    case SYNC_EFENCED: code = EXIT_FENCED; break;
    default: code = EXIT_ERROR; break;
    }
    if (code != EXIT_OK) {
        ev = json_pack("{s:s,s:i,s:s,s:s,s:s}", "event", "error", "exit",
                       code, "image", o.image, "target", o.target,
                       "message", err);
        if (ev != NULL) {
            char *s = json_dumps(ev, JSON_COMPACT | JSON_PRESERVE_ORDER);

            if (s != NULL)
                event_line(s, NULL);
            free(s);
            json_decref(ev);
        }
        {
            char line[1400];

            /* The message is quoted; strip quotes it might contain. */
            for (char *p = err; *p; p++)
                if (*p == '"')
                    *p = '\'';
            snprintf(line, sizeof(line), "msg=\"sync failed\" exit=%d "
                     "image=%s target=%s error=\"%s\"", code, o.image,
                     o.target, err);
            log_line("error", line, NULL);
        }
        return code;
    }
    {
        char line[512];

        snprintf(line, sizeof(line), "msg=\"sync done\" image=%s target=%s "
                 "mode=%s shipped=%llu changed=%llu seconds=%.3f "
                 "teardown_ms=%.1f", o.image,
                 o.target, r.already ? "already" : r.full ? "full"
                 : "incremental", (unsigned long long)r.bytes_shipped,
                 (unsigned long long)r.bytes_changed, r.seconds,
                 r.teardown_ms);
        log_line("info", line, NULL);
    }
    return EXIT_OK;
}
