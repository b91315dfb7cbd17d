/* runcmd: see runcmd.h. */
#include "runcmd.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mono.h"

extern char **environ;

/* posix_spawn's attribute and file-action calls fail only on ENOMEM. */
#define SETUP(call) do { if ((call) != 0) { \
        snprintf(err, errlen, "posix_spawn setup: out of memory"); \
        goto cleanup; } } while (0)

int
runcmd_split(const char *cmd, char *buf, size_t buflen, char **argv,
            int maxargs)
{
    char *p, *save = NULL;
    int argc = 0;

    if (!cmd || strlen(cmd) + 1 > buflen || maxargs < 2)
        return -1;
    memcpy(buf, cmd, strlen(cmd) + 1);
    for (p = strtok_r(buf, " \t", &save); p; p = strtok_r(NULL, " \t", &save)) {
        if (argc == maxargs - 1)
            return -1;
        argv[argc++] = p;
    }
    argv[argc] = NULL;
    /* No PATH search: the operator names the exact program. */
    if (argc == 0 || argv[0][0] != '/')
        return -1;
    return argc;
}

int
runcmd_ok(const struct runcmd_result *r)
{
    return !r->timed_out && r->signo == 0 && r->exit_code == 0;
}

/* Appends n bytes to r->out, keeping the last sizeof(out) - 1 bytes. */
static void
keep_tail(struct runcmd_result *r, const char *b, size_t n)
{
    size_t cap = sizeof(r->out) - 1, have = strlen(r->out), drop;

    if (n > cap) {
        b += n - cap;
        n = cap;
    }
    if (have + n > cap) {
        drop = have + n - cap;
        memmove(r->out, r->out + drop, have - drop);
        have -= drop;
    }
    memcpy(r->out + have, b, n);
    r->out[have + n] = '\0';
}

/* Reads what the pipe holds now; 1 at EOF, 0 otherwise. */
static int
drain(int fd, struct runcmd_result *r)
{
    char b[1024];
    ssize_t n;

    for (;;) {
        n = read(fd, b, sizeof(b));
        if (n > 0) {
            keep_tail(r, b, (size_t)n);
            continue;
        }
        if (n == 0)
            return 1;
        if (errno == EINTR)
            continue;
        return errno == EAGAIN ? 0 : 1;
    }
}

static void
set_status(struct runcmd_result *r, int st)
{
    if (WIFEXITED(st)) {
        r->exit_code = WEXITSTATUS(st);
        r->signo = 0;
    } else {
        r->exit_code = -1;
        r->signo = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
    }
}

int
runcmd_run(char *const argv[], int timeout_ms, struct runcmd_result *r,
          char *err, size_t errlen)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    int p[2] = {-1, -1}, st, rc = -1, eof = 0, fa_init = 0, at_init = 0;
    pid_t pid = -1;
    double t0 = mono_ms(), end = t0 + timeout_ms;

    memset(r, 0, sizeof(*r));
    r->exit_code = -1;
    if (pipe2(p, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto cleanup;
    }
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    SETUP(posix_spawn_file_actions_init(&fa));
    fa_init = 1;
    SETUP(posix_spawnattr_init(&at));
    at_init = 1;
    /* The dup2'd copies lose O_CLOEXEC; everything else above 2 (the
     * listen socket, TLS connections, QMP sockets, RADOS) is closed so a
     * long-lived child such as QEMU holds none of the agent's fds. */
    SETUP(posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0));
    SETUP(posix_spawn_file_actions_adddup2(&fa, p[1], 1));
    SETUP(posix_spawn_file_actions_adddup2(&fa, p[1], 2));
    SETUP(posix_spawn_file_actions_addclosefrom_np(&fa, 3));
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    /* Own process group: the deadline kills the command and whatever it
     * started that did not leave the group (a daemon that called setsid,
     * as `qemu -daemonize` does, is meant to outlive it). */
    SETUP(posix_spawnattr_setsigmask(&at, &none));
    SETUP(posix_spawnattr_setsigdefault(&at, &all));
    SETUP(posix_spawnattr_setpgroup(&at, 0));
    SETUP(posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK |
                                   POSIX_SPAWN_SETSIGDEF |
                                   POSIX_SPAWN_SETPGROUP));
    if ((errno = posix_spawn(&pid, argv[0], &fa, &at, argv, environ)) != 0) {
        snprintf(err, errlen, "cannot run %s: %s", argv[0], strerror(errno));
        pid = -1;
        goto cleanup;
    }
    close(p[1]);
    p[1] = -1;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        double left = end - mono_ms();

        if (w == pid) {
            set_status(r, st);
            break;
        }
        if (w < 0 && errno != EINTR) {
            snprintf(err, errlen, "waitpid: %s", strerror(errno));
            goto cleanup;
        }
        if (left <= 0) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            r->timed_out = 1;
            set_status(r, st);
            break;
        }
        if (!eof) {
            struct pollfd pf = {.fd = p[0], .events = POLLIN};
            if (poll(&pf, 1, left < 20 ? (int)left + 1 : 20) > 0)
                eof = drain(p[0], r);
        } else {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    if (!eof)
        drain(p[0], r);     /* non-blocking: what is there now, no more */
    r->ms = mono_ms() - t0;
    rc = 0;
cleanup:
    if (fa_init)
        posix_spawn_file_actions_destroy(&fa);
    if (at_init)
        posix_spawnattr_destroy(&at);
    if (p[0] >= 0)
        close(p[0]);
    if (p[1] >= 0)
        close(p[1]);
    return rc;
}
