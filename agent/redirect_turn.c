/* redirect_turn: see redirect.h (a step of making overlays and a stop of
 * the VM take turns). */
#include "redirect.h"

#include <pthread.h>
#include <time.h>

#include "mono.h"

/* Per VM (index in a->vms), under turn_mu: a step of redirect_make
 * running; the VM stopped (or being stopped) by the agent, until its
 * cont. */
static pthread_mutex_t turn_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char step_running[CFG_MAX_VMS], held[CFG_MAX_VMS];

static int
idx_of(const struct agent *a, const struct vm *v)
{
    return (int)(v - a->vms);
}

static void
nap_1ms(void)
{
    struct timespec ts = {0, 1000000L};

    nanosleep(&ts, NULL);
}

/* Waits until deadline for busy[idx] to clear, then sets mark[idx] in
 * the same lock: 0; -1 when it did not clear.  A step of making overlays
 * and a stop of the VM take turns this way (redirect.h). */
static int
take_turn(int idx, const unsigned char *busy, unsigned char *mark,
          double deadline)
{
    for (;;) {
        pthread_mutex_lock(&turn_mu);
        if (!busy[idx]) {
            mark[idx] = 1;
            pthread_mutex_unlock(&turn_mu);
            return 0;
        }
        pthread_mutex_unlock(&turn_mu);
        if (mono_ms() > deadline)
            return -1;
        nap_1ms();
    }
}

/* mark[idx] = 0, in the lock. */
static void
clear_mark(int idx, unsigned char *mark)
{
    pthread_mutex_lock(&turn_mu);
    mark[idx] = 0;
    pthread_mutex_unlock(&turn_mu);
}

int
redirect_step_begin(struct agent *a, const struct vm *v, double deadline)
{
    return take_turn(idx_of(a, v), held, step_running, deadline);
}

void
redirect_step_end(struct agent *a, const struct vm *v)
{
    clear_mark(idx_of(a, v), step_running);
}

int
redirect_stop_begin(struct agent *a, const struct vm *v, double deadline)
{
    return take_turn(idx_of(a, v), step_running, held, deadline);
}

void
redirect_resumed(struct agent *a, const struct vm *v)
{
    clear_mark(idx_of(a, v), held);
}
