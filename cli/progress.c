/* progress.c - a progress line on stderr for work longer than about a second,
 * only when stderr is a terminal (never in pipes or logs), and not with
 * --quiet. A helper thread redraws the line, so a single long computation
 * shows its elapsed time too. */
#include "cli.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int running, stop, shown;
    char label[160];
    double start;
} pg = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

int cli_quiet;

static void *progress_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pg.lock);
    while (!pg.stop) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 250000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&pg.wake, &pg.lock, &until);
        if (pg.stop) break;
        double el = (aft_now_ms() - pg.start) / 1000.0;
        if (el < 1.0) continue;   /* short work shows nothing */
        fprintf(stderr, "\r\033[K%s (%.1f s)", pg.label, el);
        fflush(stderr);
        pg.shown = 1;
    }
    if (pg.shown) {
        fputs("\r\033[K", stderr);   /* leave the terminal as it was */
        fflush(stderr);
    }
    pthread_mutex_unlock(&pg.lock);
    return NULL;
}

void cli_progress_start(const char *fmt, ...)
{
    if (cli_quiet || pg.running || !isatty(STDERR_FILENO)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pg.label, sizeof pg.label, fmt, ap);
    va_end(ap);
    pg.start = aft_now_ms();
    pg.stop = 0;
    pg.shown = 0;
    if (pthread_create(&pg.thread, NULL, progress_main, NULL) == 0) pg.running = 1;
}

void cli_progress_label(const char *fmt, ...)
{
    if (!pg.running) return;
    pthread_mutex_lock(&pg.lock);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pg.label, sizeof pg.label, fmt, ap);
    va_end(ap);
    pthread_mutex_unlock(&pg.lock);
}

void cli_progress_stop(void)
{
    if (!pg.running) return;
    pthread_mutex_lock(&pg.lock);
    pg.stop = 1;
    pthread_cond_signal(&pg.wake);
    pthread_mutex_unlock(&pg.lock);
    pthread_join(pg.thread, NULL);
    pg.running = 0;
}
