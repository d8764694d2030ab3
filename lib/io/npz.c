/* npz.c - .npz archives: numpy's np.savez (stored members) and
 * np.savez_compressed (deflated members), read into the named-tensor handle
 * of aft_st_open, and written with stored members.
 *
 * An .npz is a zip archive with one member "KEY.npy" per array. The parts
 * of the zip format used here (APPNOTE.TXT, 6.3):
 *
 *   local header     "PK\3\4", version, flags, method, time, date, CRC-32,
 *                    compressed size, size, name length, extra length
 *                    (30 bytes), the name, the extra field, then the data
 *   central entry    "PK\1\2", versions, flags, method, time, date, CRC-32,
 *                    sizes, name, extra and comment lengths, disk, internal
 *                    and external attributes, local header offset (46
 *                    bytes), then the name, extra field and comment
 *   zip64 end        "PK\6\6" record (56 bytes) and its locator "PK\6\7"
 *                    (20 bytes), present when a count, size or offset does
 *                    not fit the end record's fields
 *   end record       "PK\5\6", disks, entry counts, central directory size
 *                    and offset, comment length (22 bytes), the comment
 *   zip64 extra      field 0x0001 in an entry's extra field: the 64-bit
 *                    values of whichever of size, compressed size and
 *                    offset are 0xffffffff in the fixed part, in that order
 *
 * The file is hostile. The central directory is read whole first and
 * checked against the end record; each member's local header must agree
 * with its entry (name, method, encryption, and sizes and CRC unless a data
 * descriptor carries them); members may not overlap each other or the
 * directory; keys (names without ".npy") must be unique and are never
 * paths: a name holding '/', '\\' or ".." is refused. Encrypted members and
 * methods other than stored and deflated are refused. A deflated member is
 * inflated into exactly its declared size, after that size was checked
 * against what deflate can make of its bytes (at most 1032 to 1) and
 * against the caller's memory bound; inflating past it, or short of it, is
 * an error, and so is a CRC-32 that does not match. Each member is then
 * read by the .npy reader; a stored member in native C order is borrowed
 * from the file instead of copied.
 */
#include "formats.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_END 0x06054b50u
#define SIG_END64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define LOCAL_SIZE 30
#define CENTRAL_SIZE 46
#define END_SIZE 22
#define END64_SIZE 56
#define LOC64_SIZE 20
#define MAX_COMMENT 65535
#define DEFLATE_MAX_RATIO 1032   /* a 258-byte match from 2 bits: deflate's best */
#define ZIP64_LIMIT 0x7fffffffu  /* sizes and offsets above this get zip64 records (as Python's zipfile) */
#define FLAG_ENCRYPTED 0x0001u
#define FLAG_DESCRIPTOR 0x0008u  /* CRC and sizes in a data descriptor after the data */
#define FLAG_STRONG 0x0040u      /* strong encryption */
#define FLAG_UTF8 0x0800u        /* the name is UTF-8 (else code page 437) */
#define METHOD_STORED 0
#define METHOD_DEFLATED 8
#define METHOD_AES 99
#define DOS_DATE_1980 0x0021u    /* 1980-01-01, the earliest a zip can say */

static uint32_t rd16(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t rd32(const unsigned char *p) { return rd16(p) | rd16(p + 2) << 16; }
static uint64_t rd64(const unsigned char *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

uint32_t aft_crc32(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *b = p;
    while (n > 0) {
        uInt k = n > UINT_MAX ? UINT_MAX : (uInt)n;
        crc = (uint32_t)crc32(crc, b, k);
        b += k;
        n -= k;
    }
    return crc;
}

/* ---------------------------------------------------------------- names */

/* code page 437's upper half, the encoding of a name without the UTF-8 flag */
static const uint16_t cp437_high[] = {
    0x00c7, 0x00fc, 0x00e9, 0x00e2, 0x00e4, 0x00e0, 0x00e5, 0x00e7, 0x00ea, 0x00eb, 0x00e8, 0x00ef,
    0x00ee, 0x00ec, 0x00c4, 0x00c5, 0x00c9, 0x00e6, 0x00c6, 0x00f4, 0x00f6, 0x00f2, 0x00fb, 0x00f9,
    0x00ff, 0x00d6, 0x00dc, 0x00a2, 0x00a3, 0x00a5, 0x20a7, 0x0192, 0x00e1, 0x00ed, 0x00f3, 0x00fa,
    0x00f1, 0x00d1, 0x00aa, 0x00ba, 0x00bf, 0x2310, 0x00ac, 0x00bd, 0x00bc, 0x00a1, 0x00ab, 0x00bb,
    0x2591, 0x2592, 0x2593, 0x2502, 0x2524, 0x2561, 0x2562, 0x2556, 0x2555, 0x2563, 0x2551, 0x2557,
    0x255d, 0x255c, 0x255b, 0x2510, 0x2514, 0x2534, 0x252c, 0x251c, 0x2500, 0x253c, 0x255e, 0x255f,
    0x255a, 0x2554, 0x2569, 0x2566, 0x2560, 0x2550, 0x256c, 0x2567, 0x2568, 0x2564, 0x2565, 0x2559,
    0x2558, 0x2552, 0x2553, 0x256b, 0x256a, 0x2518, 0x250c, 0x2588, 0x2584, 0x258c, 0x2590, 0x2580,
    0x03b1, 0x00df, 0x0393, 0x03c0, 0x03a3, 0x03c3, 0x00b5, 0x03c4, 0x03a6, 0x0398, 0x03a9, 0x03b4,
    0x221e, 0x03c6, 0x03b5, 0x2229, 0x2261, 0x00b1, 0x2265, 0x2264, 0x2320, 0x2321, 0x00f7, 0x2248,
    0x00b0, 0x2219, 0x00b7, 0x221a, 0x207f, 0x00b2, 0x25a0, 0x00a0,
};
_Static_assert(sizeof cp437_high / sizeof cp437_high[0] == 128, "code page 437 has 128 upper characters");

/* a name from the file for a message, as aft_shown shows it (at most 60
 * bytes) */
static const char *shown(const char *name, char buf[static 80])
{
    return aft_shown(name, buf, 60);
}

/* the raw bytes of a name for a message, before it could be decoded */
static const char *shown_raw(const unsigned char *s, size_t n, char buf[static 80])
{
    size_t o = 0;
    for (size_t i = 0; i < n && o < 60; i++) buf[o++] = s[i] >= 0x20 && s[i] < 0x7f ? (char)s[i] : '?';
    if (n > 60) { memcpy(buf + o, "...", 3); o += 3; }
    buf[o] = '\0';
    return buf;
}

/* What makes a name no key: NULL if it is a fine one. A key is never a
 * path: no '/', no '\\' and no "..", whatever the platform, so nothing that
 * reads keys can be led outside where it writes. */
static const char *key_problem(const char *key)
{
    if (!*key) return "an empty key";
    if (strchr(key, '/')) return "'/' in a key (members are keys, not paths)";
    if (strchr(key, '\\')) return "'\\' in a key (members are keys, not paths)";
    if (strstr(key, "..")) return "'..' in a key (members are keys, not paths)";
    return NULL;
}

aft_status aft_npz_check_key(const char *key, aft_error *err)
{
    char b[80];
    if (!key) return aft_fail(err, AFT_ERR_ARG, "a tensor without a name");
    if (!aft_utf8_valid(key))
        return aft_fail(err, AFT_ERR_ARG, "key '%s' is not valid UTF-8", shown(key, b));
    const char *why = key_problem(key);
    if (why) return aft_fail(err, AFT_ERR_ARG, "key '%s': %s", shown(key, b), why);
    if (strlen(key) > 65535 - 4) return aft_fail(err, AFT_ERR_ARG, "key '%s' is longer than a zip name can be", shown(key, b));
    return AFT_OK;
}

/* ---------------------------------------------------------------- reading */

typedef struct {
    const unsigned char *name;   /* the name's bytes in the central directory */
    size_t name_len;
    char *member;                /* the name decoded to UTF-8 (malloc'd) */
    size_t key_len;              /* the key: member's first key_len bytes */
    uint32_t flags, method, crc;
    uint64_t csize, usize, local;
    size_t data;                 /* where the data starts, after the local header */
    size_t index;                /* position in the central directory */
} zmember;

typedef struct {
    const unsigned char *b;
    size_t size;
    size_t cd_off, cd_end;       /* the central directory's bytes */
    uint64_t count;
    zmember *m;
    aft_error *err;
} zreader;

/* "member 'NAME': " ... for every message about one member */
static aft_status member_fail(const zmember *m, aft_error *err, aft_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static aft_status member_fail(const zmember *m, aft_error *err, aft_status st, const char *fmt, ...)
{
    char what[400], b[80];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (m->member) return aft_fail(err, st, "member '%s': %s", shown(m->member, b), what);
    return aft_fail(err, st, "member '%s': %s", shown_raw(m->name, m->name_len, b), what);
}

/* The end record, and the zip64 one when its locator is there: where the
 * central directory is and how many entries it holds. */
static aft_status find_directory(zreader *Z)
{
    const unsigned char *b = Z->b;
    size_t size = Z->size;
    if (size < END_SIZE)
        return aft_fail(Z->err, AFT_ERR_FORMAT,
                        "zip archive of %zu %s is truncated: no end of central directory record",
                        size, aft_noun(size, "byte", "bytes"));
    /* the end record: its signature, then a comment running exactly to the
     * end of the file */
    size_t end = SIZE_MAX;
    size_t lowest = size - END_SIZE > MAX_COMMENT ? size - END_SIZE - MAX_COMMENT : 0;
    for (size_t p = size - END_SIZE + 1; p-- > lowest;)
        if (rd32(b + p) == SIG_END && p + END_SIZE + rd16(b + p + 20) == size) {
            end = p;
            break;
        }
    if (end == SIZE_MAX)
        return aft_fail(Z->err, AFT_ERR_FORMAT,
                        "zip archive has no end of central directory record (truncated, or not a zip)");
    const unsigned char *e = b + end;
    uint32_t disk = rd16(e + 4), cd_disk = rd16(e + 6);
    uint64_t n_disk = rd16(e + 8), n = rd16(e + 10), cd_size = rd32(e + 12), cd_off = rd32(e + 16);
    size_t cd_end = end;

    if (end >= LOC64_SIZE && rd32(b + end - LOC64_SIZE) == SIG_LOC64) {
        const unsigned char *l = b + end - LOC64_SIZE;
        uint64_t off64 = rd64(l + 8);
        size_t loc = end - LOC64_SIZE;
        if (rd32(l + 4) != 0 || rd32(l + 16) > 1)
            return aft_fail(Z->err, AFT_ERR_FORMAT, "multi-disk zip archives are not supported");
        if (off64 > loc || loc - off64 < END64_SIZE || rd32(b + off64) != SIG_END64)
            return aft_fail(Z->err, AFT_ERR_FORMAT, "zip64 end of central directory record missing where its locator points (%llu)",
                            (unsigned long long)off64);
        const unsigned char *z = b + off64;
        if (rd64(z + 4) != loc - off64 - 12)
            return aft_fail(Z->err, AFT_ERR_FORMAT, "zip64 end of central directory record does not end where its locator starts");
        disk = rd32(z + 16);
        cd_disk = rd32(z + 20);
        n_disk = rd64(z + 24);
        n = rd64(z + 32);
        cd_size = rd64(z + 40);
        cd_off = rd64(z + 48);
        cd_end = (size_t)off64;
    } else if (n == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu) {
        return aft_fail(Z->err, AFT_ERR_FORMAT, "zip archive's end record needs a zip64 record, and there is none");
    }
    if (disk != 0 || cd_disk != 0 || n_disk != n)
        return aft_fail(Z->err, AFT_ERR_FORMAT, "multi-disk zip archives are not supported");
    if (cd_off > cd_end || cd_size > cd_end - cd_off)
        return aft_fail(Z->err, AFT_ERR_FORMAT,
                        "truncated central directory: the end record puts %llu %s at offset %llu, "
                        "but the end record starts at %zu",
                        (unsigned long long)cd_size, aft_noun(cd_size, "byte", "bytes"), (unsigned long long)cd_off,
                        cd_end);
    if (cd_off + cd_size != cd_end)
        return aft_fail(Z->err, AFT_ERR_FORMAT,
                        "%llu %s between the central directory and the end record (data before the archive?)",
                        (unsigned long long)(cd_end - cd_off - cd_size),
                        aft_noun(cd_end - cd_off - cd_size, "byte", "bytes"));
    if (n > cd_size / CENTRAL_SIZE)
        return aft_fail(Z->err, AFT_ERR_FORMAT,
                        "truncated central directory: %llu %s cannot fit in its %llu %s",
                        (unsigned long long)n, aft_noun(n, "entry", "entries"), (unsigned long long)cd_size,
                        aft_noun(cd_size, "byte", "bytes"));
    Z->cd_off = (size_t)cd_off;
    Z->cd_end = cd_end;
    Z->count = n;
    return AFT_OK;
}

/* The zip64 extra field of an entry (or a local header): the 64-bit values
 * of the fields that are 0xffffffff, in the order size, compressed size,
 * offset. want[i] says which are needed; 0, -1 when they are not there, -2
 * when the extra field's framing is corrupt. */
static int zip64_extra(const unsigned char *x, size_t xlen, const int want[3], uint64_t *val[3])
{
    /* fields are (id, length, data); a trailing run shorter than a field
     * header is ignored, as Python's zipfile does */
    while (xlen >= 4) {
        uint32_t id = rd16(x), len = rd16(x + 2);
        if (len > xlen - 4) return -2;
        if (id == 1) {
            size_t at = 0;
            for (int i = 0; i < 3; i++) {
                if (!want[i]) continue;
                if (at + 8 > len) return -1;
                *val[i] = rd64(x + 4 + at);
                at += 8;
            }
            return 0;
        }
        x += 4 + len;
        xlen -= 4 + len;
    }
    return want[0] || want[1] || want[2] ? -1 : 0;
}

/* The name as UTF-8: as it is with the UTF-8 flag (which it must then
 * be), else code page 437 as the zip format says. malloc'd, or NULL. */
static char *decode_name(const unsigned char *s, size_t n, int utf8)
{
    size_t cap = utf8 ? n + 1 : 3 * n + 1;
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    for (size_t i = 0; i < n; i++) {
        unsigned c = s[i];
        if (utf8 || c < 0x80) {
            *o++ = (char)c;
            continue;
        }
        o += aft_utf8_put((unsigned char *)o, cp437_high[c - 0x80]);
    }
    *o = '\0';
    return out;
}

/* One central directory entry at *pos into m. */
static aft_status read_entry(zreader *Z, size_t *pos, zmember *m)
{
    const unsigned char *b = Z->b;
    size_t p = *pos, left = Z->cd_end - p;
    if (left < CENTRAL_SIZE || rd32(b + p) != SIG_CENTRAL)
        return aft_fail(Z->err, AFT_ERR_FORMAT, "truncated central directory: entry %zu of %llu is %s",
                        m->index + 1, (unsigned long long)Z->count,
                        left < CENTRAL_SIZE ? "cut short" : "not where the directory says");
    const unsigned char *e = b + p;
    size_t nlen = rd16(e + 28), xlen = rd16(e + 30), clen = rd16(e + 32);
    if (CENTRAL_SIZE + nlen + xlen + clen > left)
        return aft_fail(Z->err, AFT_ERR_FORMAT, "truncated central directory: entry %zu of %llu runs past its end",
                        m->index + 1, (unsigned long long)Z->count);
    m->name = e + CENTRAL_SIZE;
    m->name_len = nlen;
    m->flags = rd16(e + 8);
    m->method = rd16(e + 10);
    m->crc = rd32(e + 16);
    m->csize = rd32(e + 20);
    m->usize = rd32(e + 24);
    m->local = rd32(e + 42);
    uint64_t disk = rd16(e + 34);
    *pos = p + CENTRAL_SIZE + nlen + xlen + clen;

    int want[3] = {m->usize == 0xffffffffu, m->csize == 0xffffffffu, m->local == 0xffffffffu};
    uint64_t *val[3] = {&m->usize, &m->csize, &m->local};
    int r = zip64_extra(e + CENTRAL_SIZE + nlen, xlen, want, val);
    if (r == -2) return member_fail(m, Z->err, AFT_ERR_FORMAT, "its extra field is corrupt");
    if (r != 0) return member_fail(m, Z->err, AFT_ERR_FORMAT, "its zip64 sizes are missing from the central directory");
    if (disk != 0 && disk != 0xffff)
        return aft_fail(Z->err, AFT_ERR_FORMAT, "multi-disk zip archives are not supported");

    /* the name: a key, never a path */
    int utf8 = (m->flags & FLAG_UTF8) != 0;
    if (memchr(m->name, 0, nlen)) return member_fail(m, Z->err, AFT_ERR_FORMAT, "a NUL byte in its name");
    if (utf8 && aft_utf8_prefix(m->name, nlen) != nlen)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "its name is marked UTF-8 but is not");
    if (!(m->member = decode_name(m->name, nlen, utf8)))
        return aft_fail(Z->err, AFT_ERR_NOMEM, "out of memory reading member names");
    size_t len = strlen(m->member);
    m->key_len = len >= 4 && strcmp(m->member + len - 4, ".npy") == 0 ? len - 4 : len;
    char save = m->member[m->key_len];
    m->member[m->key_len] = '\0';
    const char *why = key_problem(m->member);
    m->member[m->key_len] = save;
    if (why) return member_fail(m, Z->err, AFT_ERR_FORMAT, "%s", why);

    if ((m->flags & (FLAG_ENCRYPTED | FLAG_STRONG)) || m->method == METHOD_AES)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "it is encrypted");
    if (m->method != METHOD_STORED && m->method != METHOD_DEFLATED)
        return member_fail(m, Z->err, AFT_ERR_FORMAT,
                           "compression method %u (only stored and deflated members can be read)", m->method);
    if (m->method == METHOD_STORED && m->csize != m->usize)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "stored, but its sizes differ (%llu %s compressed, %llu not)",
                           (unsigned long long)m->csize, aft_noun(m->csize, "byte", "bytes"),
                           (unsigned long long)m->usize);
    if (m->method == METHOD_DEFLATED && m->usize > DEFLATE_MAX_RATIO &&
        (m->usize - DEFLATE_MAX_RATIO) / DEFLATE_MAX_RATIO > m->csize)
        return member_fail(m, Z->err, AFT_ERR_FORMAT,
                           "declares %llu %s inflated from %llu, more than deflate can make (a zip bomb?)",
                           (unsigned long long)m->usize, aft_noun(m->usize, "byte", "bytes"),
                           (unsigned long long)m->csize);
    return AFT_OK;
}

/* The local header of m: it must agree with the central directory. Sets
 * m->data, and checks the data lies before the central directory. */
static aft_status read_local(zreader *Z, zmember *m)
{
    const unsigned char *b = Z->b;
    if (m->local > Z->cd_off || Z->cd_off - m->local < LOCAL_SIZE || rd32(b + m->local) != SIG_LOCAL)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "no local header at offset %llu", (unsigned long long)m->local);
    const unsigned char *l = b + m->local;
    size_t nlen = rd16(l + 26), xlen = rd16(l + 28);
    size_t data = (size_t)m->local + LOCAL_SIZE + nlen + xlen;
    if (data > Z->cd_off)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "its local header runs into the central directory");
    if (nlen != m->name_len || memcmp(l + LOCAL_SIZE, m->name, nlen) != 0)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "its local header names another member");
    uint32_t flags = rd16(l + 6), method = rd16(l + 8);
    if ((flags & (FLAG_ENCRYPTED | FLAG_STRONG)) || method == METHOD_AES)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "it is encrypted");
    if (method != m->method)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "its local header says method %u, the central directory %u",
                           method, m->method);
    if (!(flags & FLAG_DESCRIPTOR)) {
        uint64_t crc = rd32(l + 14), csize = rd32(l + 18), usize = rd32(l + 22), none = 0;
        int want[3] = {usize == 0xffffffffu, csize == 0xffffffffu, 0};
        uint64_t *val[3] = {&usize, &csize, &none};
        int r = zip64_extra(l + LOCAL_SIZE + nlen, xlen, want, val);
        if (r == -2) return member_fail(m, Z->err, AFT_ERR_FORMAT, "its local header's extra field is corrupt");
        if (r != 0) return member_fail(m, Z->err, AFT_ERR_FORMAT, "its zip64 sizes are missing from its local header");
        if (csize != m->csize || usize != m->usize)
            return member_fail(m, Z->err, AFT_ERR_FORMAT,
                               "its local header says %llu %s (%llu compressed), the central directory %llu (%llu)",
                               (unsigned long long)usize, aft_noun(usize, "byte", "bytes"), (unsigned long long)csize,
                               (unsigned long long)m->usize,
                               (unsigned long long)m->csize);
        if (crc != m->crc)
            return member_fail(m, Z->err, AFT_ERR_FORMAT, "its local header says CRC-32 %08llx, the central directory %08x",
                               (unsigned long long)crc, m->crc);
    }
    if (m->csize > Z->cd_off - data)
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "its %llu %s past the start of the central directory",
                           (unsigned long long)m->csize, aft_noun(m->csize, "byte runs", "bytes run"));
    m->data = data;
    return AFT_OK;
}

/* Inflates m's raw deflate data into out, exactly m->usize bytes. */
static aft_status inflate_member(const zreader *Z, const zmember *m, unsigned char *out)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK)
        return member_fail(m, Z->err, AFT_ERR_NOMEM, "cannot start inflating: out of memory");
    const unsigned char *in = Z->b + m->data;
    size_t in_left = (size_t)m->csize, out_left = (size_t)m->usize;
    unsigned char probe[1];
    int full = 0;   /* out is full: the stream must end without more output */
    aft_status st = AFT_OK;
    for (;;) {
        if (z.avail_in == 0 && in_left) {
            z.avail_in = in_left > UINT_MAX ? UINT_MAX : (uInt)in_left;
            z.next_in = (Bytef *)in;
            in += z.avail_in;
            in_left -= z.avail_in;
        }
        if (z.avail_out == 0) {
            if (out_left) {
                z.avail_out = out_left > UINT_MAX ? UINT_MAX : (uInt)out_left;
                z.next_out = out;
                out += z.avail_out;
                out_left -= z.avail_out;
            } else {
                full = 1;
                z.next_out = probe;
                z.avail_out = sizeof probe;
            }
        }
        int r = inflate(&z, Z_NO_FLUSH);
        if (full && z.avail_out == 0) {
            st = member_fail(m, Z->err, AFT_ERR_FORMAT, "inflates past its declared size of %llu %s",
                             (unsigned long long)m->usize, aft_noun(m->usize, "byte", "bytes"));
            break;
        }
        if (r == Z_STREAM_END) {
            size_t made = (size_t)m->usize - out_left - (full ? 0 : z.avail_out);
            if (made != m->usize)
                st = member_fail(m, Z->err, AFT_ERR_FORMAT, "inflates to %zu %s, short of the %llu declared", made,
                                 aft_noun(made, "byte", "bytes"),
                                 (unsigned long long)m->usize);
            else if (z.avail_in + in_left)
                st = member_fail(m, Z->err, AFT_ERR_FORMAT, "%zu of its %llu compressed %s the end of the data",
                                 (size_t)z.avail_in + in_left, (unsigned long long)m->csize,
                                 z.avail_in + in_left == 1 ? "bytes follows" : "bytes follow");
            break;
        }
        if (r == Z_DATA_ERROR) {
            st = member_fail(m, Z->err, AFT_ERR_FORMAT, "corrupt deflate data (%s)", z.msg ? z.msg : "?");
            break;
        }
        if (r == Z_MEM_ERROR) {
            st = member_fail(m, Z->err, AFT_ERR_NOMEM, "out of memory inflating");
            break;
        }
        if (r == Z_BUF_ERROR || (r == Z_OK && z.avail_in == 0 && in_left == 0 && z.avail_out > 0)) {
            /* no progress: the input ran out before the stream's end */
            if (z.avail_in == 0 && in_left == 0) {
                st = member_fail(m, Z->err, AFT_ERR_FORMAT, "its deflate data is cut short (%llu compressed %s)",
                                 (unsigned long long)m->csize, aft_noun(m->csize, "byte", "bytes"));
                break;
            }
        } else if (r != Z_OK) {
            st = member_fail(m, Z->err, AFT_ERR_FORMAT, "cannot inflate (zlib error %d)", r);
            break;
        }
    }
    inflateEnd(&z);
    return st;
}

static int cmp_local(const void *a, const void *b)
{
    const zmember *x = *(const zmember *const *)a, *y = *(const zmember *const *)b;
    return x->local < y->local ? -1 : x->local > y->local;
}

typedef struct {
    const zmember *m;
} zkey;

static int cmp_key(const void *a, const void *b)
{
    const zmember *x = ((const zkey *)a)->m, *y = ((const zkey *)b)->m;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->member, y->member, n);
    if (c) return c;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* the member's tensor, into t: borrowed from the file or allocated, the
 * allocation counted against max_bytes in *used */
static aft_status load_member(const zreader *Z, const zmember *m, size_t max_bytes, size_t *used, aft_tensor *t)
{
    aft_error npy_err;
    aft_status st;
    size_t copy = 0;
    if (m->method == METHOD_STORED) {
        const unsigned char *data = Z->b + m->data;
        uint32_t crc = aft_crc32(0, data, (size_t)m->usize);
        if (crc != m->crc)
            return member_fail(m, Z->err, AFT_ERR_FORMAT, "CRC-32 %08x of its data, the archive says %08x", crc, m->crc);
        if ((st = aft_npy_view_size(data, (size_t)m->usize, &copy, &npy_err)) != AFT_OK)
            return member_fail(m, Z->err, st, "%s", npy_err.msg);
        if (copy > max_bytes - *used)
            return member_fail(m, Z->err, AFT_ERR_NOMEM,
                               "needs %zu %s, past the memory limit of %zu %s (%zu taken before it)",
                               copy, aft_noun(copy, "byte", "bytes"), max_bytes, aft_noun(max_bytes, "byte", "bytes"),
                               *used);
        *used += copy;
        if ((st = aft_npy_view_mem(data, (size_t)m->usize, t, NULL, &npy_err)) != AFT_OK)
            return member_fail(m, Z->err, st, "%s", npy_err.msg);
        return AFT_OK;
    }

    /* deflated: the declared size is checked before anything is allocated */
    if (m->usize > max_bytes - *used)
        return member_fail(m, Z->err, AFT_ERR_NOMEM,
                           "inflates to %llu %s, past the memory limit of %zu %s (%zu taken before it)",
                           (unsigned long long)m->usize, aft_noun(m->usize, "byte", "bytes"), max_bytes,
                           aft_noun(max_bytes, "byte", "bytes"), *used);
    if (m->usize > SIZE_MAX - 1)
        return member_fail(m, Z->err, AFT_ERR_NOMEM, "inflates to %llu %s, more than memory can hold",
                           (unsigned long long)m->usize, aft_noun(m->usize, "byte", "bytes"));
    unsigned char *buf = aft_alloc_array((size_t)m->usize, 1);
    if (!buf)
        return member_fail(m, Z->err, AFT_ERR_NOMEM, "out of memory for its %llu %s", (unsigned long long)m->usize,
                           aft_noun(m->usize, "byte", "bytes"));
    *used += (size_t)m->usize;
    if ((st = inflate_member(Z, m, buf)) != AFT_OK) {
        free(buf);
        return st;
    }
    uint32_t crc = aft_crc32(0, buf, (size_t)m->usize);
    if (crc != m->crc) {
        free(buf);
        return member_fail(m, Z->err, AFT_ERR_FORMAT, "CRC-32 %08x of its inflated data, the archive says %08x", crc, m->crc);
    }
    if ((st = aft_npy_view_size(buf, (size_t)m->usize, &copy, &npy_err)) != AFT_OK) {
        free(buf);
        return member_fail(m, Z->err, st, "%s", npy_err.msg);
    }
    if (copy > max_bytes - *used) {
        free(buf);
        return member_fail(m, Z->err, AFT_ERR_NOMEM, "needs %zu %s more, past the memory limit of %zu %s (%zu taken)",
                           copy, aft_noun(copy, "byte", "bytes"), max_bytes, aft_noun(max_bytes, "byte", "bytes"),
                           *used);
    }
    *used += copy;
    if ((st = aft_npy_read_owned(buf, (size_t)m->usize, t, NULL, &npy_err)) != AFT_OK)   /* buf consumed */
        return member_fail(m, Z->err, st, "%s", npy_err.msg);
    return AFT_OK;
}

/* Names, keys and tensors into f, in file order (ascending local header
 * offset); order[i] is the i-th member in that order. */
static aft_status fill_handle(aft_st_file *f, zmember **order, size_t n, aft_error *err)
{
    size_t total = 1;
    for (size_t i = 0; i < n; i++) total += order[i]->key_len + 1;
    f->strings = malloc(total);
    f->names = aft_alloc_array(n, sizeof *f->names);
    f->by_name = aft_alloc_array(n, sizeof *f->by_name);
    f->tensors = aft_calloc_array(n, sizeof *f->tensors);
    zkey *sorted = aft_alloc_array(n, sizeof *sorted);
    if (!f->strings || !f->names || !f->by_name || !f->tensors || !sorted) {
        free(sorted);
        return aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu members", n);
    }
    char *s = f->strings;
    for (size_t i = 0; i < n; i++) {
        memcpy(s, order[i]->member, order[i]->key_len);
        s[order[i]->key_len] = '\0';
        f->names[i] = s;
        s += order[i]->key_len + 1;
        order[i]->index = i;   /* from here on: the file position */
        sorted[i].m = order[i];
    }
    qsort(sorted, n, sizeof *sorted, cmp_key);
    for (size_t i = 0; i < n; i++) f->by_name[i] = sorted[i].m->index;
    free(sorted);
    f->n = n;
    return AFT_OK;
}

aft_status aft_npz_parse(aft_st_file *f, size_t max_bytes, aft_error *err)
{
    zreader Z = {.b = f->bytes, .size = f->size, .err = err};
    aft_status st = find_directory(&Z);
    if (st) return st;
    size_t n = (size_t)Z.count;
    zmember *m = aft_calloc_array(n, sizeof *m);
    zmember **order = aft_alloc_array(n, sizeof *order);
    zkey *keys = aft_alloc_array(n, sizeof *keys);
    if (!m || !order || !keys) {
        st = aft_fail(err, AFT_ERR_NOMEM, "out of memory for %zu members", n);
        goto done;
    }

    /* the central directory, whole, then each member's local header */
    size_t pos = Z.cd_off;
    for (size_t i = 0; i < n; i++) {
        m[i].index = i;
        if ((st = read_entry(&Z, &pos, &m[i]))) goto done;
    }
    if (pos != Z.cd_end) {
        st = aft_fail(err, AFT_ERR_FORMAT, "central directory holds %zu %s after its %zu %s", Z.cd_end - pos,
                      aft_noun(Z.cd_end - pos, "byte", "bytes"), n, aft_noun(n, "entry", "entries"));
        goto done;
    }
    for (size_t i = 0; i < n; i++)
        if ((st = read_local(&Z, &m[i]))) goto done;

    /* no two members share bytes */
    for (size_t i = 0; i < n; i++) order[i] = &m[i];
    qsort(order, n, sizeof *order, cmp_local);
    for (size_t i = 1; i < n; i++) {
        const zmember *a = order[i - 1], *b = order[i];
        if (a->data + a->csize > b->local) {
            char bb[80];
            st = member_fail(b, err, AFT_ERR_FORMAT, "overlaps member '%s'", shown(a->member, bb));
            goto done;
        }
    }

    /* keys are unique */
    for (size_t i = 0; i < n; i++) keys[i].m = &m[i];
    qsort(keys, n, sizeof *keys, cmp_key);
    for (size_t i = 1; i < n; i++) {
        const zmember *a = keys[i - 1].m, *b = keys[i].m;
        if (a->key_len == b->key_len && memcmp(a->member, b->member, a->key_len) == 0) {
            char ka[80], kb[80];
            char *key = strndup(a->member, a->key_len);
            st = aft_fail(err, AFT_ERR_FORMAT, "duplicate key '%s' (members '%s' and '%s')",
                          key ? shown(key, ka) : "?", shown(a->member, kb), shown(b->member, (char[80]){0}));
            free(key);
            goto done;
        }
    }

    if ((st = fill_handle(f, order, n, err))) goto done;
    f->format = AFT_FORMAT_NPZ;
    size_t used = 0;
    for (size_t i = 0; i < n; i++)
        if ((st = load_member(&Z, order[i], max_bytes, &used, &f->tensors[i]))) goto done;
    st = AFT_OK;

done:
    for (size_t i = 0; m && i < n; i++) free(m[i].member);
    free(m);
    free(order);
    free(keys);
    return st;
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    char *name;        /* KEY.npy */
    uint64_t off, size;
    uint32_t crc;
} wentry;

struct aft_npz_writer {
    FILE *fp;
    int force64;       /* every record in zip64 form (tests) */
    uint64_t off;      /* bytes written */
    wentry *e;
    size_t n, cap;
    int open;          /* a member is being written */
    uint64_t got;      /* its bytes so far */
    uint32_t crc;      /* their CRC-32 */
    int failed;        /* a write failed: nothing more is written */
};

static void put16(unsigned char *p, uint32_t v) { p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); }
static void put32(unsigned char *p, uint32_t v) { put16(p, v & 0xffff); put16(p + 2, v >> 16); }
static void put64(unsigned char *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

static aft_status wr(aft_npz_writer *w, const void *p, size_t n, aft_error *err)
{
    if (w->failed) return aft_fail(err, AFT_ERR_IO, "write failed earlier");
    if (n && fwrite(p, 1, n, w->fp) != n) {
        w->failed = 1;
        return aft_fail(err, AFT_ERR_IO, "write failed: %s", strerror(errno ? errno : EIO));
    }
    w->off += n;
    return AFT_OK;
}

aft_status aft_npz_writer_new_zip64(FILE *fp, int force_zip64, aft_npz_writer **out, aft_error *err)
{
    *out = NULL;
    if (!fp) return aft_fail(err, AFT_ERR_ARG, "NULL file");
    if (!AFT_HOST_LITTLE) return aft_fail(err, AFT_ERR_ARG, "writing .npz on a big-endian build is not supported");
    aft_npz_writer *w = calloc(1, sizeof *w);
    if (!w) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    w->fp = fp;
    w->force64 = force_zip64;
    *out = w;
    return AFT_OK;
}

aft_status aft_npz_writer_new(FILE *fp, aft_npz_writer **out, aft_error *err)
{
    return aft_npz_writer_new_zip64(fp, 0, out, err);
}

static int has_high_bytes(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s >= 0x80) return 1;
    return 0;
}

/* the member being written must be complete and as announced */
static aft_status close_member(aft_npz_writer *w, aft_error *err)
{
    if (!w->open) return AFT_OK;
    wentry *e = &w->e[w->n - 1];
    char b[80];
    w->open = 0;
    if (w->got != e->size) {
        w->failed = 1;
        return aft_fail(err, AFT_ERR_ARG, "member '%s': %llu %s written of the %llu announced", shown(e->name, b),
                        (unsigned long long)w->got, aft_noun(w->got, "byte", "bytes"), (unsigned long long)e->size);
    }
    if (w->crc != e->crc) {
        w->failed = 1;
        return aft_fail(err, AFT_ERR_ARG, "member '%s': its data changed while it was written (CRC-32 %08x, announced %08x)",
                        shown(e->name, b), w->crc, e->crc);
    }
    return AFT_OK;
}

aft_status aft_npz_writer_begin(aft_npz_writer *w, const char *key, uint64_t size, uint32_t crc, aft_error *err)
{
    aft_status st;
    if ((st = close_member(w, err))) return st;
    if ((st = aft_npz_check_key(key, err))) return st;
    char b[80];
    size_t klen = strlen(key);
    for (size_t i = 0; i < w->n; i++)
        if (strncmp(w->e[i].name, key, klen) == 0 && strcmp(w->e[i].name + klen, ".npy") == 0)
            return aft_fail(err, AFT_ERR_ARG, "key '%s' is given twice", shown(key, b));
    if (w->n == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 16;
        wentry *e = aft_alloc_array(cap, sizeof *e);
        if (!e) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
        if (w->n) memcpy(e, w->e, w->n * sizeof *e);
        free(w->e);
        w->e = e;
        w->cap = cap;
    }
    char *name = malloc(klen + 5);
    if (!name) return aft_fail(err, AFT_ERR_NOMEM, "out of memory");
    memcpy(name, key, klen);
    memcpy(name + klen, ".npy", 5);
    wentry *e = &w->e[w->n++];
    *e = (wentry){name, w->off, size, crc};

    /* the local header; zip64 when the size needs it */
    int z64 = w->force64 || size > ZIP64_LIMIT;
    size_t nlen = klen + 4;
    unsigned char h[LOCAL_SIZE + 20];
    put32(h, SIG_LOCAL);
    put16(h + 4, z64 ? 45 : 20);
    put16(h + 6, has_high_bytes(key) ? FLAG_UTF8 : 0);
    put16(h + 8, METHOD_STORED);
    put16(h + 10, 0);                 /* 00:00 */
    put16(h + 12, DOS_DATE_1980);
    put32(h + 14, crc);
    put32(h + 18, z64 ? 0xffffffffu : (uint32_t)size);
    put32(h + 22, z64 ? 0xffffffffu : (uint32_t)size);
    put16(h + 26, (uint32_t)nlen);
    put16(h + 28, z64 ? 20 : 0);
    unsigned char x[20];
    put16(x, 1);
    put16(x + 2, 16);
    put64(x + 4, size);
    put64(x + 12, size);
    w->open = 1;
    w->got = 0;
    w->crc = 0;
    if ((st = wr(w, h, LOCAL_SIZE, err)) || (st = wr(w, name, nlen, err)) || (z64 && (st = wr(w, x, 20, err))))
        return st;
    return AFT_OK;
}

aft_status aft_npz_writer_write(aft_npz_writer *w, const void *p, size_t n, aft_error *err)
{
    if (!w->open) return aft_fail(err, AFT_ERR_ARG, "data outside a member");
    wentry *e = &w->e[w->n - 1];
    if (n > e->size - w->got) {
        char b[80];
        w->failed = 1;
        return aft_fail(err, AFT_ERR_ARG, "member '%s': more than the %llu %s announced", shown(e->name, b),
                        (unsigned long long)e->size, aft_noun(e->size, "byte", "bytes"));
    }
    w->crc = aft_crc32(w->crc, p, n);
    w->got += n;
    return wr(w, p, n, err);
}

aft_status aft_npz_writer_finish(aft_npz_writer *w, aft_error *err)
{
    aft_status st = close_member(w, err);
    if (st) return st;
    uint64_t cd_off = w->off;
    for (size_t i = 0; i < w->n; i++) {
        const wentry *e = &w->e[i];
        int big_size = w->force64 || e->size > ZIP64_LIMIT, big_off = w->force64 || e->off > ZIP64_LIMIT;
        int z64 = big_size || big_off;
        size_t nlen = strlen(e->name), xlen = z64 ? 4 + 16 * big_size + 8 * big_off : 0;
        unsigned char c[CENTRAL_SIZE], x[28];
        put32(c, SIG_CENTRAL);
        put16(c + 4, (3u << 8) | (z64 ? 45 : 20));   /* made by: Unix */
        put16(c + 6, z64 ? 45 : 20);
        put16(c + 8, has_high_bytes(e->name) ? FLAG_UTF8 : 0);
        put16(c + 10, METHOD_STORED);
        put16(c + 12, 0);
        put16(c + 14, DOS_DATE_1980);
        put32(c + 16, e->crc);
        put32(c + 20, big_size ? 0xffffffffu : (uint32_t)e->size);
        put32(c + 24, big_size ? 0xffffffffu : (uint32_t)e->size);
        put16(c + 28, (uint32_t)nlen);
        put16(c + 30, (uint32_t)xlen);
        put16(c + 32, 0);
        put16(c + 34, 0);
        put16(c + 36, 0);
        put32(c + 38, 0600u << 16);     /* rw------- as Python's zipfile */
        put32(c + 42, big_off ? 0xffffffffu : (uint32_t)e->off);
        size_t k = 4;
        put16(x, 1);
        put16(x + 2, (uint32_t)(xlen - 4));
        if (big_size) { put64(x + k, e->size); put64(x + k + 8, e->size); k += 16; }
        if (big_off) put64(x + k, e->off);
        if ((st = wr(w, c, CENTRAL_SIZE, err)) || (st = wr(w, e->name, nlen, err)) || (st = wr(w, x, xlen, err)))
            return st;
    }
    uint64_t cd_size = w->off - cd_off, n = w->n;
    int z64 = w->force64 || n >= 0xffff || cd_size > ZIP64_LIMIT || cd_off > ZIP64_LIMIT;
    if (z64) {
        unsigned char r[END64_SIZE + LOC64_SIZE];
        uint64_t at = w->off;
        put32(r, SIG_END64);
        put64(r + 4, END64_SIZE - 12);
        put16(r + 12, (3u << 8) | 45);
        put16(r + 14, 45);
        put32(r + 16, 0);
        put32(r + 20, 0);
        put64(r + 24, n);
        put64(r + 32, n);
        put64(r + 40, cd_size);
        put64(r + 48, cd_off);
        put32(r + 56, SIG_LOC64);
        put32(r + 60, 0);
        put64(r + 64, at);
        put32(r + 72, 1);
        if ((st = wr(w, r, sizeof r, err))) return st;
    }
    unsigned char end[END_SIZE];
    put32(end, SIG_END);
    put16(end + 4, 0);
    put16(end + 6, 0);
    uint32_t n16 = w->force64 || n > 0xffff ? 0xffff : (uint32_t)n;
    put16(end + 8, n16);
    put16(end + 10, n16);
    put32(end + 12, w->force64 || cd_size > 0xffffffffu ? 0xffffffffu : (uint32_t)cd_size);
    put32(end + 16, w->force64 || cd_off > 0xffffffffu ? 0xffffffffu : (uint32_t)cd_off);
    put16(end + 20, 0);
    return wr(w, end, END_SIZE, err);
}

void aft_npz_writer_free(aft_npz_writer *w)
{
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    free(w);
}

aft_status aft_npz_write(const char *path, const char *const *keys, const aft_tensor *tensors, size_t n,
                         aft_error *err)
{
    if (n && (!keys || !tensors)) return aft_fail(err, AFT_ERR_ARG, "missing key or tensor arrays");
    if (!AFT_HOST_LITTLE) return aft_fail(err, AFT_ERR_ARG, "writing .npz on a big-endian build is not supported");
    /* every check before any file is created */
    char head[4096];
    size_t hn;
    char b[80];
    aft_status st;
    for (size_t i = 0; i < n; i++) {
        if ((st = aft_npz_check_key(keys[i], err))) return st;
        for (size_t j = 0; j < i; j++)
            if (strcmp(keys[j], keys[i]) == 0) return aft_fail(err, AFT_ERR_ARG, "key '%s' is given twice", shown(keys[i], b));
        if (tensors[i].nbytes && !tensors[i].data)
            return aft_fail(err, AFT_ERR_ARG, "tensor '%s' has no data", shown(keys[i], b));
        if ((st = aft_npy_header(&tensors[i], head, sizeof head, &hn, err))) return st;
        /* counts that agree with the shape, as aft_npy_write_fp demands */
        const aft_tensor *t = &tensors[i];
        size_t nz = 1, nelem = 1, nbytes;
        int over = 0;
        for (size_t k = 0; k < t->ndim; k++) {
            if (t->shape[k] == 0) nelem = 0;
            else over |= !aft_mul_ok(nz, t->shape[k], &nz);
        }
        over |= !aft_mul_ok(nz, aft_dtype_size(t->dtype), &nbytes);
        if (nelem) nelem = nz;
        if (over || nelem != t->nelem || nelem * aft_dtype_size(t->dtype) != t->nbytes)
            return aft_fail(err, AFT_ERR_ARG, "tensor '%s': its counts do not match its shape", shown(keys[i], b));
    }
    aft_out o;
    if ((st = aft_out_open(&o, path, err))) return st;
    aft_npz_writer *w = NULL;
    st = aft_npz_writer_new(o.fp, &w, err);
    for (size_t i = 0; i < n && !st; i++) {
        const aft_tensor *t = &tensors[i];
        aft_npy_header(t, head, sizeof head, &hn, err);
        uint32_t crc = aft_crc32(aft_crc32(0, head, hn), t->data, t->nbytes);
        if (!(st = aft_npz_writer_begin(w, keys[i], (uint64_t)hn + t->nbytes, crc, err)) &&
            !(st = aft_npz_writer_write(w, head, hn, err)))
            st = aft_npz_writer_write(w, t->data, t->nbytes, err);
    }
    if (!st) st = aft_npz_writer_finish(w, err);
    aft_npz_writer_free(w);
    if (st) {
        aft_out_abort(&o);
        return st;
    }
    return aft_out_commit(&o, err);
}
