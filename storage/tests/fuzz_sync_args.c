/*
 * libFuzzer target: the input is cutpoint-sync's command line, its
 * arguments separated by NUL bytes (argv[0] is added).  sync_args_parse
 * runs as main() runs it.  A command line it accepts must give options
 * the engine can run with: both sites' conf, an image and a target that
 * differs from the base, every number within its documented range.
 */
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sync_args.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

static void
check_run(const struct sync_opts *o)
{
    if (!o->src.conf || !o->dst.conf || !o->src.id || !o->dst.id ||
        !o->src.pool || !o->dst.pool || !o->state_dir)
        abort();
    if (!o->image || !o->image[0] || !o->target || !o->target[0])
        abort();
    if (o->base && strcmp(o->base, o->target) == 0)
        abort();
    if (o->verify_only && (o->full_resync || o->base))
        abort();
    if (!(o->rate_mbps >= 0 && o->rate_mbps <= 1e6) ||
        o->chunk < 4096 || o->chunk > 65536u * 1024 || o->chunk % 4096 ||
        o->workers < 1 || o->workers > 64 ||
        o->progress_ms < 10 || o->progress_ms > 60000 ||
        o->op_timeout_s < 1 || o->op_timeout_s > 3600 ||
        (o->extent_verify != SYNC_VERIFY_OSD &&
         o->extent_verify != SYNC_VERIFY_READBACK))
        abort();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1), *argv[MAX_ARGS + 2];
    struct sync_opts o;
    const char *bad;
    size_t i, start = 0;
    int argc = 1;

    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    argv[0] = "cutpoint-sync";
    for (i = 0; i <= size && argc <= MAX_ARGS; i++)
        if (buf[i] == '\0') {
            argv[argc++] = buf + start;
            start = i + 1;
        }
    argv[argc] = NULL;
    opterr = 0;     /* getopt's own complaints go to stderr: keep it quiet */
    switch (sync_args_parse(argc, argv, &o, &bad)) {
    case SYNC_ARGS_RUN:
        if (bad)
            abort();
        check_run(&o);
        break;
    case SYNC_ARGS_SERVE:
        /* the sites and defaults of a session; no image of its own */
        if (bad || !o.serve || o.image || o.target || o.base ||
            o.verify_only || !o.src.conf || !o.dst.conf)
            abort();
        break;
    case SYNC_ARGS_USAGE:
        break;
    case SYNC_ARGS_HELP:
    case SYNC_ARGS_VERSION:
        if (bad)
            abort();
        break;
    default:
        abort();
    }
    free(buf);
    return 0;
}
