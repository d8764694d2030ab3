/* detect.c - telling .npy, .npz and .safetensors files apart by their first
 * bytes.
 *
 *   .npy          "\x93NUMPY"
 *   .npz          a zip archive: a local file header "PK\3\4" first, or, for
 *                 an archive with no member, the end record "PK\5\6"
 *   .safetensors  no magic: an 8-byte little-endian header size N, then N
 *                 bytes of JSON. Taken as one when N is at most the format's
 *                 100,000,000-byte limit and the JSON starts with '{'.
 *
 * What the bytes do not settle, the file's name does (the reader of the
 * format it names then says what is wrong), and what neither settles is
 * refused with one message.
 */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DETECT_HEAD 64                 /* bytes looked at */
#define ST_MAX_HEADER 100000000ull     /* the safetensors reference's limit */

const char *aft_format_name(aft_format f)
{
    switch (f) {
    case AFT_FORMAT_NPY: return "npy";
    case AFT_FORMAT_NPZ: return "npz";
    case AFT_FORMAT_SAFETENSORS: return "safetensors";
    default: return "unknown";
    }
}

aft_format aft_format_detect(const void *head, size_t len)
{
    const unsigned char *b = head;
    if (!b) return AFT_FORMAT_UNKNOWN;
    if (len >= 6 && memcmp(b, "\x93NUMPY", 6) == 0) return AFT_FORMAT_NPY;
    if (len >= 4 && (memcmp(b, "PK\3\4", 4) == 0 || memcmp(b, "PK\5\6", 4) == 0)) return AFT_FORMAT_NPZ;
    if (len >= 9) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
        if (n < 2 || n > ST_MAX_HEADER) return AFT_FORMAT_UNKNOWN;
        /* the JSON's first character, past whitespace, within what we have */
        size_t end = len - 8 < n ? len : 8 + (size_t)n;
        for (size_t i = 8; i < end; i++) {
            unsigned char c = b[i];
            if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
            return c == '{' ? AFT_FORMAT_SAFETENSORS : AFT_FORMAT_UNKNOWN;
        }
    }
    return AFT_FORMAT_UNKNOWN;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static aft_format by_name(const char *path)
{
    if (ends_with(path, ".npy")) return AFT_FORMAT_NPY;
    if (ends_with(path, ".npz")) return AFT_FORMAT_NPZ;
    if (ends_with(path, ".safetensors")) return AFT_FORMAT_SAFETENSORS;
    return AFT_FORMAT_UNKNOWN;
}

aft_status aft_file_format(const char *path, aft_format *out, aft_error *err)
{
    *out = AFT_FORMAT_UNKNOWN;
    if (strcmp(path, "-") == 0) return AFT_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return aft_fail(err, AFT_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return aft_fail(err, AFT_ERR_IO, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        /* a pipe or device: reading its start would take it from the reader */
        close(fd);
        *out = by_name(path);
        return AFT_OK;
    }
    unsigned char head[DETECT_HEAD];
    size_t len = 0;
    while (len < sizeof head) {
        ssize_t r = read(fd, head + len, sizeof head - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            return aft_fail(err, AFT_ERR_IO, "read failed: %s", strerror(e));
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    *out = aft_format_detect(head, len);
    if (*out == AFT_FORMAT_UNKNOWN) *out = by_name(path);
    if (*out == AFT_FORMAT_UNKNOWN)
        return aft_fail(err, AFT_ERR_FORMAT, "not a .npy, .npz or .safetensors file%s",
                        len == 0 ? " (it is empty)" : "");
    return AFT_OK;
}
