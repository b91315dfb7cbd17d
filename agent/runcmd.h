/*
 * runcmd: runs one operator-configured command (a VM's `start =`, agent
 * protocol §4.9) from the multi-threaded agent, bounded by a deadline.
 *
 *   runcmd_split(): "ABS-PATH arg arg ..." → argv, split on blanks; there is
 *                  no shell, no quoting and no expansion, so a value can
 *                  never turn into a second command.
 *   runcmd_run():   posix_spawn (no fork of a threaded process) with
 *                  stdin = /dev/null, stdout and stderr = one pipe, every
 *                  other fd closed, signal mask and dispositions reset (the
 *                  agent ignores SIGPIPE; a QEMU started from here must not),
 *                  in its own process group → waits until the *child* exits
 *                  (not until EOF: a daemonizing child such as
 *                  `qemu -daemonize` may leave a grandchild holding the
 *                  pipe) → keeps the tail of the output.  At the deadline
 *                  the child's process group gets SIGKILL.
 */
#ifndef CP_RUNCMD_H
#define CP_RUNCMD_H

#include <stddef.h>

#define RUNCMD_MAX_ARGS 64

struct runcmd_result {
    int exit_code;          /* exit status, or -1 when killed by a signal */
    int signo;              /* the signal that ended it, 0 if it exited */
    int timed_out;          /* 1: the deadline passed; killed */
    double ms;              /* spawn to exit (or to the kill) */
    char out[2048];         /* the last bytes of stdout+stderr, NUL-ended */
};

/*
 * Splits cmd into argv, copying into buf (buflen >= strlen(cmd) + 1).
 * argv[argc] = NULL.  Returns argc, or -1 when cmd is empty, argv[0] is
 * not an absolute path, or there are more than maxargs - 1 words.
 */
int runcmd_split(const char *cmd, char *buf, size_t buflen, char **argv,
                int maxargs);

/*
 * Runs argv[0] with argv, waiting up to timeout_ms.  0 when the child ran
 * and ended (look at r: exit_code, signo, timed_out), -1 when it could not
 * be started (err says why).
 */
int runcmd_run(char *const argv[], int timeout_ms, struct runcmd_result *r,
              char *err, size_t errlen);

/* 1 when r describes a clean exit with status 0. */
int runcmd_ok(const struct runcmd_result *r);

#endif
