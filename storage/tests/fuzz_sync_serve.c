/*
 * libFuzzer target: the input is one request line of cutpoint-sync
 * --serve (sync_serve.h), parsed over a session's options as the session
 * parses it.  A request it accepts must give options the engine can run
 * with: an image, a target that differs from the base, pools, numbers in
 * range, the session's connection settings untouched; a refused one must
 * say why.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sync_engine.h"
#include "sync_fence.h"
#include "sync_serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *line = malloc(size + 1);
    struct sync_opts base, o;
    const char *bad, *id;
    json_t *req;

    if (!line)
        return 0;
    memcpy(line, data, size);
    line[size] = '\0';
    sync_opts_init(&base);
    base.src.conf = "/p.conf";
    base.dst.conf = "/d.conf";
    base.src.id = base.dst.id = "admin";
    base.src.pool = base.dst.pool = "rbd";
    base.serve = 1;
    req = sync_serve_parse(line, &base, &o, &bad, &id);
    if (req == NULL) {
        if (bad == NULL)
            abort();
    } else {
        if (bad != NULL || !o.image || !o.image[0] || !o.target ||
            !o.target[0] || !o.src.pool || !o.src.pool[0] || !o.dst.pool ||
            !o.dst.pool[0] || (o.base && strcmp(o.base, o.target) == 0) ||
            !(o.rate_mbps >= 0 && o.rate_mbps <= 1e6) ||
            o.epoch > SYNC_FENCE_MAX || o.verify_only ||
            strcmp(o.src.conf, "/p.conf") != 0 ||
            strcmp(o.dst.conf, "/d.conf") != 0 ||
            (id != NULL && (strlen(id) == 0 || strlen(id) > 64)))
            abort();
        json_decref(req);
    }
    free(line);
    return 0;
}
