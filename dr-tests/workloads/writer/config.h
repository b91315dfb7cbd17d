/*
 * config.h - the writer's configuration: from the tiny-guest environment
 * (CP_VM, CP_IP, CP_PEERS, CP_DISKS, CP_ARGS; see docs of the lab contract)
 * and then from command-line flags, so the same binary runs in a guest
 * against /dev/vdX and on the host against regular files.
 *
 * Precedence, later wins: environment, then flags.  The flags are argv, or
 * CP_ARGS (comma-separated) when argv is empty: the guest init passes
 * cp.args both ways, and applying it twice would list --disk twice.  A
 * --disk flag replaces the CP_DISKS list rather than adding to it.
 * No allocation: everything lives inside struct config.
 */
#ifndef CP_WRITER_CONFIG_H
#define CP_WRITER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONFIG_MAX_DISKS 16
#define CONFIG_MAX_PEERS 64
#define CONFIG_PATH_MAX 256
#define CONFIG_DEFAULT_PORT 7700

struct config_peer {
    char host[64];      /* dotted IPv4, as given */
    uint32_t addr;      /* network byte order */
    uint16_t port;      /* 0: use config.port */
};

struct config {
    char disks[CONFIG_MAX_DISKS][CONFIG_PATH_MAX];
    int ndisks;
    bool disks_from_env;        /* the next --disk starts a new list */
    uint32_t vm;                /* written into every record */
    struct config_peer peers[CONFIG_MAX_PEERS]; /* ring order */
    int npeers;
    char self[64];              /* own IPv4 (CP_IP without /prefix) */
    int ring_index;             /* position in peers; -1: find self */
    uint16_t port;              /* default ring port */
    uint64_t count;             /* stop after this global seq; 0: never */
    unsigned delay_us;          /* pause after each record (throttle) */
    unsigned progress_s;        /* seconds between progress lines; 0: off */
    unsigned connect_timeout_s; /* how long to wait for ring peers */
    uint64_t run;               /* run id; 0: derive from the clock */
    bool buffered;              /* no O_DIRECT (tmpfs cannot do it) */
    bool single;                /* single-VM mode even if peers are given */
    bool zero;                  /* zero the disks before writing */
    bool resume;                /* continue the run found on the disks */
    bool help;
    bool version;
};

/* Set the defaults. */
void config_init(struct config *cfg);

/*
 * Apply CP_* variables from the environment, and the flags in CP_ARGS if
 * with_args.  0 / -1.
 */
int config_from_env(struct config *cfg, bool with_args,
                    char *err, size_t errlen);

/* Apply flags argv[0..argc-1] (argv[0] is a flag, not the program). */
int config_parse_args(struct config *cfg, int argc, char **argv,
                      char *err, size_t errlen);

/*
 * Validate and resolve the ring position.  Returns 0, or -1 with err set.
 * Afterwards: distributed mode iff config_distributed(cfg).
 */
int config_finish(struct config *cfg, char *err, size_t errlen);

bool config_distributed(const struct config *cfg);

/* Port of peer i (its own or the default). */
uint16_t config_peer_port(const struct config *cfg, int i);

/* Usage text for --help. */
extern const char config_usage[];

#endif
