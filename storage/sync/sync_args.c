/* sync_args: see sync_args.h. */
#include "sync_args.h"
#include "sync_fence.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

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

enum sync_args_action
sync_args_parse(int argc, char **argv, struct sync_opts *o, const char **bad)
{
    enum { O_SRC_CONF = 256, O_SRC_ID, O_SRC_KEYRING, O_SRC_POOL, O_DST_CONF,
           O_DST_ID, O_DST_KEYRING, O_DST_POOL, O_IMAGE, O_SNAP, O_BASE,
           O_FULL, O_VFULL, O_VONLY, O_RATE, O_STATE, O_CHUNK, O_JOBS,
           O_PMS, O_EVERIFY, O_TIMEOUT, O_EPOCH, O_SERVE, O_HELP };
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
        {"serve", no_argument, NULL, O_SERVE},
        {"help", no_argument, NULL, O_HELP},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    double v;
    int c;

    *bad = NULL;
    sync_opts_init(o);
    o->src.id = o->dst.id = "admin";
    o->src.pool = o->dst.pool = "rbd";
    /* glibc: 0 restarts the scan from argv[1] with fresh state, so that a
     * second parse (tests, the fuzz target) sees a new command line. */
    optind = 0;
    while ((c = getopt_long(argc, argv, "hV", longopts, NULL)) != -1) {
        switch (c) {
        case O_SRC_CONF: o->src.conf = optarg; break;
        case O_SRC_ID: o->src.id = optarg; break;
        case O_SRC_KEYRING: o->src.keyring = optarg; break;
        case O_SRC_POOL: o->src.pool = optarg; break;
        case O_DST_CONF: o->dst.conf = optarg; break;
        case O_DST_ID: o->dst.id = optarg; break;
        case O_DST_KEYRING: o->dst.keyring = optarg; break;
        case O_DST_POOL: o->dst.pool = optarg; break;
        case O_IMAGE: o->image = optarg; break;
        case O_SNAP: o->target = optarg; break;
        case O_BASE: o->base = optarg; break;
        case O_FULL: o->full_resync = 1; break;
        case O_VFULL: o->verify_full = 1; break;
        case O_VONLY: o->verify_only = 1; break;
        case O_SERVE: o->serve = 1; break;
        case O_RATE:
            if (parse_num(optarg, 0, 1e6, &o->rate_mbps) < 0)
                *bad = "--rate-mbps wants a number from 0 to 1000000";
            break;
        case O_STATE: o->state_dir = optarg; break;
        case O_CHUNK:
            if (parse_num(optarg, 4, 65536, &v) < 0 || v != (int)v ||
                ((int)v & 3) != 0)
                *bad = "--chunk-kib wants a multiple of 4 from 4 to 65536";
            else
                o->chunk = (uint64_t)v * 1024;
            break;
        case O_JOBS:
            if (parse_num(optarg, 1, 64, &v) < 0 || v != (int)v)
                *bad = "--jobs wants an integer from 1 to 64";
            else
                o->workers = (int)v;
            break;
        case O_PMS:
            if (parse_num(optarg, 10, 60000, &v) < 0 || v != (int)v)
                *bad = "--progress-ms wants an integer from 10 to 60000";
            else
                o->progress_ms = (int)v;
            break;
        case O_TIMEOUT:
            if (parse_num(optarg, 1, 3600, &v) < 0 || v != (int)v)
                *bad = "--op-timeout wants an integer from 1 to 3600";
            else
                o->op_timeout_s = (int)v;
            break;
        case O_EPOCH:
            if (sync_fence_parse(optarg, &o->epoch) < 0)
                *bad = "--epoch wants a whole number from 0 to "
                       "9007199254740991";
            break;
        case O_EVERIFY:
            if (strcmp(optarg, "osd") == 0)
                o->extent_verify = SYNC_VERIFY_OSD;
            else if (strcmp(optarg, "readback") == 0)
                o->extent_verify = SYNC_VERIFY_READBACK;
            else
                *bad = "--extent-verify wants osd or readback";
            break;
        case 'V':
            return SYNC_ARGS_VERSION;
        case 'h':
        case O_HELP:
            return SYNC_ARGS_HELP;
        default:
            return SYNC_ARGS_USAGE;
        }
        if (*bad != NULL)
            break;
    }
    if (*bad == NULL && optind < argc)
        *bad = "unexpected positional argument";
    if (*bad == NULL && (o->src.conf == NULL || o->dst.conf == NULL))
        *bad = "--src-conf and --dst-conf are required";
    if (*bad == NULL && o->serve) {
        /* The images come from stdin, one request a line (sync_serve.h). */
        if (o->image != NULL || o->target != NULL || o->base != NULL)
            *bad = "--serve takes its images from stdin, not --image, "
                   "--snap or --base";
        else if (o->verify_only)
            *bad = "--serve does not take --verify-only";
        return *bad == NULL ? SYNC_ARGS_SERVE : SYNC_ARGS_USAGE;
    }
    if (*bad == NULL && (o->image == NULL || o->image[0] == '\0'))
        *bad = "--image is required";
    if (*bad == NULL && (o->target == NULL || o->target[0] == '\0'))
        *bad = "--snap is required";
    if (*bad == NULL && o->base != NULL && strcmp(o->base, o->target) == 0)
        *bad = "--base and --snap name the same snapshot";
    if (*bad == NULL && o->verify_only && (o->full_resync || o->base != NULL))
        *bad = "--verify-only takes no --base or --full-resync";
    return *bad == NULL ? SYNC_ARGS_RUN : SYNC_ARGS_USAGE;
}
