/*
 * cutpointd: the cutpoint host agent.
 *   cutpointd -c FILE        run
 *   cutpointd -n -c FILE     check FILE (syntax, keys, certificates) and exit
 *   cutpointd --version
 */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent.h"
#include "config.h"
#include "log.h"
#include "server.h"
#include "tls.h"

static volatile sig_atomic_t stop_flag;

static void
on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void
usage(void)
{
    fprintf(stderr, "usage: cutpointd [-n] -c CONFIG | --version\n");
    exit(2);
}

int
main(int argc, char **argv)
{
    static struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"check", no_argument, NULL, 'n'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    static struct agent_config cfg;
    static struct agent agent;
    const char *path = NULL;
    int check = 0, ch;
    char err[1024];
    enum log_level lvl;
    struct sigaction sa;

    while ((ch = getopt_long(argc, argv, "c:nV", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            path = optarg;
            break;
        case 'n':
            check = 1;
            break;
        case 'V':
            printf("cutpointd %s (agent protocol 1)\n", CUTPOINT_VERSION);
            return 0;
        default:
            usage();
        }
    }
    if (!path || optind != argc)
        usage();
    if (config_load(path, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "cutpointd: %s\n", err);
        return 1;
    }
    if (tls_check(&cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "cutpointd: %s: tls: %s\n", path, err);
        return 1;
    }
    if (check) {
        printf("cutpointd: %s: configuration ok (%d VMs)\n", path, cfg.nvms);
        return 0;
    }
    if (log_parse_level(cfg.log_level, &lvl) == 0)
        log_set_level(lvl);

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    log_info("event=start version=%s config=%s pid=%d", CUTPOINT_VERSION, path,
             (int)getpid());
    if (agent_start(&agent, &cfg, err, sizeof(err)) < 0) {
        agent_stop(&agent);
        fatalx("event=start_failed msg=\"%s\"", err);
    }
    /* READY=1 is sent by server_run once its listener is open. */
    if (server_run(&agent, &stop_flag, err, sizeof(err)) < 0) {
        agent_stop(&agent);
        fatalx("event=server_failed msg=\"%s\"", err);
    }
    log_info("event=stopping");
    agent_stop(&agent);
    return 0;
}
