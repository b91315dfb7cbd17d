/*
 * sync_args: cutpoint-sync's command line (docs/replication.md), parsed
 * into struct sync_opts.  Pure: no I/O, no exit, so that the fuzz target
 * runs exactly what main() runs.
 */
#ifndef CUTPOINT_SYNC_ARGS_H
#define CUTPOINT_SYNC_ARGS_H

#include "sync_engine.h"

/* What the command line asks for. */
enum sync_args_action {
    SYNC_ARGS_RUN,       /* o is complete: replicate (or verify) */
    SYNC_ARGS_SERVE,     /* --serve: o has the sites and the defaults;
                            the copies come from stdin (sync_serve.h) */
    SYNC_ARGS_HELP,      /* --help, -h */
    SYNC_ARGS_VERSION,   /* --version, -V */
    SYNC_ARGS_USAGE,     /* bad usage: *bad says why (NULL when getopt
                            has printed the reason itself) */
};

/*
 * Fills o (after sync_opts_init and the site defaults: id admin, pool
 * rbd) from argv.  The strings in o point into argv.  *bad is set to a
 * static message for SYNC_ARGS_USAGE, else NULL.  May be called again:
 * getopt's state is reset first.
 */
enum sync_args_action sync_args_parse(int argc, char **argv,
                                      struct sync_opts *o, const char **bad);

#endif
