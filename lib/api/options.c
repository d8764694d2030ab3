/* options.c - the binding interface's options string: space-separated
 * key=value pairs named as aft run's options without "--" (aft.h, "the
 * binding interface"), each checked as aft run checks its option, with a
 * one-line message naming the pair. And the helpers every entry point
 * shares. */
#include "api.h"

#include <stdio.h>
#include <string.h>

static const char *const key_names[] = {"variant", "window", "heads",  "causal", "layout",
                                        "threads", "impl",   "prefix", "grid",   "precision"};
enum { N_KEYS = sizeof key_names / sizeof key_names[0] };

int aft_api_version(void)
{
    return AFT_API_VERSION;
}

/* "variant, window, ..." of the keys in `keys` into buf */
static const char *key_list(unsigned keys, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < N_KEYS; i++)
        if (keys & (1u << i) && used < cap) {
            int n = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", key_names[i]);
            if (n > 0) used += (size_t)n;
        }
    return buf;
}

static int key_index(const char *key, size_t len)
{
    for (int i = 0; i < N_KEYS; i++)
        if (strlen(key_names[i]) == len && strncmp(key, key_names[i], len) == 0) return i;
    return -1;
}

/* the value of key i into o: 0, or the rule it breaks (for the message) */
static const char *set_value(api_options *o, int i, const char *v)
{
    aft_config *c = &o->cfg;
    size_t n;
    switch (1u << i) {
    case API_VARIANT:
        return aft_variant_from_name(v, &c->variant) ? "takes full, local, simple or conv" : NULL;
    case API_WINDOW:
        return aft_parse_size(v, &c->window) ? "takes a whole number >= 0" : NULL;
    case API_HEADS:
        return aft_parse_size(v, &c->heads) || c->heads == 0 ? "takes a whole number >= 1" : NULL;
    case API_CAUSAL:
        if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) return "takes 0 or 1";
        c->causal = v[0] == '1';
        return NULL;
    case API_LAYOUT:
        if (strcmp(v, "btd") != 0 && strcmp(v, "tbd") != 0) return "takes btd or tbd";
        o->tbd = v[0] == 't';
        return NULL;
    case API_THREADS:
        if (aft_parse_size(v, &n) || n > 1024) return "takes a whole number from 0 to 1024 (0: every core)";
        c->threads = (int)n;
        return NULL;
    case API_IMPL:
        if (strcmp(v, "fast") != 0 && strcmp(v, "reference") != 0) return "takes fast or reference";
        c->impl = v[0] == 'r' ? AFT_IMPL_REFERENCE : AFT_IMPL_FAST;
        return NULL;
    case API_PREFIX:
        if (strlen(v) >= sizeof o->prefix) return "takes at most 159 bytes";
        snprintf(o->prefix, sizeof o->prefix, "%s", v);
        return NULL;
    case API_PRECISION:
        return aft_precision_from_name(v, &c->precision) ? "takes f32 or bf16" : NULL;
    default:   /* API_GRID */
        return aft_parse_grid(v, &c->grid_h, &c->grid_w) ? "takes H,W: two whole numbers >= 1, like 14,14" : NULL;
    }
}

/* one pair, tok[0 .. len) */
static aft_status parse_pair(api_options *o, const char *tok, size_t len, unsigned keys, const char *what,
                             aft_error *err)
{
    char pair[512], shown[256], list[128];
    snprintf(pair, sizeof pair, "%.*s", (int)(len < sizeof pair ? len : sizeof pair - 1), tok);
    char *eq = strchr(pair, '=');
    int i = key_index(pair, eq ? (size_t)(eq - pair) : strlen(pair));
    if (!eq)
        return aft_fail(err, AFT_ERR_ARG, "option '%s' is not key=value", aft_shown(pair, shown, 200));
    if (i < 0 || !(keys & (1u << i))) {
        *eq = 0;
        return aft_fail(err, AFT_ERR_ARG, "unknown option '%s' (%s takes %s)", aft_shown(pair, shown, 200), what,
                        key_list(keys, list, sizeof list));
    }
    if (o->given & (1u << i)) return aft_fail(err, AFT_ERR_ARG, "option '%s' given twice", key_names[i]);
    const char *bad = set_value(o, i, eq + 1);
    if (bad) return aft_fail(err, AFT_ERR_ARG, "option %s: %s %s", aft_shown(pair, shown, 200), key_names[i], bad);
    o->given |= 1u << i;
    return AFT_OK;
}

aft_status api_options_parse(api_options *o, const char *s, unsigned keys, const char *what, aft_error *err)
{
    memset(o, 0, sizeof *o);
    o->cfg.variant = AFT_FULL;
    o->cfg.heads = 1;
    for (const char *p = s ? s : ""; *p;) {
        if (*p == ' ' || *p == '\t') {
            p++;
            continue;
        }
        size_t len = strcspn(p, " \t");
        aft_status st = parse_pair(o, p, len, keys, what, err);
        if (st) return st;
        p += len;
    }
    return AFT_OK;
}

aft_status api_options_check(const api_options *o, int have_bias, aft_error *err)
{
    aft_variant v = o->cfg.variant;
    const char *name = aft_variant_name(v);
    if (o->given & API_WINDOW && v != AFT_LOCAL && v != AFT_CONV)
        return aft_fail(err, AFT_ERR_ARG, "window applies to variant local and conv, not %s", name);
    if (o->given & API_HEADS && v != AFT_CONV)
        return aft_fail(err, AFT_ERR_ARG, "heads applies to variant conv, not %s", name);
    if (v == AFT_LOCAL && !(o->given & API_WINDOW))
        return aft_fail(err, AFT_ERR_ARG, "variant local needs window=S");
    if (v == AFT_CONV && !(o->given & API_WINDOW) && !have_bias)
        return aft_fail(err, AFT_ERR_ARG, "variant conv needs window=S (or a conv bias)");
    return AFT_OK;
}

/* ---------------------------------------------------------------- shared checks */

aft_status api_null(aft_error *err, const char *what)
{
    return aft_fail(err, AFT_ERR_ARG, "missing (NULL) %s", what);
}

aft_status api_floats(size_t B, size_t T, size_t X, size_t *n, const char *what, aft_error *err)
{
    size_t bytes;
    if (!aft_mul3_ok(B, T, X, n) || !aft_mul_ok(*n, sizeof(float), &bytes))
        return aft_fail(err, AFT_ERR_ARG, "%s of %zu x %zu x %zu floats overflows", what, B, T, X);
    return AFT_OK;
}

aft_status api_file_error(aft_status st, const char *path, aft_error *err)
{
    if (!err) return st;
    size_t n = strlen(path);
    if (strncmp(err->msg, path, n) == 0 && err->msg[n] == ':') return st;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    char shown[256];
    return aft_fail(err, st, "%s: %s", aft_shown(path, shown, 200), msg);
}
