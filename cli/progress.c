/* progress.c - a progress line on stderr for work longer than about a second,
 * only when stderr is a terminal (never in pipes or logs), and not with
 * --quiet. A helper thread redraws the line every quarter of a second from
 * a counter (aft_progress) that the library's calls and the command's own
 * loops advance, so a single long computation shows how far it has gone:
 *
 *   aft run: full T=8192 B=1: 37% (12.3 s, about 21 s left)
 *
 * The estimate of what is left appears once the fraction says something
 * (2% done); work that counts nothing shows its elapsed time alone. */
#include "cli.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int running, stop, shown;
    char label[160];
    double start;
    size_t steps, step;      /* the work in `steps` equal steps (0: one) */
    aft_progress counter;    /* the current step's: atomic, the library adds to it */
} pg = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

int cli_quiet;

/* seconds for a reader: "2.3 s" (tenths) or "21 s", "3 min 05 s", "1 h 02 min" */
static void duration(char *buf, size_t cap, double s, int tenths)
{
    if (s < 60.0) snprintf(buf, cap, tenths ? "%.1f s" : "%.0f s", s);
    else if (s < 3600.0) snprintf(buf, cap, "%d min %02d s", (int)(s / 60.0), (int)s % 60);
    else snprintf(buf, cap, "%d h %02d min", (int)(s / 3600.0), (int)(s / 60.0) % 60);
}

/* the fraction done, from the steps and the counter; -1 when nothing is
 * counted. Called with the lock held. */
static double fraction(void)
{
    size_t total = __atomic_load_n(&pg.counter.total, __ATOMIC_RELAXED);
    size_t done = __atomic_load_n(&pg.counter.done, __ATOMIC_RELAXED);
    double f = total ? (done >= total ? 1.0 : (double)done / (double)total) : -1.0;
    if (pg.steps) f = ((double)pg.step + (f < 0.0 ? 0.0 : f)) / (double)pg.steps;
    return f > 0.99 ? 0.99 : f;   /* the line shows only while work is left */
}

/* the line for el seconds into the work, cut to the terminal's width (a
 * line that wrapped could not be drawn over) */
static void draw(double el)
{
    char line[320], spent[32], left[32];
    double f = fraction();
    duration(spent, sizeof spent, el, 1);
    if (f < 0.0) {
        snprintf(line, sizeof line, "%s (%s)", pg.label, spent);
    } else if (f < 0.02) {
        snprintf(line, sizeof line, "%s: %d%% (%s)", pg.label, (int)(100.0 * f), spent);
    } else {
        double rest = el * (1.0 - f) / f;
        duration(left, sizeof left, rest, rest < 10.0);
        snprintf(line, sizeof line, "%s: %d%% (%s, about %s left)", pg.label, (int)(100.0 * f), spent, left);
    }
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && ws.ws_col - 1u < sizeof line) {
        size_t n = ws.ws_col - 1u;
        while (n > 0 && ((unsigned char)line[n] & 0xC0) == 0x80) n--;   /* not inside a UTF-8 character */
        if (strlen(line) > n) line[n] = 0;
    }
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
}

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
        draw(el);
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
    pg.steps = pg.step = 0;
    pg.counter = (aft_progress){0, 0};
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

aft_progress *cli_progress_counter(void)
{
    return pg.running ? &pg.counter : NULL;
}

void cli_progress_steps(size_t n)
{
    if (!pg.running) return;
    pthread_mutex_lock(&pg.lock);
    pg.steps = n;
    pg.step = 0;
    pthread_mutex_unlock(&pg.lock);
}

void cli_progress_step(size_t i)
{
    if (!pg.running) return;
    pthread_mutex_lock(&pg.lock);
    pg.step = i;
    __atomic_store_n(&pg.counter.done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&pg.counter.total, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pg.lock);
}

void cli_progress_total(size_t total)
{
    if (pg.running) __atomic_store_n(&pg.counter.total, total, __ATOMIC_RELAXED);
}

void cli_progress_add(size_t n)
{
    if (pg.running) __atomic_fetch_add(&pg.counter.done, n, __ATOMIC_RELAXED);
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
