/* The raw snappy reader of tiered/spark/_decode.c (included there once; plain C, no Python).
 *
 * Raw snappy (the format of snappy's format_description.txt): the uncompressed length as a varint, then elements:
 * tag & 3 == 0 a literal of (tag >> 2) + 1 bytes, or with (tag >> 2) >= 60 a length of 1..4 little-endian bytes;
 * tag & 3 == 1 a copy of 4 + ((tag >> 2) & 7) bytes at offset ((tag >> 5) << 8) | next byte; 2 and 3 copies of
 * (tag >> 2) + 1 bytes at a 2- or 4-byte little-endian offset. An offset is never 0 nor beyond the bytes already
 * written; the elements write exactly the announced length.
 *
 * Every element is bounds-checked against the input and the announced length before it is copied; a fault is
 * described in `err`, for the caller's ProtocolError.
 */

/* Decompresses the elements src[0:n] (the length preamble already read) into exactly dst_len bytes of dst. 0, or -1
 * with the fault written to err. */
static int snappy_elements(const uint8_t *src, size_t n, uint8_t *dst, size_t dst_len, char *err, size_t err_len)
{
    size_t s = 0, d = 0;
    while (s < n) {
        size_t tag_at = s;
        uint8_t tag = src[s++];
        size_t len;
        if ((tag & 3) == 0) {
            len = (size_t)(tag >> 2) + 1;
            if (len > 60) {
                size_t bytes = len - 60;
                if (n - s < bytes) {
                    snprintf(err, err_len, "literal length cut short at byte %zu", tag_at);
                    return -1;
                }
                uint64_t v = 0;
                for (size_t i = 0; i < bytes; i++)
                    v |= (uint64_t)src[s + i] << (8 * i);
                s += bytes;
                len = (size_t)v + 1;
            }
            if (n - s < len) {
                snprintf(err, err_len, "literal of %zu bytes at byte %zu runs past the input", len, tag_at);
                return -1;
            }
            if (dst_len - d < len) {
                snprintf(err, err_len, "literal at byte %zu writes past the announced length", tag_at);
                return -1;
            }
            if (len <= 16 && n - s >= 16 && dst_len - d >= 16) {
                /* Most literals are short: two fixed 8-byte moves, the bytes past len rewritten later. */
                memcpy(dst + d, src + s, 8);
                memcpy(dst + d + 8, src + s + 8, 8);
            } else {
                memcpy(dst + d, src + s, len);
            }
            s += len;
            d += len;
            continue;
        }
        size_t offset;
        if ((tag & 3) == 1) {
            if (n - s < 1)
                goto cut;
            len = 4 + ((tag >> 2) & 7);
            offset = ((size_t)(tag >> 5) << 8) | src[s];
            s += 1;
        } else if ((tag & 3) == 2) {
            if (n - s < 2)
                goto cut;
            len = (size_t)(tag >> 2) + 1;
            offset = (size_t)src[s] | ((size_t)src[s + 1] << 8);
            s += 2;
        } else {
            if (n - s < 4)
                goto cut;
            len = (size_t)(tag >> 2) + 1;
            offset = (size_t)src[s] | ((size_t)src[s + 1] << 8) | ((size_t)src[s + 2] << 16) |
                     ((size_t)src[s + 3] << 24);
            s += 4;
        }
        if (offset == 0 || offset > d) {
            snprintf(err, err_len, "copy at byte %zu has offset %zu with %zu bytes written", tag_at, offset, d);
            return -1;
        }
        if (dst_len - d < len) {
            snprintf(err, err_len, "copy at byte %zu writes past the announced length", tag_at);
            return -1;
        }
        if (offset >= 8 && dst_len - d >= len + 8) {
            /* 8 bytes at a time: each move reads bytes written before it (offset >= 8); up to 7 bytes past len are
             * rewritten by the next element, and stay inside dst. */
            for (size_t i = 0; i < len; i += 8)
                memcpy(dst + d + i, dst + d - offset + i, 8);
        } else if (offset >= len) {
            memcpy(dst + d, dst + d - offset, len);
        } else {
            /* Overlapping: the pattern of `offset` bytes repeats; each pass copies what is already written. */
            size_t done = 0;
            while (done < len) {
                size_t chunk = offset + done < len - done ? offset + done : len - done;
                memcpy(dst + d + done, dst + d - offset, chunk);
                done += chunk;
            }
        }
        d += len;
        continue;
    cut:
        snprintf(err, err_len, "copy offset cut short at byte %zu", tag_at);
        return -1;
    }
    if (d != dst_len) {
        snprintf(err, err_len, "%zu bytes decompressed, %zu announced", d, dst_len);
        return -1;
    }
    return 0;
}
