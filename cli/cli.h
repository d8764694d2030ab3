/* cli.h - what the subcommands of the aft command share. */
#ifndef AFT_CLI_H
#define AFT_CLI_H

#include "aft.h"

/* exit statuses */
enum { EXIT_DATA = 1, EXIT_USAGE = 2 };

/* each subcommand: argv[0] is the subcommand name */
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_mask(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_convert(int argc, char **argv);

/* "aft CMD: message" on stderr (CMD may be NULL for plain "aft: ") */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* usage error: message plus a hint line, returns EXIT_USAGE */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* strict number parsing: whole string, no sign for unsigned, range checked.
 * Return 0 on success, -1 otherwise. */
/* --opt VALUE or --opt=VALUE at argv[*i]: the value (and *i advanced past
 * a separate one), or NULL: not this option, or (*missing) it has no value */
const char *cli_opt_value(int argc, char **argv, int *i, const char *opt, int *missing);
int cli_parse_size(const char *s, size_t *out);
int cli_parse_u64(const char *s, uint64_t *out);
int cli_parse_double(const char *s, double *out);
/* a byte count with an optional K, M, G or T suffix (powers of 1024) */
int cli_parse_bytes(const char *s, size_t *out);

/* progress on stderr (progress.c): shown only when stderr is a terminal,
 * after about a second, and never with --quiet (cli_quiet, set by main) */
extern int cli_quiet;
void cli_progress_start(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_label(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void cli_progress_stop(void);

/* "-" is shown as "standard input" in messages and reports */
const char *cli_display_name(const char *path);
/* "aft[ CMD]: FILE: msg" (CMD may be NULL), unless msg already starts with
 * the file's name */
void cli_report_file(const char *cmd, const char *path, const char *msg);
int cli_ends_with(const char *s, const char *suffix);
int cli_path_exists(const char *path);

/* Where an operand FILE.safetensors:NAME or FILE.npz:NAME splits: the ':'
 * after the last ".safetensors" or ".npz" whose file exists, else after the
 * last one (so opening it reports the missing file); NULL when there is
 * none. With must_exist, only a split whose file exists counts. */
const char *cli_tensor_split(const char *arg, int must_exist);
/* The memory bound for reading archives: --max-memory when given (nonzero),
 * else the memory available, else no bound (SIZE_MAX) */
size_t cli_memory_limit(size_t max_memory);
/* The format of a file operand (aft_file_format): "-" is a .npy; a file
 * that cannot be opened is handed to the .npy reader, which says why.
 * Returns -1 after reporting "aft[ CMD]: FILE: not a .npy, .npz or
 * .safetensors file". */
int cli_file_format(const char *cmd, const char *path, aft_format *fmt);

/* flush and close stdout; reports a failed write and returns EXIT_DATA */
int cli_finish_stdout(const char *cmd);

#endif
