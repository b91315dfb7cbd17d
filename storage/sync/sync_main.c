/*
 * cutpoint-sync: replicate one RBD snapshot from the primary cluster to
 * the DR cluster.  See docs/replication.md for the options, the JSON
 * events on stdout and the exit codes.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sync_args.h"
#include "sync_engine.h"
#include "sync_fence.h"
#include "sync_serve.h"

/* Exit codes, documented in docs/replication.md. */
enum {
    EXIT_OK = 0,
    EXIT_ERROR = 1,
    EXIT_USAGE = 2,
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
"  --serve              connect once, then copy one image per JSON line\n"
"                       on stdin ({\"image\", \"snap\", \"base\", ...}; see\n"
"                       docs/replication.md); exit 0 at EOF\n"
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
    struct sync_opts o;
    struct sync_result r;
    char err[1024];
    const char *bad;
    int rc, code;
    json_t *ev;

    switch (sync_args_parse(argc, argv, &o, &bad)) {
    case SYNC_ARGS_VERSION:
        printf("cutpoint-sync %s\n", CUTPOINT_VERSION);
        return EXIT_OK;
    case SYNC_ARGS_HELP:
        usage(stdout);
        return EXIT_OK;
    case SYNC_ARGS_USAGE:
        if (bad == NULL) {      /* getopt said why */
            usage(stderr);
            return EXIT_USAGE;
        }
        break;
    case SYNC_ARGS_RUN:
    case SYNC_ARGS_SERVE:
        break;
    }
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

    if (o.serve)
        return sync_serve(&o, stdin) == 0 ? EXIT_OK : EXIT_ERROR;

    rc = sync_run(&o, &r, err, sizeof(err));
    code = sync_exit_code(rc);
    if (code != EXIT_OK) {
        ev = sync_error_event(code, NULL, o.image, o.target, err);
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
