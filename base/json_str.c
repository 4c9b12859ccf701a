/* JSON string escaping: the rule is in json_str.h. */
#include "json_str.h"

#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s (n bytes left, n >= 1), 0 if none
 * starts there: overlong forms, surrogates and code points above U+10FFFF
 * are not valid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) {
            lo = 0xA0; /* overlong */
        } else if (c == 0xED) {
            hi = 0x9F; /* surrogates */
        }
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) {
            lo = 0x90; /* overlong */
        } else if (c == 0xF4) {
            hi = 0x8F; /* above U+10FFFF */
        }
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi) {
        return 0;
    }
    for (size_t i = 2; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            return 0;
        }
    }
    return len;
}

/* What the character at p (left >= 1 bytes) is written as: *ins and its
 * length (tmp holds it when it is made here); *adv = the bytes it takes. */
static size_t escape_one(const unsigned char *p, size_t left, char tmp[8], const char **ins, size_t *adv)
{
    unsigned char c = *p;
    *adv = 1;
    *ins = tmp;
    switch (c) {
    case '"':
        *ins = "\\\"";
        return 2;
    case '\\':
        *ins = "\\\\";
        return 2;
    case '\n':
        *ins = "\\n";
        return 2;
    case '\t':
        *ins = "\\t";
        return 2;
    case '\r':
        *ins = "\\r";
        return 2;
    default:
        break;
    }
    if (c < 0x20) {
        return (size_t)snprintf(tmp, 8, "\\u%04x", c);
    }
    size_t n = utf8_len(p, left);
    if (n == 0) {
        *ins = "\\ufffd";
        return 6;
    }
    *ins = (const char *)p;
    *adv = n;
    return n;
}

size_t dshim_json_escape(char *out, size_t cap, const char *s)
{
    if (cap == 0) {
        return 0;
    }
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t left = strlen((const char *)p), o = 0;
    while (left > 0) {
        char tmp[8];
        const char *ins;
        size_t adv, n = escape_one(p, left, tmp, &ins, &adv);
        if (o + n >= cap) {
            break; /* never half an escape or half a character */
        }
        memcpy(out + o, ins, n);
        o += n;
        p += adv;
        left -= adv;
    }
    out[o] = '\0';
    return o;
}

void dshim_json_write(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t left = strlen((const char *)p);
    while (left > 0) {
        char tmp[8];
        const char *ins;
        size_t adv, n = escape_one(p, left, tmp, &ins, &adv);
        fwrite(ins, 1, n, f);
        p += adv;
        left -= adv;
    }
}
