/* config.c - parse the writer's environment and flags. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char config_usage[] =
    "usage: cp-writer [flags]\n"
    "  --disk PATH          a disk to write (repeat; default: CP_DISKS)\n"
    "  --vm N               VM index written in records (default: CP_VM, 1)\n"
    "  --peers A[:P],B[:P]  ring of writers in order (default: CP_PEERS)\n"
    "  --self ADDR          own address in --peers (default: CP_IP)\n"
    "  --ring-index N       own 0-based position in --peers (overrides --self)\n"
    "  --port P             ring port when a peer gives none (default 7700)\n"
    "  --single             single-VM mode even if peers are given\n"
    "  --count N            stop after global sequence number N\n"
    "  --delay-us N         sleep N microseconds after each record\n"
    "  --progress S         progress line every S seconds (default 2, 0 off)\n"
    "  --connect-timeout S  wait S seconds for ring peers (default 300)\n"
    "  --run ID             run id (default: from the clock)\n"
    "  --buffered           do not use O_DIRECT (for tmpfs files)\n"
    "  --zero               zero the disks before writing\n"
    "  --resume             continue the run on the disks (after a failover)\n"
    "  --version, --help\n"
    "Environment: CP_VM CP_IP CP_PEERS CP_DISKS CP_ARGS (comma-separated "
    "flags).\n";

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void config_init(struct config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->vm = 1;
    cfg->ring_index = -1;
    cfg->port = CONFIG_DEFAULT_PORT;
    cfg->progress_s = 2;
    cfg->connect_timeout_s = 300;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (!s || *s == '\0' || *s == '-')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

static int add_disk(struct config *cfg, const char *path,
                    char *err, size_t errlen)
{
    if (cfg->disks_from_env) {
        cfg->ndisks = 0;
        cfg->disks_from_env = false;
    }
    if (cfg->ndisks >= CONFIG_MAX_DISKS) {
        set_err(err, errlen, "too many disks (max %d)", CONFIG_MAX_DISKS);
        return -1;
    }
    if (strlen(path) >= CONFIG_PATH_MAX || *path == '\0') {
        set_err(err, errlen, "bad disk path '%s'", path);
        return -1;
    }
    strcpy(cfg->disks[cfg->ndisks++], path);
    return 0;
}

/* Split s on any of seps, calling add for every non-empty token. */
static int split_disks(struct config *cfg, const char *s,
                       char *err, size_t errlen)
{
    char buf[CONFIG_MAX_DISKS * CONFIG_PATH_MAX];
    char *save = NULL;

    if (strlen(s) >= sizeof(buf)) {
        set_err(err, errlen, "disk list too long");
        return -1;
    }
    strcpy(buf, s);
    cfg->ndisks = 0;
    for (char *t = strtok_r(buf, " \t,", &save); t;
         t = strtok_r(NULL, " \t,", &save))
        if (add_disk(cfg, t, err, errlen) < 0)
            return -1;
    return 0;
}

/* Parse "A[:P],B[:P]" (IPv4 only: no resolver in a static binary). */
static int parse_peers(struct config *cfg, const char *s,
                       char *err, size_t errlen)
{
    char buf[CONFIG_MAX_PEERS * 72];
    char *save = NULL;

    if (strlen(s) >= sizeof(buf)) {
        set_err(err, errlen, "peer list too long");
        return -1;
    }
    strcpy(buf, s);
    cfg->npeers = 0;
    for (char *t = strtok_r(buf, " \t,", &save); t;
         t = strtok_r(NULL, " \t,", &save)) {
        struct config_peer *p;
        char *colon = strchr(t, ':');
        char *slash = strchr(t, '/');
        struct in_addr in;

        if (cfg->npeers >= CONFIG_MAX_PEERS) {
            set_err(err, errlen, "too many peers (max %d)", CONFIG_MAX_PEERS);
            return -1;
        }
        p = &cfg->peers[cfg->npeers];
        memset(p, 0, sizeof(*p));
        if (slash)      /* tolerate addr/prefix as in cp.ip */
            *slash = '\0';
        if (colon) {
            uint64_t port;

            *colon = '\0';
            if (parse_u64(colon + 1, 65535, &port) < 0 || port == 0) {
                set_err(err, errlen, "bad port in peer '%s:%s'", t,
                        colon + 1);
                return -1;
            }
            p->port = (uint16_t)port;
        }
        if (strlen(t) >= sizeof(p->host) || inet_pton(AF_INET, t, &in) != 1) {
            set_err(err, errlen, "peer '%s' is not an IPv4 address", t);
            return -1;
        }
        strcpy(p->host, t);
        p->addr = in.s_addr;
        cfg->npeers++;
    }
    return 0;
}

static int set_self(struct config *cfg, const char *s,
                    char *err, size_t errlen)
{
    size_t n = strcspn(s, "/");

    if (n == 0 || n >= sizeof(cfg->self)) {
        set_err(err, errlen, "bad own address '%s'", s);
        return -1;
    }
    memcpy(cfg->self, s, n);
    cfg->self[n] = '\0';
    return 0;
}

struct flag {
    const char *name;
    bool takes_value;
};

static const struct flag flags[] = {
    {"disk", true}, {"vm", true}, {"peers", true}, {"self", true},
    {"ring-index", true}, {"port", true}, {"single", false},
    {"count", true}, {"delay-us", true}, {"progress", true},
    {"connect-timeout", true}, {"run", true}, {"buffered", false},
    {"zero", false}, {"resume", false}, {"help", false}, {"version", false},
};

static int apply(struct config *cfg, const char *name, const char *val,
                 char *err, size_t errlen)
{
    uint64_t v;

#define NUM(max) do { \
        if (parse_u64(val, (max), &v) < 0) { \
            set_err(err, errlen, "--%s: bad number '%s'", name, val); \
            return -1; \
        } \
    } while (0)

    if (strcmp(name, "disk") == 0)
        return add_disk(cfg, val, err, errlen);
    if (strcmp(name, "peers") == 0)
        return parse_peers(cfg, val, err, errlen);
    if (strcmp(name, "self") == 0)
        return set_self(cfg, val, err, errlen);
    if (strcmp(name, "vm") == 0) {
        NUM(UINT32_MAX);
        cfg->vm = (uint32_t)v;
    } else if (strcmp(name, "ring-index") == 0) {
        NUM(CONFIG_MAX_PEERS - 1);
        cfg->ring_index = (int)v;
    } else if (strcmp(name, "port") == 0) {
        NUM(65535);
        if (v == 0) {
            set_err(err, errlen, "--port: must not be 0");
            return -1;
        }
        cfg->port = (uint16_t)v;
    } else if (strcmp(name, "count") == 0) {
        NUM(UINT64_MAX);
        cfg->count = v;
    } else if (strcmp(name, "delay-us") == 0) {
        NUM(60000000);
        cfg->delay_us = (unsigned)v;
    } else if (strcmp(name, "progress") == 0) {
        NUM(86400);
        cfg->progress_s = (unsigned)v;
    } else if (strcmp(name, "connect-timeout") == 0) {
        NUM(86400);
        cfg->connect_timeout_s = (unsigned)v;
    } else if (strcmp(name, "run") == 0) {
        NUM(UINT64_MAX);
        cfg->run = v;
    } else if (strcmp(name, "single") == 0) {
        cfg->single = true;
    } else if (strcmp(name, "buffered") == 0) {
        cfg->buffered = true;
    } else if (strcmp(name, "zero") == 0) {
        cfg->zero = true;
    } else if (strcmp(name, "resume") == 0) {
        cfg->resume = true;
    } else if (strcmp(name, "help") == 0) {
        cfg->help = true;
    } else if (strcmp(name, "version") == 0) {
        cfg->version = true;
    }
#undef NUM
    return 0;
}

int config_parse_args(struct config *cfg, int argc, char **argv,
                      char *err, size_t errlen)
{
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        char name[32];
        const char *val = NULL;
        const char *eq;
        const struct flag *f = NULL;
        size_t n;

        if (strncmp(arg, "--", 2) != 0) {
            set_err(err, errlen, "unexpected argument '%s'", arg);
            return -1;
        }
        arg += 2;
        eq = strchr(arg, '=');
        n = eq ? (size_t)(eq - arg) : strlen(arg);
        if (n >= sizeof(name)) {
            set_err(err, errlen, "unknown flag '%s'", argv[i]);
            return -1;
        }
        memcpy(name, arg, n);
        name[n] = '\0';
        for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]); k++)
            if (strcmp(flags[k].name, name) == 0)
                f = &flags[k];
        if (!f) {
            set_err(err, errlen, "unknown flag '--%s'", name);
            return -1;
        }
        if (f->takes_value) {
            if (eq) {
                val = eq + 1;
            } else if (i + 1 < argc) {
                val = argv[++i];
            } else {
                set_err(err, errlen, "--%s needs a value", name);
                return -1;
            }
        } else if (eq) {
            set_err(err, errlen, "--%s takes no value", name);
            return -1;
        }
        if (apply(cfg, name, val, err, errlen) < 0)
            return -1;
    }
    return 0;
}

int config_from_env(struct config *cfg, bool with_args,
                    char *err, size_t errlen)
{
    const char *s;
    char buf[4096];
    char why[256];
    char *argv[128];
    int argc = 0;
    char *save = NULL;

    if ((s = getenv("CP_DISKS")) && *s) {
        if (split_disks(cfg, s, err, errlen) < 0)
            return -1;
        cfg->disks_from_env = true;
    }
    if ((s = getenv("CP_VM")) && *s && apply(cfg, "vm", s, err, errlen) < 0)
        return -1;
    if ((s = getenv("CP_IP")) && *s && set_self(cfg, s, err, errlen) < 0)
        return -1;
    if ((s = getenv("CP_PEERS")) && *s &&
        parse_peers(cfg, s, err, errlen) < 0)
        return -1;
    s = getenv("CP_ARGS");
    if (!with_args || !s || !*s)
        return 0;
    /* cp.args is comma-separated because the kernel command line splits
     * on spaces. */
    if (strlen(s) >= sizeof(buf)) {
        set_err(err, errlen, "CP_ARGS too long");
        return -1;
    }
    strcpy(buf, s);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (argc >= (int)(sizeof(argv) / sizeof(argv[0]))) {
            set_err(err, errlen, "CP_ARGS: too many arguments");
            return -1;
        }
        argv[argc++] = t;
    }
    if (config_parse_args(cfg, argc, argv, why, sizeof(why)) < 0) {
        set_err(err, errlen, "CP_ARGS: %s", why);
        return -1;
    }
    return 0;
}

bool config_distributed(const struct config *cfg)
{
    return !cfg->single && cfg->npeers > 1;
}

uint16_t config_peer_port(const struct config *cfg, int i)
{
    return cfg->peers[i].port ? cfg->peers[i].port : cfg->port;
}

int config_finish(struct config *cfg, char *err, size_t errlen)
{
    if (cfg->help || cfg->version)
        return 0;
    if (cfg->ndisks == 0) {
        set_err(err, errlen, "no disks: give --disk or CP_DISKS");
        return -1;
    }
    if (cfg->resume && (cfg->zero || cfg->run)) {
        set_err(err, errlen, "--resume continues the run on the disks: "
                "it takes neither --zero nor --run");
        return -1;
    }
    if (!config_distributed(cfg))
        return 0;
    if (cfg->ring_index >= 0) {
        if (cfg->ring_index >= cfg->npeers) {
            set_err(err, errlen, "--ring-index %d but only %d peers",
                    cfg->ring_index, cfg->npeers);
            return -1;
        }
        return 0;
    }
    if (cfg->self[0] == '\0') {
        set_err(err, errlen,
                "distributed mode needs --self/CP_IP or --ring-index");
        return -1;
    }
    for (int i = 0; i < cfg->npeers; i++) {
        if (strcmp(cfg->peers[i].host, cfg->self) != 0)
            continue;
        if (cfg->ring_index >= 0) {
            set_err(err, errlen, "address %s appears twice in the peers; "
                    "give --ring-index", cfg->self);
            return -1;
        }
        cfg->ring_index = i;
    }
    if (cfg->ring_index < 0) {
        set_err(err, errlen, "own address %s is not in the peers",
                cfg->self);
        return -1;
    }
    return 0;
}
