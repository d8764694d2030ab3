/* test_options.c - the binding interface's options string (lib/api/options.c):
 *  - aft_api_version() is AFT_API_VERSION;
 *  - every key's values as aft run takes them, and the defaults;
 *  - the refusals, each AFT_ERR_ARG and one line naming the pair: an
 *    unknown key, one the entry point does not take, a key given twice, a
 *    pair without '=', a bad value of each key; and the variant's rules
 *    (window only for local and conv, heads only for conv, local needs a
 *    window), through aft_api_layer_new too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "aft.h"
#include "api/api.h"

static void test_version(void **state)
{
    (void)state;
    assert_int_equal(aft_api_version(), AFT_API_VERSION);
    assert_int_equal(AFT_API_VERSION, 1);
}

static void test_defaults(void **state)
{
    (void)state;
    const char *empty[] = {NULL, "", "   ", "\t"};
    for (size_t i = 0; i < 4; i++) {
        api_options o;
        assert_int_equal(api_options_parse(&o, empty[i], API_LAYER_KEYS, "the layer", NULL), AFT_OK);
        assert_int_equal(o.given, 0);
        assert_int_equal(o.cfg.variant, AFT_FULL);
        assert_int_equal(o.cfg.heads, 1);
        assert_int_equal(o.cfg.threads, 0);
        assert_int_equal(o.cfg.causal, 0);
        assert_int_equal(o.cfg.impl, AFT_IMPL_FAST);
        assert_int_equal(o.tbd, 0);
        assert_string_equal(o.prefix, "");
        assert_int_equal(o.cfg.grid_h, 0);
    }
}

static void test_values(void **state)
{
    (void)state;
    api_options o;
    aft_error err;
    const char *s = "  variant=conv window=5\theads=4 causal=1 layout=tbd threads=3 impl=reference "
                    "prefix=blocks.2.attn. grid=3,7 precision=bf16 ";
    assert_int_equal(api_options_parse(&o, s, API_LAYER_KEYS, "the layer", &err), AFT_OK);
    assert_int_equal(o.cfg.variant, AFT_CONV);
    assert_int_equal(o.cfg.window, 5);
    assert_int_equal(o.cfg.heads, 4);
    assert_int_equal(o.cfg.causal, 1);
    assert_int_equal(o.tbd, 1);
    assert_int_equal(o.cfg.threads, 3);
    assert_int_equal(o.cfg.impl, AFT_IMPL_REFERENCE);
    assert_string_equal(o.prefix, "blocks.2.attn.");
    assert_int_equal(o.cfg.grid_h, 3);
    assert_int_equal(o.cfg.grid_w, 7);
    assert_int_equal(o.cfg.precision, AFT_PRECISION_BF16);
    assert_int_equal(o.given, API_LAYER_KEYS);
    assert_int_equal(api_options_check(&o, 1, &err), AFT_OK);
    /* the other spellings: causal=0, layout=btd, threads=0 (every core), window=0, an empty prefix */
    assert_int_equal(api_options_parse(&o, "variant=local causal=0 layout=btd threads=0 window=0 prefix=",
                                       API_LAYER_KEYS, "the layer", &err), AFT_OK);
    assert_int_equal(o.cfg.variant, AFT_LOCAL);
    assert_int_equal(o.cfg.window, 0);
    assert_int_equal(o.cfg.threads, 0);
    assert_int_equal(o.tbd, 0);
    assert_string_equal(o.prefix, "");
}

/* s refused with AFT_ERR_ARG and a one-line message holding want */
static void refused(const char *s, unsigned keys, const char *want)
{
    api_options o;
    aft_error err = {{0}};
    aft_status st = api_options_parse(&o, s, keys, "the layer", &err);
    if (st == AFT_OK) st = api_options_check(&o, 0, &err);
    if (st != AFT_ERR_ARG) fail_msg("'%s': status %d, not AFT_ERR_ARG", s, st);
    if (!strstr(err.msg, want)) fail_msg("'%s': '%s' lacks '%s'", s, err.msg, want);
    assert_null(strchr(err.msg, '\n'));
}

static void test_refusals(void **state)
{
    (void)state;
    refused("colour=red", API_LAYER_KEYS, "unknown option 'colour' (the layer takes variant, window, heads, causal, "
                                          "layout, threads, impl, prefix, grid, precision)");
    refused("prefix=a.", API_OP_KEYS, "unknown option 'prefix' (the layer takes variant, window");
    refused("layout=tbd", API_MODEL_KEYS, "unknown option 'layout' (the layer takes window, threads, precision)");
    refused("window=3 variant=local window=4", API_LAYER_KEYS, "option 'window' given twice");
    refused("causal", API_LAYER_KEYS, "option 'causal' is not key=value");
    refused("=1", API_LAYER_KEYS, "unknown option ''");
    refused("variant=fast", API_LAYER_KEYS, "option variant=fast: variant takes full, local, simple or conv");
    refused("variant=local window=-1", API_LAYER_KEYS, "option window=-1: window takes a whole number >= 0");
    refused("variant=local window=", API_LAYER_KEYS, "option window=: window takes a whole number >= 0");
    refused("variant=conv heads=0", API_LAYER_KEYS, "option heads=0: heads takes a whole number >= 1");
    refused("causal=yes", API_LAYER_KEYS, "option causal=yes: causal takes 0 or 1");
    refused("layout=bdt", API_LAYER_KEYS, "option layout=bdt: layout takes btd or tbd");
    refused("threads=1025", API_LAYER_KEYS, "option threads=1025: threads takes a whole number from 0 to 1024");
    refused("threads=1.5", API_LAYER_KEYS, "option threads=1.5: threads takes");
    refused("impl=slow", API_LAYER_KEYS, "option impl=slow: impl takes fast or reference");
    refused("grid=3", API_LAYER_KEYS, "option grid=3: grid takes H,W");
    refused("grid=0,4", API_LAYER_KEYS, "option grid=0,4: grid takes H,W");
    refused("variant=full window=3", API_LAYER_KEYS, "window applies to variant local and conv, not full");
    refused("variant=local window=3 heads=2", API_LAYER_KEYS, "heads applies to variant conv, not local");
    refused("variant=local", API_LAYER_KEYS, "variant local needs window=S");
    refused("variant=conv", API_LAYER_KEYS, "variant conv needs window=S (or a conv bias)");
    /* control characters are not printed as themselves */
    refused("ke\ny=1", API_LAYER_KEYS, "unknown option 'ke?y'");
    char longp[300];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    memcpy(longp, "prefix=", 7);
    refused(longp, API_LAYER_KEYS, "prefix takes at most 159 bytes");
}

/* the options reach the layer's messages as they are */
static void test_through_layer(void **state)
{
    (void)state;
    aft_api_layer *l = (aft_api_layer *)1;
    aft_error err;
    assert_int_equal(aft_api_layer_new(&l, 0, NULL, NULL, NULL, NULL, "variant=local window=2 window=2", &err),
                     AFT_ERR_ARG);
    assert_null(l);
    assert_string_equal(err.msg, "option 'window' given twice");
    assert_int_equal(aft_api_layer_new(&l, 0, NULL, NULL, NULL, NULL, "variant=local", NULL), AFT_ERR_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),  cmocka_unit_test(test_defaults),      cmocka_unit_test(test_values),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_through_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
