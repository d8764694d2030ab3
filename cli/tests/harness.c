/* harness.c - run the aft binary under test with pipes and a timeout; a
 * group's temporary directory; temp files. */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_S 60.0

static void complain(const char *what)
{
    fprintf(stderr, "harness: %s: %s\n", what, strerror(errno));
}

const char *harness_aft_bin(void)
{
    const char *s = getenv("AFT_BIN");
    return s && *s ? s : "./aft";
}

int harness_quick(void)
{
    const char *q = getenv("AFT_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

int harness_aft_is_binary(void)
{
    char magic[4] = {0};
    FILE *fp = fopen(harness_aft_bin(), "rb");
    if (!fp) return 0;
    if (fread(magic, 1, 4, fp) != 4) magic[0] = 0;
    fclose(fp);
    return memcmp(magic, "\x7f" "ELF", 4) == 0;
}

const char *harness_testdata(void)
{
    const char *s = getenv("AFT_TESTDATA");
    return s && *s ? s : "./testdata";
}

static double timeout_s(void)
{
    const char *s = getenv("AFT_TEST_TIMEOUT");
    if (s && *s) {
        char *end;
        double v = strtod(s, &end);
        if (*end == '\0' && v > 0) return v;
    }
    return DEFAULT_TIMEOUT_S;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* growable byte buffer that always keeps a NUL after the data */
typedef struct {
    char *p;
    size_t len, cap;
} buf;

static int buf_reserve(buf *b, size_t more)
{
    if (b->cap - b->len > more) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len <= more) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* read what is available on fd into b; returns 1 at EOF, 0 if more may come, -1 on error */
static int drain(int fd, buf *b)
{
    if (buf_reserve(b, 65536) != 0) {
        errno = ENOMEM;
        return -1;
    }
    ssize_t n = read(fd, b->p + b->len, b->cap - b->len - 1);
    if (n < 0) return errno == EINTR || errno == EAGAIN ? 0 : -1;
    if (n == 0) return 1;
    b->len += (size_t)n;
    b->p[b->len] = '\0';
    return 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Child side after fork: wire the pipes to 0, 1, 2 and exec. Only
 * async-signal-safe calls here. */
static void exec_child(const char *bin, const char *const *args, int in_fd,
                       int out_fd, int err_fd)
{
    /* the parent ignores SIGPIPE while it feeds stdin; an ignored signal
     * survives exec, so give the child the default back */
    signal(SIGPIPE, SIG_DFL);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(126);
    size_t n = 0;
    while (args[n]) n++;
    /* argv[0] is the binary's path, then the caller's arguments */
    char *argv[n + 2];
    argv[0] = (char *)bin;
    for (size_t i = 0; i < n; i++) argv[i + 1] = (char *)args[i];
    argv[n + 1] = NULL;
    execv(bin, argv);
    /* tell the test why: "harness: cannot exec PATH" (write is safe here) */
    static const char msg[] = "harness: cannot exec ";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    ignored = write(2, bin, strlen(bin));
    ignored = write(2, "\n", 1);
    (void)ignored;
    _exit(127);
}

int harness_run(harness_result *r, const char *const *args, const void *in,
                size_t in_len)
{
    memset(r, 0, sizeof *r);
    r->exit_code = -1;
    const char *bin = harness_aft_bin();
    int in_p[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
    buf out = {0}, err = {0};
    int rc = -1;
    pid_t pid = -1;

    /* the strings are NUL-terminated even when the child writes nothing */
    if (buf_reserve(&out, 1) != 0 || buf_reserve(&err, 1) != 0) {
        errno = ENOMEM;
        complain("allocating output buffers");
        goto done;
    }
    out.p[0] = err.p[0] = '\0';

    /* close-on-exec so the child keeps only the ends dup2 gives it */
    if (pipe2(in_p, O_CLOEXEC) != 0 || pipe2(out_p, O_CLOEXEC) != 0 ||
        pipe2(err_p, O_CLOEXEC) != 0) {
        complain("pipe");
        goto done;
    }

    /* a child that exits without reading its stdin would otherwise kill
     * the test with SIGPIPE; we want EPIPE instead */
    struct sigaction ign = {0}, old_pipe;
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe);

    fflush(NULL);  /* so buffered test output is not written twice */
    pid = fork();
    if (pid < 0) {
        complain("fork");
        sigaction(SIGPIPE, &old_pipe, NULL);
        goto done;
    }
    if (pid == 0) exec_child(bin, args, in_p[0], out_p[1], err_p[1]);

    close_fd(&in_p[0]);
    close_fd(&out_p[1]);
    close_fd(&err_p[1]);
    if (in_len == 0) close_fd(&in_p[1]);
    else fcntl(in_p[1], F_SETFL, fcntl(in_p[1], F_GETFL) | O_NONBLOCK);

    /* Feed stdin and collect stdout/stderr together, so neither side can
     * block the other on a full pipe. */
    const unsigned char *src = in;
    size_t sent = 0;
    double deadline = now_s() + timeout_s();
    int failed = 0;
    while (out_p[0] >= 0 || err_p[0] >= 0) {
        double left = deadline - now_s();
        if (left <= 0) {
            r->timed_out = 1;
            break;
        }
        struct pollfd pf[3];
        int n = 0, i_out = -1, i_err = -1, i_in = -1;
        if (out_p[0] >= 0) { pf[n] = (struct pollfd){out_p[0], POLLIN, 0}; i_out = n++; }
        if (err_p[0] >= 0) { pf[n] = (struct pollfd){err_p[0], POLLIN, 0}; i_err = n++; }
        if (in_p[1] >= 0) { pf[n] = (struct pollfd){in_p[1], POLLOUT, 0}; i_in = n++; }
        int ms = left > 1000 ? 1000 : (int)(left * 1000) + 1;
        int k = poll(pf, (nfds_t)n, ms);
        if (k < 0) {
            if (errno == EINTR) continue;
            complain("poll");
            failed = 1;
            break;
        }
        if (i_out >= 0 && pf[i_out].revents) {
            int d = drain(out_p[0], &out);
            if (d < 0) { complain("reading the child's stdout"); failed = 1; break; }
            if (d > 0) close_fd(&out_p[0]);
        }
        if (i_err >= 0 && pf[i_err].revents) {
            int d = drain(err_p[0], &err);
            if (d < 0) { complain("reading the child's stderr"); failed = 1; break; }
            if (d > 0) close_fd(&err_p[0]);
        }
        if (i_in >= 0 && pf[i_in].revents) {
            ssize_t w = write(in_p[1], src + sent, in_len - sent);
            if (w > 0) sent += (size_t)w;
            /* EPIPE: the child stopped reading; that is its business */
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == in_len)
                close_fd(&in_p[1]);
        }
    }
    close_fd(&in_p[1]);
    sigaction(SIGPIPE, &old_pipe, NULL);

    /* the pipes are closed; wait for the exit, still bounded by the deadline */
    int status = 0;
    for (;;) {
        if (r->timed_out || failed) kill(pid, SIGKILL);
        pid_t w = waitpid(pid, &status, r->timed_out || failed ? 0 : WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            complain("waitpid");
            failed = 1;
            break;
        }
        if (w == 0) {
            if (now_s() >= deadline) r->timed_out = 1;
            else {
                struct timespec ts = {0, 5 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
    }
    if (!failed) {
        if (WIFEXITED(status)) r->exit_code = WEXITSTATUS(status);
        else if (WIFSIGNALED(status)) r->term_signal = WTERMSIG(status);
        if (r->timed_out)
            fprintf(stderr, "harness: %s killed after %.0f s\n", bin, timeout_s());
        rc = 0;
    }

done:
    close_fd(&in_p[0]); close_fd(&in_p[1]);
    close_fd(&out_p[0]); close_fd(&out_p[1]);
    close_fd(&err_p[0]); close_fd(&err_p[1]);
    r->out = out.p;
    r->out_len = out.len;
    r->err = err.p;
    r->err_len = err.len;
    return rc;
}

void harness_result_free(harness_result *r)
{
    if (!r) return;
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

size_t harness_count_lines(const char *s)
{
    size_t n = 0;
    for (; s && *s; s++)
        if (*s == '\n') n++;
    return n;
}

char *harness_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *path = harness_path(base, "aft-test-XXXXXX");
    if (!path) return NULL;
    if (!mkdtemp(path)) {
        complain(path);
        free(path);
        return NULL;
    }
    return path;
}

/* the group's temporary directory (harness_setup) */
static char *group_dir;

int harness_setup(void **state)
{
    (void)state;
    group_dir = harness_mkdtemp();
    return group_dir ? 0 : -1;
}

int harness_teardown(void **state)
{
    (void)state;
    int rc = group_dir ? harness_rmtree(group_dir) : 0;
    free(group_dir);
    group_dir = NULL;
    return rc;
}

const char *harness_dir(void)
{
    return group_dir;
}

char *harness_tmp(const char *name)
{
    if (!group_dir) {
        fprintf(stderr, "harness: %s: no temporary directory (harness_setup not run)\n", name);
        return NULL;
    }
    return harness_path(group_dir, name);
}

char *harness_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        complain("vasprintf");
        return NULL;
    }
    return s;
}

int harness_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

char *harness_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) {
        complain("malloc");
        return NULL;
    }
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

int harness_write_file(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        complain(path);
        return -1;
    }
    size_t n = len ? fwrite(data, 1, len, fp) : 0;
    int bad = n != len;
    if (fclose(fp) != 0) bad = 1;
    if (bad) {
        complain(path);
        return -1;
    }
    return 0;
}

int harness_read_file(const char *path, char **data, size_t *len)
{
    *data = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        complain(path);
        return -1;
    }
    buf b = {0};
    int rc = 0;
    for (;;) {
        if (buf_reserve(&b, 65536) != 0) {
            errno = ENOMEM;
            rc = -1;
            break;
        }
        size_t n = fread(b.p + b.len, 1, b.cap - b.len - 1, fp);
        b.len += n;
        b.p[b.len] = '\0';
        if (n == 0) {
            if (ferror(fp)) rc = -1;
            break;
        }
    }
    fclose(fp);
    if (rc != 0) {
        complain(path);
        free(b.p);
        return -1;
    }
    *data = b.p;
    if (len) *len = b.len;
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int r = flag == FTW_DP ? rmdir(path) : unlink(path);
    if (r != 0) complain(path);
    return r;
}

int harness_rmtree(const char *dir)
{
    /* depth first (children before their directory), never following links */
    return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

aft_tensor harness_tensor(aft_dtype dt, const void *data, size_t ndim, const size_t *shape)
{
    aft_tensor t = {0};
    t.dtype = dt;
    t.ndim = ndim;
    t.nelem = 1;
    for (size_t i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        t.nelem *= shape[i];
    }
    t.nbytes = t.nelem * aft_dtype_size(dt);
    t.data = data;
    return t;
}
