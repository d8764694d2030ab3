/* output.c - atomic output files: write a temporary beside the target, rename
 * it into place only when everything was written. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Temporaries still open, so a signal handler can remove them. A fixed table
 * keeps the handler free of locks and allocation. */
#define MAX_OPEN 16
static char *volatile open_tmps[MAX_OPEN];

static void track(char *tmp)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (!open_tmps[i]) { open_tmps[i] = tmp; return; }
}

static void untrack(const char *tmp)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (open_tmps[i] == tmp) { open_tmps[i] = NULL; return; }
}

void aft_out_abort_all_signal_safe(void)
{
    for (int i = 0; i < MAX_OPEN; i++)
        if (open_tmps[i]) unlink(open_tmps[i]);
}

aft_status aft_out_open(aft_out *o, const char *path, aft_error *err)
{
    memset(o, 0, sizeof *o);
    if (strcmp(path, "-") == 0) {
        o->fp = stdout;
        return AFT_OK;
    }
    /* a device or pipe (-o /dev/null, a FIFO) cannot be replaced by rename:
     * write it directly */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        if (S_ISDIR(sb.st_mode)) return aft_fail(err, AFT_ERR_IO, "%s: is a directory", path);
        o->fp = fopen(path, "wb");
        if (!o->fp) return aft_fail(err, AFT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        o->path = strdup(path);
        o->direct = 1;
        return AFT_OK;
    }
    size_t n = strlen(path), tn = n + 48;
    o->path = strdup(path);
    o->tmp = malloc(tn);
    if (!o->path || !o->tmp) {
        free(o->path); free(o->tmp);
        memset(o, 0, sizeof *o);
        return aft_fail(err, AFT_ERR_NOMEM, "%s: out of memory", path);
    }
    /* The temporary sits in the target's directory so rename() is atomic.
     * Its whole name is tracked before the file exists, so a signal at any
     * moment finds it (unlinking a name not yet created does nothing); with
     * mkstemp the file existed before it was tracked, and a Ctrl-C in
     * between left it behind (seen under valgrind, which widens that
     * window). The process id keeps the name apart from other processes',
     * the counter from this one's other outputs; O_EXCL never takes over a
     * file that is there already (a stale one: the next number is tried). */
    static unsigned counter;
    int fd = -1, oe = EEXIST;
    for (int tries = 0; fd < 0 && oe == EEXIST && tries < 1000; tries++) {
        unsigned c = __atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED);
        snprintf(o->tmp, tn, "%s.tmp.%ld.%u", path, (long)getpid(), c);
        track(o->tmp);
        fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);   /* 0666 less the umask */
        oe = errno;
        if (fd < 0) untrack(o->tmp);
    }
    if (fd < 0) {
        free(o->path); free(o->tmp);
        memset(o, 0, sizeof *o);
        return aft_fail(err, AFT_ERR_IO, "%s: cannot create: %s", path, strerror(oe));
    }
    o->fp = fdopen(fd, "wb");
    if (!o->fp) {
        int e = errno;
        close(fd);
        aft_out_abort(o);
        return aft_fail(err, AFT_ERR_IO, "%s: %s", path, strerror(e));
    }
    return AFT_OK;
}

aft_status aft_out_commit(aft_out *o, aft_error *err)
{
    if (o->direct) {  /* a device or pipe written in place */
        int bad = fflush(o->fp) != 0 || ferror(o->fp);
        int e = errno;
        if (fclose(o->fp) != 0 && !bad) { bad = 1; e = errno; }
        aft_status st = bad ? aft_fail(err, AFT_ERR_IO, "%s: write failed: %s", o->path, strerror(e)) : AFT_OK;
        free(o->path);
        memset(o, 0, sizeof *o);
        return st;
    }
    if (!o->tmp) {  /* standard output: flush and report a full disk or closed pipe */
        if (fflush(o->fp) != 0 || ferror(o->fp))
            return aft_fail(err, AFT_ERR_IO, "standard output: write failed: %s", strerror(errno));
        memset(o, 0, sizeof *o);
        return AFT_OK;
    }
    int bad = ferror(o->fp) != 0;
    int e = errno;
    if (fflush(o->fp) != 0) { bad = 1; e = errno; }
    if (!bad && fsync(fileno(o->fp)) != 0 && errno != EINVAL && errno != EROFS) { bad = 1; e = errno; }
    if (fclose(o->fp) != 0 && !bad) { bad = 1; e = errno; }
    o->fp = NULL;
    if (bad) {
        aft_status st = aft_fail(err, AFT_ERR_IO, "%s: write failed: %s", o->path, strerror(e));
        aft_out_abort(o);
        return st;
    }
    if (rename(o->tmp, o->path) != 0) {
        e = errno;
        aft_status st = aft_fail(err, AFT_ERR_IO, "%s: cannot rename into place: %s", o->path, strerror(e));
        aft_out_abort(o);
        return st;
    }
    untrack(o->tmp);
    free(o->tmp);
    free(o->path);
    memset(o, 0, sizeof *o);
    return AFT_OK;
}

void aft_out_abort(aft_out *o)
{
    if (o->direct) {
        fclose(o->fp);
        free(o->path);
    } else if (o->tmp) {
        if (o->fp) fclose(o->fp);
        unlink(o->tmp);
        untrack(o->tmp);
        free(o->tmp);
        free(o->path);
    }
    memset(o, 0, sizeof *o);
}
