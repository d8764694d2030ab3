/* npy.c - NumPy .npy reader and writer.
 *
 * File layout (format versions 1.0, 2.0, 3.0):
 *   bytes 0..5   magic "\x93NUMPY"
 *   byte  6, 7   major, minor version
 *   then         header length: 2 bytes little-endian (1.0) or 4 bytes (2.0, 3.0)
 *   then         the header: a Python dict literal
 *                  {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *                padded with spaces and ending in '\n' (latin1 text for 1.0 and
 *                2.0, utf8 for 3.0)
 *   then         the array data, nelem * itemsize bytes, nothing after it.
 *
 * The file is untrusted: the header is parsed by a small strict parser (never
 * evaluated), every size is overflow-checked, and the data size is compared
 * with the bytes actually present before anything is allocated for it.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_MAX_HEADER 10000   /* numpy refuses longer headers for safety; so do we */
#define NPY_ALIGN 64           /* numpy pads so the data starts on this boundary */
#define NPY_GROWTH_DIGITS 21   /* numpy leaves room for the first axis to grow to 21 digits */

/* ---------------------------------------------------------------- dtypes */

/* numpy's kind+size spelling of each dtype we accept; the byte-order
 * character is handled separately. */
static const struct { const char *code; aft_dtype dt; } npy_types[] = {
    {"f2", AFT_F16}, {"f4", AFT_F32}, {"f8", AFT_F64}, {"b1", AFT_BOOL},
    {"u1", AFT_U8},  {"i1", AFT_I8},  {"i2", AFT_I16}, {"u2", AFT_U16},
    {"i4", AFT_I32}, {"u4", AFT_U32}, {"i8", AFT_I64}, {"u8", AFT_U64},
};
#define N_NPY_TYPES (sizeof npy_types / sizeof npy_types[0])

const char *aft_npy_code(aft_dtype dt)
{
    for (size_t i = 0; i < N_NPY_TYPES; i++)
        if (npy_types[i].dt == dt) return npy_types[i].code;
    return NULL;
}

/* Copies up to 24 bytes of untrusted text into out for an error message,
 * with anything unprintable shown as '?', so a hostile header cannot put
 * control characters or a newline into the one-line message. */
static void printable(char out[32], const unsigned char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n && i < 24; i++)
        out[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    if (n > 24) { memcpy(out + k, "...", 3); k += 3; }
    out[k] = '\0';
}

/* ---------------------------------------------------------------- header parser
 *
 * numpy reads the header with Python's ast.literal_eval (after dropping a
 * Python 2 'L' after a number in 1.0 and 2.0 headers), so any spelling of
 * the dict that Python accepts as a literal is a valid header: whitespace
 * and comments anywhere, line continuations, either quote, triple quotes,
 * u and r prefixes, escape sequences, adjacent strings joined, parentheses
 * around any value, hexadecimal, octal and binary integers with '_'
 * separators, one sign before a number, a trailing comma, a key given
 * twice (the last one counts). This is a parser for that subset of Python's
 * literals, never an evaluator: it builds a small tree (at most one node a
 * byte of header), then checks the three values numpy needs. */

/* value kinds */
enum { V_INT, V_NUM, V_STR, V_BYTES, V_TRUE, V_FALSE, V_NONE, V_NAME, V_TUPLE, V_LIST, V_SET, V_DICT };

#define NONE_IDX SIZE_MAX
#define MAX_NESTING 200   /* Python's own limit on nested brackets */

typedef struct {
    unsigned char kind;
    unsigned char neg;    /* V_INT: negative (never for 0) */
    unsigned char big;    /* V_INT: does not fit in size_t */
    size_t at;            /* header byte where the value starts */
    size_t val;           /* V_INT: magnitude; V_STR, V_BYTES, V_NAME: offset in the arena */
    size_t len;           /* V_STR, V_BYTES, V_NAME: bytes; containers: children */
    size_t first, next;   /* first child, next sibling (NONE_IDX: none) */
} hnode;

enum { K_DESCR, K_FORTRAN, K_SHAPE, K_NONE };
static const char *const key_names[] = {"descr", "fortran_order", "shape"};

typedef struct {
    const unsigned char *s;   /* the header text: hlen bytes after the length field */
    size_t pos, end;
    size_t base;              /* file offset of s[0], for messages */
    int major;                /* format version: 1.0 and 2.0 allow a Python 2 'L' */
    int key;                  /* the top-level key whose value is being read, or K_NONE */
    unsigned depth;
    hnode *nodes;
    size_t nnodes, cap;
    unsigned char *arena;     /* decoded strings; never longer than their source */
    size_t alen;
    aft_error *err;
} hparser;

typedef struct {
    size_t val[3];            /* node of each key's (last) value, or NONE_IDX */
    const unsigned char *descr;
    size_t descr_len;
    int fortran;
    size_t ndim;
    size_t shape[AFT_MAX_DIMS];
} hfields;

static int is_ident_start(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

static int is_ident(unsigned char c)
{
    return is_ident_start(c) || (c >= '0' && c <= '9');
}

/* the byte at pos + k, or -1 past the end of the header */
static int at(const hparser *P, size_t k)
{
    return P->end - P->pos > k ? P->s[P->pos + k] : -1;
}

static aft_status syntax(hparser *P, const char *what)
{
    return aft_fail(P->err, AFT_ERR_FORMAT, "bad .npy header: %s at byte %zu", what, P->base + P->pos);
}

/* " in shape" while reading the shape's value, for messages */
static const char *in_key(const hparser *P)
{
    return P->key == K_SHAPE ? " in shape" : "";
}

/* Skips what Python's tokenizer skips between tokens: spaces, tabs, form
 * feeds, line ends (the header's brackets make every line end a mere
 * break), comments up to the end of their line, and a backslash that joins
 * two lines. */
static aft_status skip_ws(hparser *P)
{
    for (;;) {
        int c = at(P, 0);
        if (c == ' ' || c == '\t' || c == '\f' || c == '\n' || c == '\r') {
            P->pos++;
        } else if (c == '#') {
            while (P->pos < P->end && P->s[P->pos] != '\n' && P->s[P->pos] != '\r') P->pos++;
        } else if (c == '\\') {
            int d = at(P, 1);
            if (d != '\n' && d != '\r') return syntax(P, "a backslash outside a string that does not end the line");
            P->pos += 2;
        } else {
            return AFT_OK;
        }
    }
}

static aft_status new_node(hparser *P, int kind, size_t start, size_t *idx)
{
    if (P->nnodes == P->cap) return syntax(P, "too many values");   /* cannot happen: a node a byte */
    hnode *n = &P->nodes[P->nnodes];
    memset(n, 0, sizeof *n);
    n->kind = (unsigned char)kind;
    n->at = start;
    n->first = n->next = NONE_IDX;
    *idx = P->nnodes++;
    return AFT_OK;
}

static void put_byte(hparser *P, unsigned char c)
{
    P->arena[P->alen++] = c;   /* room: decoded text is never longer than its source */
}

/* code point cp as UTF-8 (cp <= 0x10ffff) */
static void put_utf8(hparser *P, uint32_t cp)
{
    P->alen += aft_utf8_put(P->arena + P->alen, cp);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One escape sequence after a backslash (P->pos at the character after it)
 * in a string that is not raw, decoded as Python decodes it. */
static aft_status parse_escape(hparser *P, int bytes)
{
    int c = at(P, 0);
    static const char simple[] = "\\'\"abfnrtv", value[] = "\\'\"\a\b\f\n\r\t\v";
    const char *k = c > 0 ? strchr(simple, c) : NULL;
    if (k) {
        put_byte(P, (unsigned char)value[k - simple]);
        P->pos++;
        return AFT_OK;
    }
    if (c == '\n') { P->pos++; return AFT_OK; }   /* a line continued inside the string */
    if (c == '\r') { P->pos += at(P, 1) == '\n' ? 2 : 1; return AFT_OK; }
    if (c >= '0' && c <= '7') {
        uint32_t v = 0;
        for (int i = 0; i < 3 && at(P, 0) >= '0' && at(P, 0) <= '7'; i++) v = v * 8 + (uint32_t)(P->s[P->pos++] - '0');
        if (bytes) put_byte(P, (unsigned char)v); else put_utf8(P, v);
        return AFT_OK;
    }
    int digits = c == 'x' ? 2 : !bytes && c == 'u' ? 4 : !bytes && c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 1; i <= digits; i++) {
            int h = hexval(at(P, (size_t)i));
            if (h < 0) return syntax(P, "a truncated \\x, \\u or \\U escape");
            v = v * 16 + (uint32_t)h;
        }
        if (v > 0x10ffff) return syntax(P, "a \\U escape beyond U+10FFFF");
        P->pos += (size_t)digits + 1;
        if (bytes) put_byte(P, (unsigned char)v); else put_utf8(P, v);
        return AFT_OK;
    }
    if (!bytes && c == 'N') return syntax(P, "a \\N{...} escape (not supported)");
    /* anything else keeps its backslash, as Python does */
    put_byte(P, '\\');
    return AFT_OK;
}

/* One string literal at P->pos (its prefix already read: raw, bytes) into
 * the arena. */
static aft_status parse_string_body(hparser *P, int raw, int bytes)
{
    int q = at(P, 0);
    int triple = at(P, 1) == q && at(P, 2) == q;
    P->pos += triple ? 3 : 1;
    for (;;) {
        int c = at(P, 0);
        if (c < 0) return syntax(P, "unterminated string");
        if (c == q && (!triple || (at(P, 1) == q && at(P, 2) == q))) {
            P->pos += triple ? 3 : 1;
            return AFT_OK;
        }
        if ((c == '\n' || c == '\r') && !triple) return syntax(P, "unterminated string");
        P->pos++;
        if (c != '\\') {
            put_byte(P, (unsigned char)c);
            continue;
        }
        if (at(P, 0) < 0) return syntax(P, "unterminated string");
        if (raw) {
            /* a raw string keeps the backslash and the character after it,
             * which cannot end the string */
            put_byte(P, '\\');
            put_byte(P, P->s[P->pos++]);
            continue;
        }
        aft_status st = parse_escape(P, bytes);
        if (st) return st;
    }
}

/* A string prefix (r, u, b, br, rb, f, ... in any case) of n bytes at
 * P->pos followed by a quote: 0 no prefix, else 1 and its flags. */
static int string_prefix(const hparser *P, size_t n, int *raw, int *bytes, int *fstr)
{
    int q = at(P, n);
    if ((q != '\'' && q != '"') || n > 2) return 0;
    *raw = *bytes = *fstr = 0;
    for (size_t i = 0; i < n; i++) {
        int c = P->s[P->pos + i] | 0x20;
        if (c == 'r' && !*raw) *raw = 1;
        else if (c == 'b' && !*bytes && !*fstr) *bytes = 1;
        else if (c == 'f' && !*bytes && !*fstr) *fstr = 1;
        else if (c == 'u' && n == 1) ;
        else return 0;
    }
    return 1;
}

/* Adjacent string literals, joined: 'de' "scr" is 'descr'. */
static aft_status parse_strings(hparser *P, size_t *idx)
{
    size_t start = P->pos, off = P->alen;
    int kind = -1;
    aft_status st;
    for (;;) {
        size_t n = 0;
        while (P->pos + n < P->end && is_ident(P->s[P->pos + n])) n++;
        int raw = 0, bytes = 0, fstr = 0;
        if (n && !string_prefix(P, n, &raw, &bytes, &fstr)) break;
        if (at(P, n) != '\'' && at(P, n) != '"') break;
        if (fstr) return syntax(P, "an f-string (not a literal)");
        if (kind >= 0 && kind != (bytes ? V_BYTES : V_STR))
            return syntax(P, "bytes and text strings joined");
        kind = bytes ? V_BYTES : V_STR;
        P->pos += n;
        if ((st = parse_string_body(P, raw, bytes))) return st;
        size_t after = P->pos;
        if ((st = skip_ws(P))) return st;
        if (at(P, 0) != '\'' && at(P, 0) != '"' && !(at(P, 0) >= 0 && is_ident_start((unsigned char)at(P, 0)))) {
            P->pos = after;
            break;
        }
        if (at(P, 0) != '\'' && at(P, 0) != '"') {
            /* a name: joined only if it is a prefix of another string */
            size_t m = 0;
            while (P->pos + m < P->end && is_ident(P->s[P->pos + m])) m++;
            int r2, b2, f2;
            if (!string_prefix(P, m, &r2, &b2, &f2)) {
                P->pos = after;
                break;
            }
        }
    }
    if ((st = new_node(P, kind, start, idx))) return st;
    P->nodes[*idx].val = off;
    P->nodes[*idx].len = P->alen - off;
    return AFT_OK;
}

/* A number: Python 3's integer literals (decimal, 0x, 0o, 0b, with single
 * '_' between digits); floats and imaginary numbers become V_NUM. In 1.0
 * and 2.0 headers a following name 'L' (Python 2's long suffix) is dropped,
 * as numpy's header filter does. */
static aft_status parse_number(hparser *P, size_t *idx)
{
    size_t start = P->pos;
    aft_status st;
    if ((st = new_node(P, V_INT, start, idx))) return st;
    hnode *n = &P->nodes[*idx];
    int c = at(P, 0), x = at(P, 1) | 0x20;
    int base = c == '0' && x == 'x' ? 16 : c == '0' && x == 'o' ? 8 : c == '0' && x == 'b' ? 2 : 10;
    int is_float = 0, leading_zero = 0;
    size_t v = 0, digits = 0;
    if (base != 10) P->pos += 2;
    for (;;) {
        c = at(P, 0);
        if (c == '_' && (digits || base != 10) && hexval(at(P, 1)) >= 0 && hexval(at(P, 1)) < base) { P->pos++; continue; }
        int d = hexval(c);
        if (d < 0 || d >= base) break;
        if (!aft_mul_ok(v, (size_t)base, &v) || !aft_add_ok(v, (size_t)d, &v)) n->big = 1;
        digits++;
        P->pos++;
    }
    if (base == 10) {
        /* "007" is a leading zero only when a digit is not 0: "00" is 0 */
        leading_zero = digits > 1 && P->s[start] == '0' && v != 0;
        if (at(P, 0) == '.') {
            is_float = 1;
            P->pos++;
            while (at(P, 0) >= 0 && ((at(P, 0) >= '0' && at(P, 0) <= '9') || at(P, 0) == '_')) P->pos++;
        }
        if ((at(P, 0) | 0x20) == 'e') {
            size_t k = (at(P, 1) == '+' || at(P, 1) == '-') ? 2 : 1;
            if (at(P, k) >= '0' && at(P, k) <= '9') {
                is_float = 1;
                P->pos += k;
                while (at(P, 0) >= 0 && ((at(P, 0) >= '0' && at(P, 0) <= '9') || at(P, 0) == '_')) P->pos++;
            }
        }
        if ((at(P, 0) | 0x20) == 'j') {
            is_float = 1;
            P->pos++;
        }
    }
    if (!digits && !is_float) {
        P->pos = start;
        return syntax(P, "a number without digits");
    }
    if (is_float) {
        n->kind = V_NUM;
    } else if (leading_zero) {
        P->pos = start;
        return aft_fail(P->err, AFT_ERR_FORMAT, "%s with a leading zero%s at byte %zu",
                        P->key == K_SHAPE ? "dimension" : "number", in_key(P), P->base + start);
    }
    n->val = v;

    /* what may follow: a Python 2 'L' (1.0 and 2.0 only), else no name */
    size_t after = P->pos;
    while (at(P, 0) == ' ' || at(P, 0) == '\t' || at(P, 0) == '\f' ||
           (at(P, 0) == '\\' && (at(P, 1) == '\n' || at(P, 1) == '\r')))
        P->pos += at(P, 0) == '\\' ? 2 : 1;
    if (at(P, 0) == 'L' && !(at(P, 1) >= 0 && is_ident((unsigned char)at(P, 1)))) {
        if (P->major >= 3)
            return syntax(P, "a Python 2 long suffix 'L' (allowed in version 1.0 and 2.0 headers only)");
        P->pos++;
        return AFT_OK;
    }
    if (P->pos == after && at(P, 0) >= 0 && is_ident((unsigned char)at(P, 0))) {
        P->pos = start;
        if (P->key == K_SHAPE)
            return aft_fail(P->err, AFT_ERR_FORMAT, "non-integer dimension in shape at byte %zu", P->base + start);
        return syntax(P, "a number run into a name");
    }
    P->pos = after;
    return AFT_OK;
}

static aft_status parse_value(hparser *P, size_t *idx);

/* A sign's operand: a number, possibly in parentheses (Python's literals
 * allow one sign, on a number only: "-(2)" but not "-+2" or "-True"). */
static aft_status parse_signed(hparser *P, size_t *idx)
{
    aft_status st;
    if ((st = skip_ws(P))) return st;
    int c = at(P, 0);
    if (c == '(') {
        if (++P->depth > MAX_NESTING) return syntax(P, "brackets nested too deep");
        P->pos++;
        if ((st = parse_signed(P, idx)) || (st = skip_ws(P))) return st;
        if (at(P, 0) != ')') return syntax(P, "expected ')'");
        P->pos++;
        P->depth--;
        return AFT_OK;
    }
    if ((c >= '0' && c <= '9') || (c == '.' && at(P, 1) >= '0' && at(P, 1) <= '9')) return parse_number(P, idx);
    if (P->key == K_SHAPE) return aft_fail(P->err, AFT_ERR_FORMAT, "expected a dimension in shape at byte %zu",
                                           P->base + P->pos);
    return syntax(P, "a sign before something that is not a number");
}

/* The items of a tuple, list, set or dict after the first (whose last
 * node, linked as idx's children, is last) up to the closing bracket. */
static aft_status parse_items(hparser *P, size_t idx, size_t last, int close, int dict)
{
    aft_status st;
    for (;;) {
        if ((st = skip_ws(P))) return st;
        int c = at(P, 0);
        if (c == close) break;
        if (c != ',') {
            char what[64];
            snprintf(what, sizeof what, "expected ',' or '%c'%s", close, in_key(P));
            return syntax(P, what);
        }
        P->pos++;
        if ((st = skip_ws(P))) return st;
        if (at(P, 0) == close) break;   /* a trailing comma */
        for (int part = 0; part < (dict ? 2 : 1); part++) {
            if (part) {
                if ((st = skip_ws(P))) return st;
                if (at(P, 0) != ':') return syntax(P, "expected ':' in a dict");
                P->pos++;
            }
            size_t item;
            if ((st = parse_value(P, &item))) return st;
            P->nodes[last].next = item;
            last = item;
            P->nodes[idx].len++;
        }
    }
    P->pos++;
    return AFT_OK;
}

/* '(' ... ')': the empty tuple, a value in parentheses, or a tuple */
static aft_status parse_paren(hparser *P, size_t *idx)
{
    size_t start = P->pos++;
    aft_status st;
    if ((st = skip_ws(P))) return st;
    if (at(P, 0) == ')') {
        P->pos++;
        return new_node(P, V_TUPLE, start, idx);
    }
    size_t first;
    if ((st = parse_value(P, &first)) || (st = skip_ws(P))) return st;
    if (at(P, 0) == ')') {   /* parentheses around one value: the value */
        P->pos++;
        *idx = first;
        return AFT_OK;
    }
    if ((st = new_node(P, V_TUPLE, start, idx))) return st;
    P->nodes[*idx].first = first;
    P->nodes[*idx].len = 1;
    if (at(P, 0) != ',') {
        if (P->key == K_SHAPE) return syntax(P, "expected ',' or ')' in shape");
        return syntax(P, "expected ',' or ')'");
    }
    return parse_items(P, *idx, first, ')', 0);
}

/* '[' ... ']' or '{' ... '}' (a dict or a set) */
static aft_status parse_bracket(hparser *P, size_t *idx)
{
    size_t start = P->pos;
    int open = P->s[P->pos++], close = open == '[' ? ']' : '}';
    aft_status st;
    if ((st = new_node(P, open == '[' ? V_LIST : V_DICT, start, idx)) || (st = skip_ws(P))) return st;
    if (at(P, 0) == close) {
        P->pos++;
        return AFT_OK;
    }
    size_t first, last;
    if ((st = parse_value(P, &first)) || (st = skip_ws(P))) return st;
    P->nodes[*idx].first = last = first;
    P->nodes[*idx].len = 1;
    int dict = open == '{' && at(P, 0) == ':';
    if (dict) {
        P->pos++;
        if ((st = parse_value(P, &last))) return st;
        P->nodes[first].next = last;
        P->nodes[*idx].len = 2;
    } else if (open == '{') {
        P->nodes[*idx].kind = V_SET;
    }
    return parse_items(P, *idx, last, close, dict);
}

/* Any literal value. Names other than True, False and None become V_NAME
 * nodes: no literal, but what they were meant to be gives the message. */
static aft_status parse_value(hparser *P, size_t *idx)
{
    aft_status st;
    if ((st = skip_ws(P))) return st;
    if (P->depth >= MAX_NESTING) return syntax(P, "brackets nested too deep");
    P->depth++;
    size_t start = P->pos;
    int c = at(P, 0);
    if (c == '(') {
        st = parse_paren(P, idx);
    } else if (c == '[' || c == '{') {
        st = parse_bracket(P, idx);
    } else if (c == '\'' || c == '"') {
        st = parse_strings(P, idx);
    } else if ((c >= '0' && c <= '9') || (c == '.' && at(P, 1) >= '0' && at(P, 1) <= '9')) {
        st = parse_number(P, idx);
    } else if (c == '+' || c == '-') {
        P->pos++;
        st = parse_signed(P, idx);
        if (!st && P->nodes[*idx].kind == V_INT && c == '-' && P->nodes[*idx].val != 0) P->nodes[*idx].neg = 1;
        if (!st) P->nodes[*idx].at = start;
    } else if (c >= 0 && is_ident_start((unsigned char)c)) {
        size_t n = 0;
        while (P->pos + n < P->end && is_ident(P->s[P->pos + n])) n++;
        int raw, bytes, fstr;
        if (string_prefix(P, n, &raw, &bytes, &fstr)) {
            st = parse_strings(P, idx);
        } else {
            const unsigned char *w = P->s + P->pos;
            int kind = n == 4 && memcmp(w, "True", 4) == 0 ? V_TRUE
                     : n == 5 && memcmp(w, "False", 5) == 0 ? V_FALSE
                     : n == 4 && memcmp(w, "None", 4) == 0 ? V_NONE : V_NAME;
            st = new_node(P, kind, start, idx);
            if (!st && kind == V_NAME) {
                P->nodes[*idx].val = P->alen;
                P->nodes[*idx].len = n;
                for (size_t i = 0; i < n; i++) put_byte(P, w[i]);
            }
            P->pos += n;
        }
    } else if (c < 0 || c == ',' || c == ')' || c == ']' || c == '}' || c == ':') {
        if (P->key == K_SHAPE)
            return aft_fail(P->err, AFT_ERR_FORMAT, "expected a dimension in shape at byte %zu", P->base + P->pos);
        return syntax(P, "expected a value");
    } else {
        char what[48];
        snprintf(what, sizeof what, c >= 0x20 && c < 0x7f ? "unexpected '%c'" : "unexpected byte 0x%02x", c);
        return syntax(P, what);
    }
    P->depth--;
    return st;
}

/* The header: one dict (parentheses around it allowed) whose keys are the
 * three numpy writes; a key given twice keeps its last value. Only padding
 * may follow. */
static aft_status parse_header(hparser *P, hfields *h)
{
    aft_status st;
    unsigned parens = 0;
    for (int k = 0; k < 3; k++) h->val[k] = NONE_IDX;
    for (;;) {
        if ((st = skip_ws(P))) return st;
        if (at(P, 0) != '(') break;
        if (++parens > MAX_NESTING) return syntax(P, "brackets nested too deep");
        P->pos++;
    }
    if (at(P, 0) != '{') return syntax(P, "expected '{' (the header must be a dict)");
    P->pos++;
    for (;;) {
        if ((st = skip_ws(P))) return st;
        if (at(P, 0) == '}') { P->pos++; break; }   /* empty dict or trailing comma */
        size_t kidx, kat = P->pos;
        int c = at(P, 0);
        if (c == '(' || c == '\'' || c == '"' || (c >= 0 && is_ident_start((unsigned char)c))) {
            if ((st = parse_value(P, &kidx))) return st;
        } else {
            return syntax(P, "expected a quoted string as a key");
        }
        const hnode *kn = &P->nodes[kidx];
        if (kn->kind != V_STR) {
            P->pos = kat;
            return syntax(P, "expected a quoted string as a key");
        }
        int k = K_NONE;
        for (int i = 0; i < 3; i++)
            if (kn->len == strlen(key_names[i]) && memcmp(P->arena + kn->val, key_names[i], kn->len) == 0) k = i;
        if (k == K_NONE) {
            char shown[32];
            printable(shown, P->arena + kn->val, kn->len);
            return aft_fail(P->err, AFT_ERR_FORMAT, "unexpected key '%s' in .npy header", shown);
        }
        if ((st = skip_ws(P))) return st;
        if (at(P, 0) != ':') return syntax(P, "expected ':' after a key");
        P->pos++;
        P->key = k;
        st = parse_value(P, &h->val[k]);
        P->key = K_NONE;
        if (st || (st = skip_ws(P))) return st;
        c = at(P, 0);
        if (c == ',') { P->pos++; continue; }
        if (c == '}') { P->pos++; break; }
        return syntax(P, "expected ',' or '}' after a value");
    }
    for (; parens; parens--) {
        if ((st = skip_ws(P))) return st;
        if (at(P, 0) != ')') return syntax(P, "expected ')' after the dict (the header must be a dict)");
        P->pos++;
    }
    if ((st = skip_ws(P))) return st;
    if (P->pos != P->end) return syntax(P, "unexpected text after the dict");
    return AFT_OK;
}

/* The three values' meaning, then the names the literal cannot hold. */
static aft_status check_fields(hparser *P, hfields *h)
{
    aft_error *err = P->err;
    static const char *const missing[] = {"missing key 'descr' in .npy header",
                                          "missing key 'fortran_order' in .npy header",
                                          "missing key 'shape' in .npy header"};
    for (int k = 0; k < 3; k++)
        if (h->val[k] == NONE_IDX) return aft_fail(err, AFT_ERR_FORMAT, "%s", missing[k]);

    const hnode *d = &P->nodes[h->val[K_DESCR]];
    if (d->kind == V_LIST)
        return aft_fail(err, AFT_ERR_FORMAT, "structured dtypes are not supported (descr is a list)");
    if (d->kind != V_STR) return aft_fail(err, AFT_ERR_FORMAT, "'descr' must be a string");
    h->descr = P->arena + d->val;
    h->descr_len = d->len;

    const hnode *f = &P->nodes[h->val[K_FORTRAN]];
    if (f->kind != V_TRUE && f->kind != V_FALSE)
        return aft_fail(err, AFT_ERR_FORMAT, "'fortran_order' must be True or False");
    h->fortran = f->kind == V_TRUE;

    const hnode *s = &P->nodes[h->val[K_SHAPE]];
    if (s->kind == V_INT)
        return aft_fail(err, AFT_ERR_FORMAT, "'shape' must be a tuple (one dimension needs a trailing comma)");
    if (s->kind != V_TUPLE) return aft_fail(err, AFT_ERR_FORMAT, "'shape' must be a tuple");
    h->ndim = 0;
    for (size_t i = s->first; i != NONE_IDX; i = P->nodes[i].next) {
        const hnode *e = &P->nodes[i];
        if (h->ndim == AFT_MAX_DIMS)
            return aft_fail(err, AFT_ERR_FORMAT, "too many dimensions in shape (at most %d)", AFT_MAX_DIMS);
        if (e->kind == V_NUM || e->kind == V_NAME || e->kind == V_TRUE || e->kind == V_FALSE || e->kind == V_NONE)
            return aft_fail(err, AFT_ERR_FORMAT, "non-integer dimension in shape at byte %zu", P->base + e->at);
        if (e->kind != V_INT)
            return aft_fail(err, AFT_ERR_FORMAT, "expected a dimension in shape at byte %zu", P->base + e->at);
        if (e->neg) return aft_fail(err, AFT_ERR_FORMAT, "negative dimension in shape");
        if (e->big) return aft_fail(err, AFT_ERR_FORMAT, "dimension too large in shape");
        h->shape[h->ndim++] = e->val;
    }

    /* a name anywhere else (a value given twice, say) is no literal either */
    for (size_t i = 0; i < P->nnodes; i++)
        if (P->nodes[i].kind == V_NAME) {
            char shown[32];
            printable(shown, P->arena + P->nodes[i].val, P->nodes[i].len);
            return aft_fail(err, AFT_ERR_FORMAT, "bad .npy header: unexpected name '%s' at byte %zu", shown,
                            P->base + P->nodes[i].at);
        }
    return AFT_OK;
}

/* ---------------------------------------------------------------- dtypes numpy reads */

/* The dtype strings numpy accepts for the types we read, without the
 * byte-order character: the kind and size numpy writes ("f4"), the
 * one-character codes ("f", "?", ...; 'l' and 'L' are C long, 8 bytes on
 * every 64-bit Unix) and, without a byte order only, the names. */
static const struct { const char *s; aft_dtype dt; int name; } descr_spellings[] = {
    {"f2", AFT_F16, 0}, {"f4", AFT_F32, 0}, {"f8", AFT_F64, 0}, {"b1", AFT_BOOL, 0},
    {"u1", AFT_U8, 0},  {"i1", AFT_I8, 0},  {"i2", AFT_I16, 0}, {"u2", AFT_U16, 0},
    {"i4", AFT_I32, 0}, {"u4", AFT_U32, 0}, {"i8", AFT_I64, 0}, {"u8", AFT_U64, 0},
    {"e", AFT_F16, 0},  {"f", AFT_F32, 0},  {"d", AFT_F64, 0},  {"?", AFT_BOOL, 0},
    {"b", AFT_I8, 0},   {"B", AFT_U8, 0},   {"h", AFT_I16, 0},  {"H", AFT_U16, 0},
    {"i", AFT_I32, 0},  {"I", AFT_U32, 0},  {"l", AFT_I64, 0},  {"L", AFT_U64, 0},
    {"q", AFT_I64, 0},  {"Q", AFT_U64, 0},  {"p", AFT_I64, 0},  {"P", AFT_U64, 0},
    {"float16", AFT_F16, 1}, {"float32", AFT_F32, 1}, {"float64", AFT_F64, 1},
    {"half", AFT_F16, 1}, {"single", AFT_F32, 1}, {"double", AFT_F64, 1}, {"float", AFT_F64, 1},
    {"bool", AFT_BOOL, 1}, {"bool_", AFT_BOOL, 1},
    {"int8", AFT_I8, 1}, {"int16", AFT_I16, 1}, {"int32", AFT_I32, 1}, {"int64", AFT_I64, 1},
    {"uint8", AFT_U8, 1}, {"uint16", AFT_U16, 1}, {"uint32", AFT_U32, 1}, {"uint64", AFT_U64, 1},
    {"byte", AFT_I8, 1}, {"ubyte", AFT_U8, 1}, {"short", AFT_I16, 1}, {"ushort", AFT_U16, 1},
    {"intc", AFT_I32, 1}, {"uintc", AFT_U32, 1}, {"int", AFT_I64, 1}, {"uint", AFT_U64, 1},
    {"int_", AFT_I64, 1}, {"longlong", AFT_I64, 1}, {"ulonglong", AFT_U64, 1},
    {"intp", AFT_I64, 1}, {"uintp", AFT_U64, 1},
};
#define N_SPELLINGS (sizeof descr_spellings / sizeof descr_spellings[0])

/* Maps descr ("<f4", "|b1", "f", "float32", ...) to our dtype, whether the
 * bytes are little-endian, and the byte order as aft_npy_info reports it:
 * the character as written, except that a wider type with '|' or none is
 * '=' (numpy reads both as native, taken as little-endian like every
 * machine we run on) and a one-byte type with none is '|'. */
static aft_status parse_descr(const unsigned char *d, size_t n, aft_dtype *dt, int *little, char *order,
                              aft_error *err)
{
    char shown[32];
    printable(shown, d, n);
    if (memchr(d, 'O', n))
        return aft_fail(err, AFT_ERR_FORMAT,
                        "unsupported dtype '%s' (object arrays would need unpickling)", shown);
    char bo = n > 0 && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=') ? (char)d[0] : 0;
    const unsigned char *code = d + (bo != 0);
    size_t clen = n - (bo != 0);
    for (size_t i = 0; i < N_SPELLINGS; i++) {
        if (strlen(descr_spellings[i].s) != clen || memcmp(code, descr_spellings[i].s, clen) != 0) continue;
        if (bo && descr_spellings[i].name) break;   /* numpy: '<float32' is not understood */
        *dt = descr_spellings[i].dt;
        int one = aft_dtype_size(*dt) == 1;
        *little = bo != '>';
        *order = bo == '<' || bo == '>' || (one && bo) ? bo : one ? '|' : '=';
        return AFT_OK;
    }
    return aft_fail(err, AFT_ERR_FORMAT, "unsupported dtype '%s'", shown);
}

/* ---------------------------------------------------------------- data conversion */

/* reverses the bytes of each of n elements of size 2, 4 or 8, in place */
static void byteswap(unsigned char *p, size_t n, size_t size)
{
    for (size_t i = 0; i < n; i++, p += size) {
        if (size == 2) {
            uint16_t v; memcpy(&v, p, 2); v = __builtin_bswap16(v); memcpy(p, &v, 2);
        } else if (size == 4) {
            uint32_t v; memcpy(&v, p, 4); v = __builtin_bswap32(v); memcpy(p, &v, 4);
        } else if (size == 8) {
            uint64_t v; memcpy(&v, p, 8); v = __builtin_bswap64(v); memcpy(p, &v, 8);
        }
    }
}

/* dst: C order   src: Fortran order   both of shape dims[ndim], size-byte elements.
 * Walks dst in C order with an odometer of indices and keeps the matching
 * Fortran offset, src_off = sum_k idx[k] * fstride[k] with fstride[0] = 1 and
 * fstride[k] = fstride[k-1] * dims[k-1]. Requires nelem > 0 (so every stride
 * is at most nelem and cannot overflow). */
static void fortran_to_c(unsigned char *dst, const unsigned char *src, const size_t *dims,
                         size_t ndim, size_t size, size_t nelem)
{
    size_t fstride[AFT_MAX_DIMS], idx[AFT_MAX_DIMS] = {0};
    fstride[0] = 1;
    for (size_t k = 1; k < ndim; k++) fstride[k] = fstride[k - 1] * dims[k - 1];
    size_t last = ndim - 1, n_last = dims[last], step = fstride[last] * size;
    size_t off = 0;   /* element offset in src of dst's current row start */
    for (size_t row = 0; row < nelem / n_last; row++) {
        /* the last C index is the slowest Fortran one: a strided gather */
        const unsigned char *s = src + off * size;
        for (size_t j = 0; j < n_last; j++, s += step, dst += size) memcpy(dst, s, size);
        /* advance the other indices, last-but-one fastest */
        for (size_t k = last; k-- > 0;) {
            if (++idx[k] < dims[k]) { off += fstride[k]; break; }
            idx[k] = 0;
            off -= (dims[k] - 1) * fstride[k];
        }
    }
}

/* ---------------------------------------------------------------- reader */

/* what the preamble and header of a .npy image say */
typedef struct {
    int major, minor;
    size_t hlen, data_off;
    aft_dtype dt;
    int little;          /* the data's bytes are little-endian */
    char order;          /* aft_npy_info.byteorder */
    int fortran;
    size_t ndim, shape[AFT_MAX_DIMS], nelem, nbytes;
    char descr[16];
} npy_head;

/* The preamble of a .npy image of len bytes: magic, version (major),
 * header length (hlen, its first byte at prefix) and where the data starts
 * (data_off <= len) */
static aft_status parse_preamble(const unsigned char *buf, size_t len, int *major, size_t *prefix, size_t *hlen,
                                 size_t *data_off, aft_error *err)
{
    /* magic and version */
    if (len == 0 || memcmp(buf, NPY_MAGIC, len < NPY_MAGIC_LEN ? len : NPY_MAGIC_LEN) != 0) {
        switch (aft_format_detect(buf, len)) {
        case AFT_FORMAT_NPZ:
            return aft_fail(err, AFT_ERR_FORMAT, "not a .npy file: this is a .npz archive (a zip of .npy files)");
        case AFT_FORMAT_SAFETENSORS:
            return aft_fail(err, AFT_ERR_FORMAT, "not a .npy file: this is a .safetensors file");
        default:
            return aft_fail(err, AFT_ERR_FORMAT, "bad magic: not a .npy file");
        }
    }
    if (len < NPY_MAGIC_LEN + 2)
        return aft_fail(err, AFT_ERR_FORMAT, "file ends inside the .npy preamble (%zu %s)", len,
                        aft_noun(len, "byte", "bytes"));
    int mj = buf[6], minor = buf[7];
    if (!((mj == 1 || mj == 2 || mj == 3) && minor == 0))
        return aft_fail(err, AFT_ERR_FORMAT, "unknown .npy version %d.%d", mj, minor);

    /* header length: 2 bytes little-endian in 1.0, 4 bytes in 2.0 and 3.0 */
    size_t lenbytes = mj == 1 ? 2 : 4, pre = 8 + lenbytes;
    if (len < pre) return aft_fail(err, AFT_ERR_FORMAT, "file ends inside the .npy preamble (%zu %s)", len,
                        aft_noun(len, "byte", "bytes"));
    size_t hl = 0;
    for (size_t i = lenbytes; i-- > 0;) hl = hl << 8 | buf[8 + i];
    /* numpy's limit counts characters: the bytes of a 1.0 or 2.0 header,
     * the UTF-8 characters of a 3.0 one (counted when they are there) */
    size_t chars = hl;
    if (mj == 3 && hl > NPY_MAX_HEADER && hl <= len - pre) {
        chars = 0;
        for (size_t i = 0; i < hl; i++) chars += (buf[pre + i] & 0xc0) != 0x80;
    }
    if (chars > NPY_MAX_HEADER)
        return aft_fail(err, AFT_ERR_FORMAT, "header of %zu bytes is over the %d-byte limit", hl, NPY_MAX_HEADER);
    if (!aft_add_ok(pre, hl, data_off) || *data_off > len)
        return aft_fail(err, AFT_ERR_FORMAT,
                        "header extends past the end of the file: needs %zu bytes, file holds %zu", pre + hl, len);
    *major = mj;
    *prefix = pre;
    *hlen = hl;
    return AFT_OK;
}

/* The header's dict (hlen bytes at prefix) into h, its descr into H's dt,
 * little, order and descr. numpy pads it with spaces and ends it with '\n',
 * but reads any header Python parses as the dict literal. Then what Python
 * refuses before it parses: a NUL byte, and in 3.0 headers text that is
 * not UTF-8. */
static aft_status parse_dict(const unsigned char *buf, size_t prefix, size_t hlen, int major, hfields *h,
                             npy_head *H, aft_error *err)
{
    memset(h, 0, sizeof *h);
    hparser P = {.s = buf + prefix, .pos = 0, .end = hlen, .base = prefix, .major = major, .key = K_NONE,
                 .err = err};
    P.cap = hlen + 1;
    P.nodes = aft_alloc_array(P.cap, sizeof *P.nodes);
    P.arena = malloc(hlen + 1);
    aft_status st;
    if (!P.nodes || !P.arena) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory reading a %zu-byte header", hlen);
    } else if (!(st = parse_header(&P, h)) && !(st = check_fields(&P, h))) {
        st = parse_descr(h->descr, h->descr_len, &H->dt, &H->little, &H->order, err);
        if (!st) {
            memcpy(H->descr, h->descr, h->descr_len < sizeof H->descr ? h->descr_len : sizeof H->descr - 1);
        }
    }
    free(P.nodes);
    free(P.arena);
    if (st) return st;

    const unsigned char *nul = memchr(buf + prefix, 0, hlen);
    if (nul) return aft_fail(err, AFT_ERR_FORMAT, "bad .npy header: a NUL byte at byte %zu", (size_t)(nul - buf));
    size_t ok = major == 3 ? aft_utf8_prefix(buf + prefix, hlen) : hlen;
    if (ok != hlen)
        return aft_fail(err, AFT_ERR_FORMAT, "bad .npy header: not UTF-8 at byte %zu (version 3.0 headers are UTF-8)",
                        prefix + ok);
    return AFT_OK;
}

/* Checks a .npy image of len bytes and reads what its header says. Nothing
 * is allocated from the file's numbers: the data must be exactly the bytes
 * the header promises before anyone allocates for it. */
static aft_status parse_image(const unsigned char *buf, size_t len, int check_data, npy_head *H, aft_error *err)
{
    memset(H, 0, sizeof *H);
    int major = 0;
    size_t prefix = 0, hlen = 0, data_off = 0;
    aft_status st = parse_preamble(buf, len, &major, &prefix, &hlen, &data_off, err);
    if (st) return st;
    hfields h;
    if ((st = parse_dict(buf, prefix, hlen, major, &h, H, err))) return st;
    size_t size = aft_dtype_size(H->dt);

    /* element and byte counts. Zero dimensions make the array empty, but the
     * product of the other dimensions must still fit, so that code computing
     * strides from the shape never overflows either. */
    size_t nz = 1, nelem = 1, nbytes;
    for (size_t k = 0; k < h.ndim; k++) {
        if (h.shape[k] == 0) { nelem = 0; continue; }
        if (!aft_mul_ok(nz, h.shape[k], &nz))
            return aft_fail(err, AFT_ERR_FORMAT, "array too large: element count overflows");
    }
    if (nelem) nelem = nz;
    if (!aft_mul_ok(nz, size, &nbytes)) return aft_fail(err, AFT_ERR_FORMAT, "array too large: byte count overflows");
    nbytes = nelem * size;   /* <= nz * size, checked above */

    /* the data must be exactly what the header promises; checked before any
     * allocation, so a tiny file claiming a huge shape costs nothing */
    size_t have = len - data_off;
    if (check_data && have < nbytes)
        return aft_fail(err, AFT_ERR_FORMAT, "data truncated: header promises %zu %s, file holds %zu", nbytes,
                        aft_noun(nbytes, "byte", "bytes"), have);
    if (check_data && have > nbytes)
        return aft_fail(err, AFT_ERR_FORMAT, "%zu trailing %s after the data", have - nbytes,
                        aft_noun(have - nbytes, "byte", "bytes"));

    H->major = major;
    H->minor = buf[7];
    H->hlen = hlen;
    H->data_off = data_off;
    H->fortran = h.fortran;
    H->ndim = h.ndim;
    memcpy(H->shape, h.shape, h.ndim * sizeof h.shape[0]);
    H->nelem = nelem;
    H->nbytes = nbytes;
    return AFT_OK;
}

static void fill_info(const npy_head *H, aft_npy_info *info)
{
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->major = H->major;
    info->minor = H->minor;
    info->byteorder = H->order;
    info->fortran_order = H->fortran;
    memcpy(info->descr, H->descr, sizeof info->descr);
    info->header_len = H->hlen;
    info->data_offset = H->data_off;
}

/* the data needs a copy to be native C order: a byte swap or a transpose */
static int needs_conversion(const npy_head *H)
{
    return (aft_dtype_size(H->dt) > 1 && H->little != AFT_HOST_LITTLE) || (H->fortran && H->ndim >= 2 && H->nelem > 0);
}

static void set_tensor(aft_tensor *out, const npy_head *H, const void *data, void *owned)
{
    out->dtype = H->dt;
    out->ndim = H->ndim;
    memcpy(out->shape, H->shape, H->ndim * sizeof H->shape[0]);
    out->nelem = H->nelem;
    out->nbytes = H->nbytes;
    out->data = data;
    out->owned = owned;
}

/* Parses a .npy image of len bytes. When own is non-NULL it is the malloc'd
 * block holding buf, and the result may reuse it (the data is moved to its
 * start), which keeps a file's peak memory near its size; own is consumed
 * either way. When own is NULL, buf is copied, unless view is set and the
 * data is already native C order: the tensor then borrows buf. */
static aft_status decode(const unsigned char *buf, size_t len, unsigned char *own, int view,
                         aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    memset(out, 0, sizeof *out);
    if (info) memset(info, 0, sizeof *info);
    npy_head H;
    aft_status st = parse_image(buf, len, 1, &H, err);
    if (st) {
        free(own);
        return st;
    }
    size_t size = aft_dtype_size(H.dt), nbytes = H.nbytes, data_off = H.data_off;
    if (view && !own && !needs_conversion(&H)) {
        set_tensor(out, &H, buf + data_off, NULL);
        fill_info(&H, info);
        return AFT_OK;
    }

    /* Fortran order only differs from C order with two or more dimensions */
    int transpose = H.fortran && H.ndim >= 2 && H.nelem > 0;
    unsigned char *data;
    if (transpose) {
        data = aft_alloc_array(nbytes, 1);
        if (!data) goto nomem;
        fortran_to_c(data, buf + data_off, H.shape, H.ndim, size, H.nelem);
        free(own);
        own = NULL;
    } else if (own) {
        /* reuse the file buffer: move the data to its start, return the rest */
        memmove(own, own + data_off, nbytes);
        data = realloc(own, nbytes ? nbytes : 1);
        if (!data) data = own;   /* shrinking failed: keep the larger block */
        own = NULL;
    } else {
        data = aft_alloc_array(nbytes, 1);
        if (!data) goto nomem;
        memcpy(data, buf + data_off, nbytes);
    }
    if (size > 1 && H.little != AFT_HOST_LITTLE) byteswap(data, H.nelem, size);
    set_tensor(out, &H, data, data);
    fill_info(&H, info);
    return AFT_OK;

nomem:
    free(own);
    return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu bytes of array data", nbytes);
}

aft_status aft_npy_read_mem(const void *buf, size_t len, aft_tensor *out, aft_npy_info *info,
                            aft_error *err)
{
    if (!buf && len) {
        memset(out, 0, sizeof *out);
        return aft_fail(err, AFT_ERR_ARG, "NULL buffer");
    }
    static const unsigned char empty[1];
    return decode(buf ? buf : empty, len, NULL, 0, out, info, err);
}

aft_status aft_npy_view_mem(const void *buf, size_t len, aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    static const unsigned char empty[1];
    return decode(buf && len ? buf : empty, len, NULL, 1, out, info, err);
}

aft_status aft_npy_read_owned(void *buf, size_t len, aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    return decode(buf, len, buf, 0, out, info, err);
}

aft_status aft_npy_view_size(const void *buf, size_t len, size_t *copy_bytes, aft_error *err)
{
    npy_head H;
    static const unsigned char empty[1];
    aft_status st = parse_image(buf && len ? buf : empty, len, 1, &H, err);
    if (st) return st;
    *copy_bytes = needs_conversion(&H) ? H.nbytes : 0;
    return AFT_OK;
}

/* Reads fp to its end into a malloc'd block. hint is the expected size (the
 * file size for a regular file, 0 when unknown); one spare byte lets the read
 * that sees end-of-file happen without growing the block. */
static aft_status read_all(FILE *fp, size_t hint, unsigned char **out, size_t *outlen,
                           aft_error *err)
{
    size_t cap = hint ? hint : 65536, len = 0;
    if (!aft_add_ok(cap, 1, &cap)) cap = SIZE_MAX;
    unsigned char *buf = malloc(cap);
    if (!buf) return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading %zu bytes", cap);
    for (;;) {
        if (len == cap) {
            size_t ncap;
            if (!aft_mul_ok(cap, 2, &ncap)) {
                free(buf);
                return aft_fail(err, AFT_ERR_NOMEM, "input too large");
            }
            unsigned char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading %zu bytes", ncap);
            }
            buf = nb;
            cap = ncap;
        }
        size_t n = fread(buf + len, 1, cap - len, fp);
        len += n;
        if (len < cap) {   /* a short fread: end of file or an error */
            if (ferror(fp)) {
                int e = errno;
                free(buf);
                return aft_fail(err, AFT_ERR_IO, "read failed: %s", strerror(e));
            }
            if (feof(fp)) break;
        }
    }
    *out = buf;
    *outlen = len;
    return AFT_OK;
}

aft_status aft_npy_read(const char *path, aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    memset(out, 0, sizeof *out);
    if (info) memset(info, 0, sizeof *info);
    int is_stdin = strcmp(path, "-") == 0;
    FILE *fp = is_stdin ? stdin : fopen(path, "rb");
    if (!fp) return aft_fail(err, AFT_ERR_IO, "cannot open: %s", strerror(errno));

    /* the file size, when there is one, sizes the buffer in one allocation */
    size_t hint = 0;
    struct stat sb;
    if (fstat(fileno(fp), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 &&
        (uintmax_t)sb.st_size < SIZE_MAX)
        hint = (size_t)sb.st_size;

    unsigned char *buf = NULL;
    size_t len = 0;
    aft_status st = read_all(fp, hint, &buf, &len, err);
    if (!is_stdin) fclose(fp);
    if (st) return st;
    return decode(buf, len, buf, 0, out, info, err);
}

/* aft_npy_peek, the data's size checked against the file's when
 * check_data; the parsed header into *Hout when not NULL */
static aft_status peek(const char *path, int check_data, aft_tensor *out, aft_npy_info *info, npy_head *Hout,
                       aft_error *err)
{
    memset(out, 0, sizeof *out);
    if (info) memset(info, 0, sizeof *info);
    FILE *fp = fopen(path, "rb");
    if (!fp) return aft_fail(err, AFT_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(fp);
        return aft_fail(err, AFT_ERR_ARG, "not a regular file");
    }
    /* the preamble, then the header: at most 4 bytes a character of numpy's
     * 10000 (a 3.0 header is UTF-8), never more than the file holds */
    size_t fsize = (uintmax_t)sb.st_size < SIZE_MAX ? (size_t)sb.st_size : SIZE_MAX;
    size_t want = 12 + 4 * NPY_MAX_HEADER, len = want < fsize ? want : fsize;
    unsigned char *buf = malloc(len ? len : 1);
    aft_status st;
    if (!buf) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory reading a header");
    } else if (fread(buf, 1, len, fp) != len) {
        st = aft_fail(err, AFT_ERR_IO, "read failed: %s", ferror(fp) ? strerror(errno) : "file shrank");
    } else {
        npy_head H;
        size_t cut = len;
        if (len >= 12 && memcmp(buf, NPY_MAGIC, NPY_MAGIC_LEN) == 0 && buf[6] >= 1 && buf[6] <= 3) {
            /* hand the parser the preamble and header only, and check the
             * data's size against the file's */
            size_t lb = buf[6] == 1 ? 2 : 4, hl = 0;
            for (size_t i = lb; i-- > 0;) hl = hl << 8 | buf[8 + i];
            if (8 + lb + hl <= len) cut = 8 + lb + hl;
        }
        st = parse_image(buf, cut, check_data && cut == len && len < want, &H, err);
        if (!st && !check_data && H.data_off > fsize)
            st = aft_fail(err, AFT_ERR_FORMAT, "header extends past the end of the file");
        if (!st && check_data && cut != len) {
            size_t have = fsize - H.data_off;
            if (have < H.nbytes)
                st = aft_fail(err, AFT_ERR_FORMAT, "data truncated: header promises %zu %s, file holds %zu",
                              H.nbytes, aft_noun(H.nbytes, "byte", "bytes"), have);
            else if (have > H.nbytes)
                st = aft_fail(err, AFT_ERR_FORMAT, "%zu trailing %s after the data", have - H.nbytes,
                              aft_noun(have - H.nbytes, "byte", "bytes"));
        }
        if (!st) {
            set_tensor(out, &H, NULL, NULL);
            fill_info(&H, info);
            if (Hout) *Hout = H;
        }
    }
    free(buf);
    fclose(fp);
    return st;
}

aft_status aft_npy_peek(const char *path, aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    return peek(path, 1, out, info, NULL, err);
}

aft_status aft_npy_peek_header(const char *path, aft_tensor *out, aft_npy_info *info, aft_error *err)
{
    return peek(path, 0, out, info, NULL, err);
}

/* elements converted a block at a time: the raw bytes of one block and its
 * float32 values are all a call holds */
enum { RANGE_BLOCK = 1 << 18 };

aft_status aft_npy_read_f32(const char *path, size_t first, size_t n, float *dst, aft_error *err)
{
    aft_tensor hdr;
    npy_head H;
    aft_status st = peek(path, 0, &hdr, NULL, &H, err);
    if (st) return st;
    size_t end;
    if (!aft_add_ok(first, n, &end) || end > H.nelem)
        return aft_fail(err, AFT_ERR_ARG, "elements [%zu, %zu) are past the array's %zu", first, first + n, H.nelem);
    if (H.fortran && H.ndim >= 2 && H.nelem > 0 && n)
        return aft_fail(err, AFT_ERR_ARG, "the array is stored in Fortran order: its rows are not contiguous");
    if (n == 0) return AFT_OK;
    size_t size = aft_dtype_size(H.dt);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return aft_fail(err, AFT_ERR_IO, "cannot open: %s", strerror(errno));
    unsigned char *raw = aft_alloc_array(RANGE_BLOCK, size);
    if (!raw) {
        close(fd);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory reading %zu elements", n);
    }
    for (size_t i = 0; i < n && !st;) {
        size_t m = n - i < RANGE_BLOCK ? n - i : RANGE_BLOCK, want = m * size, got = 0;
        off_t at = (off_t)(H.data_off + (first + i) * size);
        while (got < want) {
            ssize_t r = pread(fd, raw + got, want - got, at + (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                st = aft_fail(err, AFT_ERR_IO, "read failed: %s", strerror(errno));
                break;
            }
            if (r == 0) {
                st = aft_fail(err, AFT_ERR_FORMAT, "data truncated: element %zu of %zu is past the end of the file "
                              "(header promises %zu %s, file holds %zu)", first + i + got / size, H.nelem,
                              H.nbytes, aft_noun(H.nbytes, "byte", "bytes"), (size_t)at + got - H.data_off);
                break;
            }
            got += (size_t)r;
        }
        if (st) break;
        if (size > 1 && H.little != AFT_HOST_LITTLE) byteswap(raw, m, size);
        aft_tensor t = {.dtype = H.dt, .ndim = 1, .nelem = m, .nbytes = want, .data = raw};
        t.shape[0] = m;
        if (H.dt == AFT_F32) {
            memcpy(dst + i, raw, want);
        } else {
            float *f;
            if ((st = aft_tensor_to_f32(&t, &f, err))) break;
            memcpy(dst + i, f, m * sizeof(float));
            free(f);
        }
        i += m;
    }
    free(raw);
    close(fd);
    return st;
}

/* ---------------------------------------------------------------- writer */

/* Builds numpy's version 1.0 header for t (2.0 if it would not fit in a
 * 2-byte length) into buf, preamble included: numpy's exact text
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * then the spaces numpy reserves for the first axis to grow, then spaces and
 * a final '\n' so that the data starts on a 64-byte boundary. Returns the
 * total length, or 0 if buf is too small (4096 bytes always suffice: at most
 * 32 dims). */
static size_t build_header(char *buf, size_t cap, const char *code, const aft_tensor *t)
{
    char dict[1024];
    size_t n = 0;
    /* every snprintf below writes well under the 1024 bytes: at most 32 dims
     * (checked by the caller) of at most 20 digits each, plus the fixed text */
    n += (size_t)snprintf(dict + n, sizeof dict - n,
                          "{'descr': '%c%s', 'fortran_order': False, 'shape': (",
                          aft_dtype_size(t->dtype) == 1 ? '|' : '<', code);
    for (size_t k = 0; k < t->ndim; k++)
        n += (size_t)snprintf(dict + n, sizeof dict - n, k ? ", %zu" : "%zu", t->shape[k]);
    n += (size_t)snprintf(dict + n, sizeof dict - n, "%s), }", t->ndim == 1 ? "," : "");
    if (t->ndim > 0) {
        int digits = snprintf(NULL, 0, "%zu", t->shape[0]);
        for (int i = digits; i < NPY_GROWTH_DIGITS; i++) dict[n++] = ' ';
    }

    /* padding: numpy adds 1..64 spaces (64 when already aligned), then '\n' */
    int major = 1;
    size_t prefix = 10, hlen = n + 1, pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    if (hlen + pad > 65535) {
        major = 2;
        prefix = 12;
        pad = NPY_ALIGN - (prefix + hlen) % NPY_ALIGN;
    }
    size_t total = prefix + n + pad + 1;
    if (total > cap) return 0;
    size_t field = n + pad + 1;   /* the stored header length */
    memcpy(buf, NPY_MAGIC, NPY_MAGIC_LEN);
    buf[6] = (char)major;
    buf[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++) buf[8 + i] = (char)((field >> (8 * i)) & 0xff);
    memcpy(buf + prefix, dict, n);
    memset(buf + prefix + n, ' ', pad);
    buf[total - 1] = '\n';
    return total;
}

aft_status aft_npy_header(const aft_tensor *t, char *buf, size_t cap, size_t *len, aft_error *err)
{
    if (!t || !buf || !len) return aft_fail(err, AFT_ERR_ARG, "NULL tensor or buffer");
    if (t->dtype == AFT_BF16) return aft_fail(err, AFT_ERR_ARG, "bfloat16 cannot be stored in .npy");
    const char *code = aft_npy_code(t->dtype);
    if (!code) return aft_fail(err, AFT_ERR_ARG, "unknown dtype %d", (int)t->dtype);
    if (t->ndim > AFT_MAX_DIMS)
        return aft_fail(err, AFT_ERR_ARG, "too many dimensions: %zu", t->ndim);
    *len = build_header(buf, cap, code, t);
    if (!*len) return aft_fail(err, AFT_ERR_ARG, "a .npy header of more than %zu bytes", cap);
    return AFT_OK;
}

aft_status aft_npy_write_fp(FILE *fp, const aft_tensor *t, aft_error *err)
{
    if (!t || !fp) return aft_fail(err, AFT_ERR_ARG, "NULL tensor or file");
    char head[4096];
    size_t hn;
    aft_status st = aft_npy_header(t, head, sizeof head, &hn, err);
    if (st != AFT_OK) return st;

    /* the tensor's own counts must agree with its shape, or the file would
     * lie; the nonzero dimensions must multiply without overflow, the rule
     * the reader applies, so everything written here can be read back */
    size_t size = aft_dtype_size(t->dtype), nz = 1, nelem = 1, nbytes;
    for (size_t k = 0; k < t->ndim; k++) {
        if (t->shape[k] == 0) { nelem = 0; continue; }
        if (!aft_mul_ok(nz, t->shape[k], &nz))
            return aft_fail(err, AFT_ERR_ARG, "shape element count overflows");
    }
    if (!aft_mul_ok(nz, size, &nbytes))
        return aft_fail(err, AFT_ERR_ARG, "shape byte count overflows");
    if (nelem) nelem = nz;
    nbytes = nelem * size;
    if (nelem != t->nelem || nbytes != t->nbytes)
        return aft_fail(err, AFT_ERR_ARG, "tensor counts (%zu elements, %zu bytes) do not match "
                        "its shape (%zu elements, %zu bytes)", t->nelem, t->nbytes, nelem, nbytes);
    if (nbytes && !t->data) return aft_fail(err, AFT_ERR_ARG, "tensor has no data");

    if (fwrite(head, 1, hn, fp) != hn) goto io;

    if (size == 1 || AFT_HOST_LITTLE) {
        if (nbytes && fwrite(t->data, 1, nbytes, fp) != nbytes) goto io;
    } else {
        /* a big-endian host swaps a chunk at a time into little-endian */
        unsigned char chunk[65536];
        const unsigned char *p = t->data;
        for (size_t done = 0; done < nbytes;) {
            size_t m = nbytes - done < sizeof chunk ? nbytes - done : sizeof chunk;
            memcpy(chunk, p + done, m);
            byteswap(chunk, m / size, size);
            if (fwrite(chunk, 1, m, fp) != m) goto io;
            done += m;
        }
    }
    return AFT_OK;
io:
    return aft_fail(err, AFT_ERR_IO, "write failed: %s", strerror(errno));
}

aft_status aft_npy_write(const char *path, const aft_tensor *t, aft_error *err)
{
    /* refuse what cannot be written before creating any file */
    if (t && t->dtype == AFT_BF16)
        return aft_fail(err, AFT_ERR_ARG, "bfloat16 cannot be stored in .npy");
    aft_out o;
    aft_status st = aft_out_open(&o, path, err);
    if (st) return st;
    st = aft_npy_write_fp(o.fp, t, err);
    if (st) {
        aft_out_abort(&o);
        return st;
    }
    return aft_out_commit(&o, err);
}
