/* fakepeer: shared parts of the replay peers in the agent tests. */
#include "fakepeer.h"

#include <string.h>
#include <unistd.h>

int
fakepeer_read_line(int fd, char *buf, size_t cap)
{
    size_t n = 0;

    while (n + 1 < cap) {
        ssize_t k = read(fd, buf + n, 1);
        if (k <= 0)
            return -1;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    return 0;
}

int
fakepeer_same_execute(const json_t *got, const json_t *want)
{
    const char *g = json_string_value(json_object_get(got, "execute"));
    const char *w = json_string_value(json_object_get(want, "execute"));

    return g && w && strcmp(g, w) == 0;
}
