/* main.c - the aft command: look the subcommand up in a table and call it. */
#include "cli.h"
#include "shard.h"

#include <signal.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
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
    {"info", cmd_info, "print the tensors in .npy, .npz and .safetensors files"},
    {"run", cmd_run, "run an AFT layer or the bare AFT operator"},
    {"grad", cmd_grad, "the gradients of a layer or the bare operator, given dL/dY"},
    {"mask", cmd_mask, "print a local (and causal) attention mask"},
    {"compare", cmd_compare, "compare two tensors, or two files of them, with numpy's allclose rule"},
    {"convert", cmd_convert, "pack, extract and change the dtype of tensors"},
    {"model", cmd_model, "run labml's AFT language model on token ids: its logits"},
    {"generate", cmd_generate, "generate text with labml's AFT language model"},
    {"encode", cmd_encode, "text to the model's token ids, for aft model"},
    {"decode", cmd_decode, "the model's token ids back to text"},
    {"bench", cmd_bench, "time the layer over sizes and variants, or the model generating text"},
    {"train", cmd_train, "train labml's AFT language model on a text (also over mpirun's ranks)"},
};

static void usage(FILE *fp)
{
    fputs("usage: aft [--version] [--help] [--quiet] COMMAND [ARGS]\n\ncommands:\n", fp);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(fp, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fputs("\n--quiet (anywhere) silences the progress lines that long runs show on a terminal\n"
          "(the fraction done and the time left).\n"
          "AFT_KERNELS=base|avx2|avx512 runs the kernels at that level instead of the highest\n"
          "this CPU runs ('aft --version' names the one in use and the levels built in).\n"
          "'aft COMMAND --help' or 'aft help COMMAND' shows a command's options; 'man aft' has\n"
          "the details.\n", fp);
}

static const struct cmd *lookup(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

/* --quiet or -q: the one option main takes itself, before the command */
static int is_quiet(const char *arg)
{
    return strcmp(arg, "--quiet") == 0 || strcmp(arg, "-q") == 0;
}

static void on_signal(int sig)
{
    aft_out_abort_all_signal_safe();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Freed buffers stay in the process for the next ones: glibc otherwise
 * maps every buffer over 128 KiB (later: over the largest freed so far) fresh
 * from the kernel and unmaps or trims it when freed, so each call of the
 * layer (each --repeat, each aft bench measurement) faulted in and zeroed
 * its buffers anew; on this project's VM that was up to 18% of a run (AFT-full
 * at T = 1024: 1,500 page faults a call). Buffers up to 32 MiB (glibc's
 * largest setting) come from the heap, and up to 1 GiB of free heap is kept
 * instead of being given back. The peak barely moves (within 2 MiB at
 * T = 4096 and 65536): what is kept is reused by the next call. */
static void keep_freed_memory(void)
{
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

/* A signal the parent set to be ignored stays ignored: a shell starts
 * `aft run ... &` with SIGINT ignored so that Ctrl-C meant for the foreground
 * does not stop it, and `nohup aft ...` ignores SIGHUP. */
static void catch_signal(int sig)
{
    struct sigaction old;
    if (sigaction(sig, NULL, &old) == 0 && old.sa_handler == SIG_IGN) return;
    signal(sig, on_signal);
}

int main(int argc, char **argv)
{
    keep_freed_memory();
    catch_signal(SIGINT);
    catch_signal(SIGTERM);
    catch_signal(SIGHUP);
    signal(SIGPIPE, SIG_IGN);  /* a closed pipe becomes a write error we report */

    /* --quiet before the command's name; after it, the command's parser
     * takes it (a common option of every command) */
    int first = 1;
    while (first < argc && is_quiet(argv[first])) {
        cli_quiet = 1;
        first++;
    }
    argc -= first - 1;
    argv += first - 1;
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
        /* the first line alone is the version, for scripts; then what
         * this build has */
        int rc = cli_levels_choose();
        if (rc) return rc;
        cli_blas_core();
        printf("aft %s\n", AFT_VERSION);
        cli_levels_print(stdout);
        printf("mpi: %s\n", cli_shard_built_in() ? "built in" : "not built in");
        return cli_finish_stdout(NULL);
    }
    if (strcmp(name, "help") == 0) {
        int at = 2;
        while (at < argc && is_quiet(argv[at])) at++;
        if (at == argc) {
            usage(stdout);
            return cli_finish_stdout(NULL);
        }
        const struct cmd *c = lookup(argv[at]);
        if (!c) return cli_usage_error(NULL, "'%s' is not an aft command", argv[at]);
        cli_command_name = c->name;
        char *hargv[] = {argv[at], "--help", NULL};
        return c->fn(2, hargv);
    }
    const struct cmd *c = lookup(name);
    if (!c) return cli_usage_error(NULL, "'%s' is not an aft command", name);
    cli_command_name = c->name;   /* every message from here on names it */
    int rc = cli_shard_check(c->name, c->fn == cmd_run || c->fn == cmd_train);
    if (rc) return rc;
    /* the kernels' level, then OpenBLAS's core, before any product */
    rc = cli_levels_choose();
    if (rc) return rc;
    cli_blas_core();
    return c->fn(argc - 1, argv + 1);
}
