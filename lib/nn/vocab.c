/* vocab.c - a model's vocabulary, from a JSON array of strings (token id =
 * index), and text to token ids: at each point the longest entry that
 * matches (for labml's character tokenizer every entry is one character). */
#include "nn.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

void aft_vocab_free(aft_vocab *v)
{
    for (size_t i = 0; v->text && i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->key);
    memset(v, 0, sizeof *v);
}

/* a character for a message: itself when printable, and always its code point */
static void describe_char(char *out, size_t cap, const char *s, size_t n)
{
    uint32_t cp;
    size_t len = aft_utf8_char((const unsigned char *)s, n, &cp);
    if (len == 0) {
        snprintf(out, cap, "byte 0x%02X (not UTF-8)", (unsigned)(unsigned char)s[0]);
        return;
    }
    if (!aft_is_control(cp)) snprintf(out, cap, "'%.*s' (U+%04X)", (int)len, s, (unsigned)cp);
    else snprintf(out, cap, "U+%04X", (unsigned)cp);
}

aft_status aft_vocab_parse(aft_vocab *v, const char *json, const char *what, size_t n_expected, aft_error *err)
{
    memset(v, 0, sizeof *v);
    cJSON *arr = cJSON_Parse(json);
    aft_status st = AFT_OK;
    if (!arr || !cJSON_IsArray(arr)) {
        st = aft_fail(err, AFT_ERR_FORMAT, "%s is not a JSON array of strings", what);
        goto done;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr);
    if (n != n_expected) {
        st = aft_fail(err, AFT_ERR_FORMAT, "%s lists %zu %s but the model has %zu", what, n,
                      aft_noun(n, "token", "tokens"), n_expected);
        goto done;
    }
    v->key = strdup(what);
    v->text = calloc(n ? n : 1, sizeof *v->text);
    v->len = calloc(n ? n : 1, sizeof *v->len);
    if (!v->key || !v->text || !v->len) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for a vocabulary of %zu tokens", n);
        goto done;
    }
    v->n = n;
    size_t i = 0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
        if (!cJSON_IsString(it) || !it->valuestring || !it->valuestring[0]) {
            st = aft_fail(err, AFT_ERR_FORMAT, "%s: token %zu is not a non-empty string", what, i);
            goto done;
        }
        if (!(v->text[i] = strdup(it->valuestring))) {
            st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for a vocabulary of %zu tokens", n);
            goto done;
        }
        v->len[i] = strlen(v->text[i]);
        for (size_t j = 0; j < i; j++)
            if (strcmp(v->text[j], v->text[i]) == 0) {
                char d[48];
                describe_char(d, sizeof d, v->text[i], v->len[i]);
                st = aft_fail(err, AFT_ERR_FORMAT, "%s: tokens %zu and %zu are both %s%s", what, j, i, d,
                              v->len[i] > 4 ? "..." : "");
                goto done;
            }
    }
done:
    cJSON_Delete(arr);
    if (st) aft_vocab_free(v);
    return st;
}

aft_status aft_vocab_encode(const aft_vocab *v, int32_t **ids, size_t *n, const char *text, size_t len,
                            aft_error *err)
{
    *ids = NULL;
    *n = 0;
    int32_t *out = aft_alloc_array(len ? len : 1, sizeof *out);   /* at most one token a byte */
    if (!out) return aft_fail(err, AFT_ERR_NOMEM, "out of memory for the tokens of %zu bytes", len);
    size_t count = 0;
    for (size_t at = 0; at < len;) {
        size_t best = 0, best_len = 0;
        for (size_t i = 0; i < v->n; i++)
            if (v->len[i] > best_len && v->len[i] <= len - at && memcmp(text + at, v->text[i], v->len[i]) == 0) {
                best = i;
                best_len = v->len[i];
            }
        if (best_len == 0) {
            char d[48];
            describe_char(d, sizeof d, text + at, len - at);
            free(out);
            return aft_fail(err, AFT_ERR_ARG, "character %s at byte %zu is not in the model's vocabulary", d, at);
        }
        out[count++] = (int32_t)best;
        at += best_len;
    }
    *ids = out;
    *n = count;
    return AFT_OK;
}
