/* levels.c - the kernel level: AFT_KERNELS chooses one, and what aft
 * --version, --timing and aft bench say of the one in use. */
#include "cli.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 when AFT_KERNELS chose the level (cli_levels_choose succeeded) */
static int chosen_by_env;

int cli_levels_choose(void)
{
    const char *want = getenv("AFT_KERNELS");
    if (!want || !*want) return 0;
    aft_error err = {{0}};
    if (aft_level_use(want, &err) != AFT_OK) {
        return cli_usage_error(NULL, "AFT_KERNELS=%s: %s", want, err.msg);
    }
    chosen_by_env = 1;
    return 0;
}

const char *cli_level_name(void)
{
    size_t n;
    return aft_levels(&n)[aft_level_in_use()].name;
}

void cli_level_why(char *buf, size_t cap)
{
    size_t n, in = aft_level_in_use();
    const aft_level *lv = aft_levels(&n);
    if (chosen_by_env) {
        snprintf(buf, cap, "chosen by AFT_KERNELS");
    } else if (n == 1) {
        snprintf(buf, cap, "the one level of this build, %s", lv[0].needs);
    } else if (in + 1 == n) {
        snprintf(buf, cap, "the highest level built in; this CPU and OS run it");
    } else {
        /* the first level above it says why the CPU stops there */
        snprintf(buf, cap, "the highest this CPU and OS run; %s: %s", lv[in + 1].name, lv[in + 1].why);
    }
}

void cli_level_json(cJSON *j)
{
    char why[160];
    cli_level_why(why, sizeof why);
    cJSON_AddStringToObject(j, "kernels", cli_level_name());
    cJSON_AddStringToObject(j, "kernels_why", why);
}

void cli_levels_print(FILE *fp)
{
    size_t n;
    const aft_level *lv = aft_levels(&n);
    char why[160];
    cli_level_why(why, sizeof why);
    fprintf(fp, "kernels: %s (%s)\nkernel levels:", cli_level_name(), why);
    for (size_t i = 0; i < n; i++) fprintf(fp, " %s", lv[i].name);
    fputs(" (this CPU and OS run", fp);
    for (size_t i = 0; i < n; i++)
        if (lv[i].runs) fprintf(fp, " %s", lv[i].name);
    fputs(")\n", fp);
}
