/* main.c - the aft command: look the subcommand up in a table and call it. */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cmd {
    const char *name;
    int (*fn)(int, char **);
    const char *summary;
};

static const struct cmd commands[] = {
    {"info", cmd_info, "print the tensors in .npy and .safetensors files"},
    {"run", cmd_run, "run an AFT layer or the bare AFT operator"},
    {"mask", cmd_mask, "print a local (and causal) attention mask"},
    {"compare", cmd_compare, "compare two tensors with numpy's allclose rule"},
    {"bench", cmd_bench, "time the layer over sizes and variants"},
};

static void usage(FILE *fp)
{
    fputs("usage: aft [--version] [--help] COMMAND [ARGS]\n\ncommands:\n", fp);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(fp, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fputs("\n'aft COMMAND --help' shows a command's options; 'man aft' has the details.\n", fp);
}

static const struct cmd *lookup(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

/* OpenBLAS picks its kernel when it loads, before main. If it picked one that
 * leaves this CPU's AVX-512 unused (Debian's 0.3.21 does not know newer Xeons,
 * and some environments force an older kernel), start again with a better
 * OPENBLAS_CORETYPE. AFT_BLAS_CORETYPE=keep keeps whatever OpenBLAS chose. */
static void maybe_reexec(char **argv)
{
    const char *pref = getenv("AFT_BLAS_CORETYPE");
    if (getenv("AFT_REEXECED")) return;
    if (pref && strcmp(pref, "keep") == 0) return;
    const char *want = pref && *pref ? pref : aft_blas_better_coretype();
    if (!want) return;
    const char *have = getenv("OPENBLAS_CORETYPE");
    if (have && strcmp(have, want) == 0) return;
    if (have) setenv("AFT_OPENBLAS_CORETYPE_WAS", have, 1);
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("AFT_REEXECED", "1", 1);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the kernel we have */
    unsetenv("AFT_REEXECED");
}

static void on_signal(int sig)
{
    aft_out_abort_all_signal_safe();
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv)
{
    maybe_reexec(argv);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    signal(SIGPIPE, SIG_IGN);  /* a closed pipe becomes a write error we report */

    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        usage(stdout);
        return cli_finish_stdout(NULL);
    }
    if (strcmp(name, "--version") == 0) {
        printf("aft %s\n", AFT_VERSION);
        return cli_finish_stdout(NULL);
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            usage(stdout);
            return cli_finish_stdout(NULL);
        }
        const struct cmd *c = lookup(argv[2]);
        if (!c) {
            cli_error(NULL, "'%s' is not an aft command; see 'aft --help'", argv[2]);
            return EXIT_USAGE;
        }
        char *hargv[] = {argv[2], "--help", NULL};
        return c->fn(2, hargv);
    }
    const struct cmd *c = lookup(name);
    if (!c) {
        cli_error(NULL, "'%s' is not an aft command; see 'aft --help'", name);
        return EXIT_USAGE;
    }
    return c->fn(argc - 1, argv + 1);
}
