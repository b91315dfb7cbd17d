/* revoke: see revoke.h. */
#include "revoke.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper case, no leading zeros: the form peer_serial gives. */
static int
normalize(const char *tok, size_t len, char out[REVOKE_SERIAL_MAX])
{
    size_t o = 0;

    while (len > 1 && *tok == '0')
        tok++, len--;
    if (len == 0 || len >= REVOKE_SERIAL_MAX)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (!isxdigit((unsigned char)tok[i]))
            return -1;
        out[o++] = (char)toupper((unsigned char)tok[i]);
    }
    out[o] = '\0';
    return 0;
}

int
revoke_load(const char *path, struct revoke_list *out, char *err,
            size_t errlen)
{
    struct revoke_list l = {0};
    size_t cap = 0;
    char line[512];
    int lineno = 0;
    FILE *f;

    if (!path[0]) {
        revoke_clear(out);
        return 0;
    }
    if (!(f = fopen(path, "r"))) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof(line), f)) {
        char *p = line, *end;

        lineno++;
        while (isspace((unsigned char)*p))
            p++;
        if (!*p || *p == '#')
            continue;
        if (strncmp(p, "serial=", 7) == 0)
            p += 7;
        for (end = p; *end && !isspace((unsigned char)*end); end++)
            ;
        if (l.n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            void *nb = realloc(l.serials, ncap * sizeof(*l.serials));
            if (!nb) {
                snprintf(err, errlen, "%s: out of memory", path);
                goto fail;
            }
            l.serials = nb;
            cap = ncap;
        }
        if (normalize(p, (size_t)(end - p), l.serials[l.n]) < 0) {
            snprintf(err, errlen, "%s:%d: not a certificate serial in hex",
                     path, lineno);
            goto fail;
        }
        l.n++;
    }
    if (ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    revoke_clear(out);
    *out = l;
    return 0;
fail:
    fclose(f);
    free(l.serials);
    return -1;
}

int
revoke_has(const struct revoke_list *l, const char *serial)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->serials[i], serial) == 0)
            return 1;
    return 0;
}

void
revoke_clear(struct revoke_list *l)
{
    free(l->serials);
    l->serials = NULL;
    l->n = 0;
}
