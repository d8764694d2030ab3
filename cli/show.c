/* show.c - a float32 tensor as text for a terminal: its shape, range and
 * mean, and its values as numpy's repr prints them with numpy's default
 * print options (precision 8, threshold 1000, edgeitems 3, linewidth 75):
 *
 *   array([[ 0.12345679, -0.5678    , ...,  1.        ]], dtype=float32)
 *
 * The layout follows numpy's arrayprint.py: every value printed shares one
 * width, found from the values shown; positional notation unless the
 * values shown span more than 1000x or reach 1e8 or go below 1e-4 (then
 * scientific); the shortest digits that give back the same float32, at most
 * 8 after the point; an array of more than 1000 values shows the first and
 * last 3 entries of each axis, with "..." between. */
#include "cli.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRECISION 8
#define THRESHOLD 1000
#define EDGEITEMS 3
#define LINEWIDTH 75

/* ---------------------------------------------------------------- a growing string (aft_strbuf) */

static void sb_spaces(aft_strbuf *b, size_t n)
{
    for (size_t i = 0; i < n; i++) aft_strbuf_add(b, " ", 1);
}

/* ---------------------------------------------------------------- one value */

/* The shortest decimal that reads back as x (a finite float32): its digits
 * (no point, no sign) and the power of ten of the first one. */
static void shortest_digits(float x, char digits[16], int *exp10)
{
    if (x == 0) {
        strcpy(digits, "0");
        *exp10 = 0;
        return;
    }
    char buf[48];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, fabs((double)x));
        if (strtof(buf, NULL) == fabsf(x) || p == 9) break;
    }
    /* buf: d.ddde[+-]XX */
    size_t n = 0;
    const char *c = buf;
    for (; *c && *c != 'e'; c++)
        if (*c != '.') digits[n++] = *c;
    while (n > 1 && digits[n - 1] == '0') n--;
    digits[n] = '\0';
    *exp10 = atoi(c + 1);
}

/* the digits d, the first at power e, in positional notation: "-12.5",
 * "0.001", "300." (or "300.0" with zero_frac: a point is followed by a digit) */
static void place(char *out, int neg, const char *d, int e, int zero_frac)
{
    int nd = (int)strlen(d);
    size_t u = 0;
    if (neg) out[u++] = '-';
    if (e < 0) {
        out[u++] = '0';
        out[u++] = '.';
        for (int i = 0; i < -e - 1; i++) out[u++] = '0';
        for (int i = 0; i < nd; i++) out[u++] = d[i];
    } else {
        for (int i = 0; i <= e; i++) out[u++] = i < nd ? d[i] : '0';
        out[u++] = '.';
        for (int i = e + 1; i < nd; i++) out[u++] = d[i];
        if (zero_frac && nd <= e + 1) out[u++] = '0';
    }
    out[u] = '\0';
}

/* x (finite, |x| < 1e17) in positional notation: the shortest digits with at
 * most PRECISION after the point (else rounded there), trailing zeros
 * dropped, the point kept ("1.", "-0.25"); out holds 64 bytes */
static void positional(float x, char *out)
{
    char d[16];
    int e;
    shortest_digits(x, d, &e);
    if ((int)strlen(d) - 1 - e > PRECISION) {
        /* the exact value rounded to PRECISION places (ties to even, as
         * numpy's Dragon4 does), trailing zeros dropped */
        snprintf(out, 64, "%.*f", PRECISION, (double)x);
        size_t n = strlen(out);
        while (out[n - 1] == '0') out[--n] = '\0';
        return;
    }
    if ((int)strlen(d) <= e + 1) {
        /* an integer (a float32 whose shortest digits are one is one): all
         * its digits are exact, as numpy's Dragon4 prints them */
        snprintf(out, 64, "%.0f.", (double)x);
        return;
    }
    place(out, signbit(x) != 0, d, e, 0);
}

/* x (finite) in scientific notation: the shortest digits, zeros up to
 * min_frac digits after the point (with a point even when there are none
 * unless no_point), and an exponent of at least 2 digits ("1.e+10",
 * "-2.5e-05"); out holds 64 bytes */
static void scientific(float x, int min_frac, int no_point, char *out)
{
    char d[16];
    int e;
    shortest_digits(x, d, &e);
    size_t u = 0;
    if (signbit(x)) out[u++] = '-';
    out[u++] = d[0];
    if (d[1] || min_frac > 0 || !no_point) out[u++] = '.';
    int frac = 0;
    for (const char *c = d + 1; *c; c++, frac++) out[u++] = *c;
    for (; frac < min_frac; frac++) out[u++] = '0';
    snprintf(out + u, 64 - u, "e%c%02d", e < 0 ? '-' : '+', abs(e));
}

/* ---------------------------------------------------------------- the common format */

typedef struct {
    int exp;          /* scientific notation */
    int pad_left;     /* characters before the point */
    int pad_right;    /* characters after it (scientific: digits, 'e', exponent) */
    int frac;         /* scientific: digits after the point */
} floatfmt;

/* numpy's FloatingFormat.fillFormat over the n values shown */
static void fill_format(floatfmt *f, const float *vals, size_t n)
{
    memset(f, 0, sizeof *f);
    float lo = INFINITY, hi = 0;
    int finite = 0, nonfinite = 0, neginf = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(vals[i])) {
            nonfinite = 1;
            neginf |= isinf(vals[i]) && vals[i] < 0;
            continue;
        }
        finite = 1;
        float a = fabsf(vals[i]);
        if (a == 0) continue;
        if (a < lo) lo = a;
        if (a > hi) hi = a;
    }
    /* as numpy compares: the bounds as doubles, the ratio in float32 */
    if (hi > 0) f->exp = (double)hi >= 1e8 || (double)lo < 1e-4 || hi / lo > 1000.0f;
    char s[64];
    for (size_t i = 0; i < n && finite; i++) {
        if (!isfinite(vals[i])) continue;
        if (f->exp) {
            scientific(vals[i], 0, 0, s);
            char *dot = strchr(s, '.'), *e = strchr(s, 'e');
            if ((int)(dot - s) > f->pad_left) f->pad_left = (int)(dot - s);
            if ((int)(e - dot - 1) > f->frac) f->frac = (int)(e - dot - 1);
        } else {
            positional(vals[i], s);
            char *dot = strchr(s, '.');
            if ((int)(dot - s) > f->pad_left) f->pad_left = (int)(dot - s);
            if ((int)strlen(dot + 1) > f->pad_right) f->pad_right = (int)strlen(dot + 1);
        }
    }
    if (f->exp) f->pad_right = 2 + 2 + f->frac;   /* exponent digits, 'e' and its sign, digits */
    /* room for nan and inf, right-aligned in the same width */
    int room = f->pad_right + 1;
    if (nonfinite && 3 - room > f->pad_left) f->pad_left = 3 - room;
    if (nonfinite && 3 + neginf - room > f->pad_left) f->pad_left = 3 + neginf - room;
}

/* one value in the common format; out holds 64 bytes (a value takes at most
 * 9 + 1 + 8 characters positional, 2 + 1 + 8 + 4 scientific) */
static void format_value(const floatfmt *f, float x, char *out)
{
    char s[64];
    int before, after = 0;   /* spaces */
    if (!isfinite(x)) {
        strcpy(s, isnan(x) ? "nan" : x < 0 ? "-inf" : "inf");
        before = f->pad_left + 1 + f->pad_right - (int)strlen(s);
    } else {
        /* scientific: every value with frac digits, the digits past its
         * shortest ones those of its exact value (numpy's min_digits) */
        if (f->exp) snprintf(s, sizeof s, "%.*e", f->frac, (double)x);
        else positional(x, s);
        if (f->exp && f->frac == 0) {   /* "1e+10" -> "1.e+10" */
            char *e = strchr(s, 'e');
            memmove(e + 1, e, strlen(e) + 1);
            *e = '.';
        }
        const char *dot = strchr(s, '.');
        before = f->pad_left - (int)(dot - s);
        if (!f->exp) after = f->pad_right - (int)strlen(dot + 1);
    }
    size_t u = 0;
    for (int i = 0; i < before; i++) out[u++] = ' ';
    for (const char *c = s; *c; c++) out[u++] = *c;
    for (int i = 0; i < after; i++) out[u++] = ' ';
    out[u] = '\0';
}

/* ---------------------------------------------------------------- the array */

typedef struct {
    const float *x;
    size_t ndim;
    const size_t *shape;
    size_t stride[AFT_MAX_DIMS];
    int summary;        /* show only the edges of long axes */
    floatfmt fmt;
} repr;

/* whether axis len is cut to its edges */
static int cut(const repr *r, size_t len)
{
    return r->summary && len > 2 * EDGEITEMS;
}

/* The values shown, in order (for the common format); *n of them. */
static float *shown_values(const repr *r, size_t *n)
{
    size_t count = 1, idx[AFT_MAX_DIMS] = {0};
    for (size_t a = 0; a < r->ndim; a++) count *= cut(r, r->shape[a]) ? 2 * EDGEITEMS : r->shape[a];
    float *v = malloc((count ? count : 1) * sizeof *v);
    if (!v) return NULL;
    for (size_t k = 0; k < count; k++) {
        size_t off = 0;
        for (size_t a = 0; a < r->ndim; a++) {
            size_t i = idx[a];
            if (cut(r, r->shape[a]) && i >= EDGEITEMS) i = r->shape[a] - 2 * EDGEITEMS + i;
            off += i * r->stride[a];
        }
        v[k] = r->x[off];
        for (size_t a = r->ndim; a-- > 0;) {
            size_t len = cut(r, r->shape[a]) ? 2 * EDGEITEMS : r->shape[a];
            if (++idx[a] < len) break;
            idx[a] = 0;
        }
    }
    *n = count;
    return v;
}

/* numpy's _extendLine: word goes on the line, or starts a new one when the
 * line would pass width (unless the line holds only its indent) */
static void extend_line(aft_strbuf *s, aft_strbuf *line, const char *word, size_t width, size_t indent)
{
    if (line->len + strlen(word) > width && line->len > indent) {
        size_t n = line->len;
        while (n > 0 && line->p[n - 1] == ' ') n--;
        aft_strbuf_add(s, line->p, n);
        aft_strbuf_add_str(s, "\n");
        line->len = 0;
        sb_spaces(line, indent);
    }
    aft_strbuf_add_str(line, word);
}

/* numpy's _formatArray recurser: the sub-array of axis at offset off, into s */
static void format_axis(const repr *r, aft_strbuf *s, size_t axis, size_t off, size_t indent, size_t width)
{
    char word[64];
    size_t len = r->shape[axis], lead = cut(r, len) ? EDGEITEMS : 0, trail = cut(r, len) ? EDGEITEMS : len;
    /* the text starts with numpy's hanging indent, replaced by '[' below */
    size_t start = s->len;
    if (axis + 1 == r->ndim) {
        aft_strbuf line = {0};
        sb_spaces(&line, indent);
        size_t elem_width = width - 1;   /* room for ',' or ']' */
        for (size_t i = 0; i < lead + trail; i++) {
            if (i == lead && cut(r, len)) {
                extend_line(s, &line, "...", elem_width, indent);
                aft_strbuf_add_str(&line, ", ");
            }
            size_t k = i < lead ? i : len - (lead + trail - i);
            format_value(&r->fmt, r->x[off + k * r->stride[axis]], word);
            extend_line(s, &line, word, elem_width, indent);
            if (i + 1 < lead + trail) aft_strbuf_add_str(&line, ", ");
        }
        if (line.p) aft_strbuf_add_str(s, line.p);
        free(line.p);
    } else {
        /* a line between rows, one more for each further axis */
        char sep[AFT_MAX_DIMS + 2] = ",";
        for (size_t a = axis + 1; a < r->ndim; a++) strcat(sep, "\n");
        for (size_t i = 0; i < lead + trail; i++) {
            if (i == lead && cut(r, len)) {
                sb_spaces(s, indent);
                aft_strbuf_add_str(s, "...");
                aft_strbuf_add_str(s, sep);
            }
            size_t k = i < lead ? i : len - (lead + trail - i);
            sb_spaces(s, indent);
            format_axis(r, s, axis + 1, off + k * r->stride[axis], indent + 1, width - 1);
            if (i + 1 < lead + trail) aft_strbuf_add_str(s, sep);
        }
    }
    /* "[" + the text without its first indent + "]" */
    if (s->oom) return;
    memmove(s->p + start + 1, s->p + start + indent, s->len - start - indent + 1);
    s->p[start] = '[';
    s->len -= indent - 1;
    aft_strbuf_add_str(s, "]");
}

/* "(2, 3)" */
static void shape_text(aft_strbuf *b, size_t ndim, const size_t *shape)
{
    char n[32];
    aft_strbuf_add_str(b, "(");
    for (size_t i = 0; i < ndim; i++) {
        snprintf(n, sizeof n, "%s%zu", i ? ", " : "", shape[i]);
        aft_strbuf_add_str(b, n);
    }
    aft_strbuf_add_str(b, ndim == 1 ? ",)" : ")");
}

char *cli_numpy_repr(const float *x, size_t ndim, const size_t *shape)
{
    aft_strbuf s = {0};
    size_t size = 1;
    for (size_t a = 0; a < ndim; a++) size *= shape[a];
    aft_strbuf_add_str(&s, "array(");
    if (size == 0 || ndim == 0) {
        /* an empty array shows its shape (a scalar is not a case here) */
        aft_strbuf_add_str(&s, "[]");
        if (!(ndim == 1 && shape[0] == 0)) {
            aft_strbuf_add_str(&s, ", shape=");
            shape_text(&s, ndim, shape);
        }
    } else {
        repr r = {.x = x, .ndim = ndim, .shape = shape, .summary = size > THRESHOLD};
        r.stride[ndim - 1] = 1;
        for (size_t a = ndim - 1; a-- > 0;) r.stride[a] = r.stride[a + 1] * shape[a + 1];
        size_t n;
        float *shown = shown_values(&r, &n);
        if (!shown) {
            free(s.p);
            return NULL;
        }
        fill_format(&r.fmt, shown, n);
        free(shown);
        /* the line width less the ',' that follows the array */
        format_axis(&r, &s, 0, 0, strlen("array(["), LINEWIDTH - 1);
    }
    aft_strbuf_add_str(&s, ",");
    /* the dtype goes on a line of its own when the last line has no room */
    static const char dtype[] = "dtype=float32)";
    const char *nl = s.p ? strrchr(s.p, '\n') : NULL;
    size_t last = s.len - (nl ? (size_t)(nl - s.p) + 1 : 0);
    if (last + strlen(dtype) + 1 > LINEWIDTH) {
        aft_strbuf_add_str(&s, "\n");
        sb_spaces(&s, strlen("array("));
    } else {
        aft_strbuf_add_str(&s, " ");
    }
    aft_strbuf_add_str(&s, dtype);
    if (s.oom) {
        free(s.p);
        return NULL;
    }
    return s.p;
}

/* ---------------------------------------------------------------- the summary */

/* a float32 as numpy prints a scalar: the shortest digits that read back,
 * positional from 1e-4 up to 1e16 ("0.5", "3.0"), else scientific ("1e+20") */
static void scalar_text(float x, char *out)
{
    if (!isfinite(x)) {
        snprintf(out, 64, "%s", isnan(x) ? "nan" : x < 0 ? "-inf" : "inf");
    } else if (x == 0 || (fabs((double)x) >= 1e-4 && fabs((double)x) < 1e16)) {
        char d[16];
        int e;
        shortest_digits(x, d, &e);
        place(out, signbit(x) != 0, d, e, 1);
    } else {
        scientific(x, 0, 1, out);
    }
}

int cli_show_tensor(FILE *fp, const aft_tensor *t)
{
    const float *x = t->data;
    float lo = INFINITY, hi = -INFINITY;
    double sum = 0;
    int nan = 0;
    for (size_t i = 0; i < t->nelem; i++) {
        nan |= isnan(x[i]);
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sum += x[i];
    }
    aft_strbuf head = {0};
    aft_strbuf_add_str(&head, "shape ");
    shape_text(&head, t->ndim, t->shape);
    aft_strbuf_add_str(&head, ", dtype float32");
    if (t->nelem) {
        /* NaN anywhere makes each of them NaN, as in numpy */
        char a[64], b[64], c[64];
        scalar_text(nan ? NAN : lo, a);
        scalar_text(nan ? NAN : hi, b);
        scalar_text(nan ? NAN : (float)(sum / (double)t->nelem), c);
        char line[256];
        snprintf(line, sizeof line, ", min %s, max %s, mean %s", a, b, c);
        aft_strbuf_add_str(&head, line);
    }
    char *body = cli_numpy_repr(x, t->ndim, t->shape);
    if (head.oom || !body) {
        free(head.p);
        free(body);
        return -1;
    }
    fprintf(fp, "%s\n%s\n", head.p, body);
    free(head.p);
    free(body);
    return 0;
}
