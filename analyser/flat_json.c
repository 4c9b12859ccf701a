/* The analyser's JSON reader (flat_json.h): a small parser for exactly the
 * flat objects of the dumps and launcher.jsonl, bounded by the buffer. */
#include <stdint.h>
#include <string.h>

#include "flat_json.h"

typedef struct {
    const char *p, *end;
} cur_t;

static void skip_ws(cur_t *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r' || *c->p == '\n')) {
        c->p++;
    }
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    if (ch >= 'a' && ch <= 'f') {
        return ch - 'a' + 10;
    }
    if (ch >= 'A' && ch <= 'F') {
        return ch - 'A' + 10;
    }
    return -1;
}

static int read_hex4(cur_t *c, unsigned *out)
{
    if (c->end - c->p < 4) {
        return -1;
    }
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(c->p[i]);
        if (h < 0) {
            return -1;
        }
        v = v * 16 + (unsigned)h;
    }
    c->p += 4;
    *out = v;
    return 0;
}

/* Appends bytes while they fit; a cut never splits a UTF-8 sequence. */
static void put_bytes(char *out, size_t cap, size_t *len, const char *b, size_t n)
{
    if (*len + n + 1 > cap) {
        return;  /* stays cut: later, shorter pieces must not be appended after a gap */
    }
    memcpy(out + *len, b, n);
    *len += n;
}

static void put_utf8(char *out, size_t cap, size_t *len, unsigned cp, int *full)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (char)(0xf0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    if (*full || *len + n + 1 > cap) {
        *full = 1;
        return;
    }
    put_bytes(out, cap, len, b, n);
}

/* A string at c->p (the opening quote); decoded into out (may be NULL to skip). */
static int read_string(cur_t *c, char *out, size_t cap)
{
    if (c->p >= c->end || *c->p != '"') {
        return -1;
    }
    c->p++;
    size_t len = 0;
    int full = 0;
    char scratch[8];
    if (out == NULL) {
        out = scratch;
        cap = 1;
        full = 1;
    }
    while (c->p < c->end) {
        char ch = *c->p++;
        if (ch == '"') {
            out[len] = '\0';
            return 0;
        }
        if ((unsigned char)ch < 0x20) {
            return -1;  /* a raw control character: not JSON */
        }
        if (ch != '\\') {
            if (!full && len + 2 <= cap) {
                out[len++] = ch;
            } else if (!full) {
                /* cut here, backing off to the start of a UTF-8 sequence */
                while (len > 0 && ((unsigned char)out[len - 1] & 0xc0) == 0x80) {
                    len--;
                }
                if (len > 0 && ((unsigned char)out[len - 1] & 0x80)) {
                    len--;
                }
                full = 1;
            }
            continue;
        }
        if (c->p >= c->end) {
            return -1;
        }
        char e = *c->p++;
        unsigned cp = 0;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (read_hex4(c, &cp) != 0) {
                return -1;
            }
            if (cp >= 0xd800 && cp < 0xdc00) {
                /* a high surrogate: combined with a following low one, else U+FFFD */
                unsigned lo = 0;
                cur_t save = *c;
                if (c->end - c->p >= 6 && c->p[0] == '\\' && c->p[1] == 'u') {
                    c->p += 2;
                    if (read_hex4(c, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
                        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    } else {
                        *c = save;
                        cp = 0xfffd;
                    }
                } else {
                    cp = 0xfffd;
                }
            } else if (cp >= 0xdc00 && cp < 0xe000) {
                cp = 0xfffd;
            }
            if (cp == 0) {
                cp = 0xfffd;  /* keep strings NUL-free */
            }
            break;
        default:
            return -1;
        }
        if (out != scratch) {
            put_utf8(out, cap, &len, cp, &full);
        }
    }
    return -1;  /* unterminated */
}

/* A number: integers keep their value; fractions and exponents make it JV_OTHER. */
static int read_number(cur_t *c, jval_t *v)
{
    int neg = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') {
        return -1;
    }
    uint64_t mag = 0;
    int overflow = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        unsigned d = (unsigned)(*c->p - '0');
        if (mag > (UINT64_MAX - d) / 10) {
            overflow = 1;
        } else {
            mag = mag * 10 + d;
        }
        c->p++;
    }
    int other = overflow;
    if (c->p < c->end && *c->p == '.') {
        c->p++;
        other = 1;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            c->p++;
        }
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        c->p++;
        other = 1;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) {
            c->p++;
        }
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
            c->p++;
        }
    }
    if (v) {
        v->type = other ? JV_OTHER : JV_INT;
        v->neg = neg;
        v->mag = mag;
    }
    return 0;
}

static int skip_value(cur_t *c, int depth);

static int skip_container(cur_t *c, char close, int depth)
{
    if (depth > 32) {
        return -1;  /* a deep nest is garbage here; bounded recursion */
    }
    c->p++;
    skip_ws(c);
    if (c->p < c->end && *c->p == close) {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        if (close == '}') {
            if (read_string(c, NULL, 0) != 0) {
                return -1;
            }
            skip_ws(c);
            if (c->p >= c->end || *c->p != ':') {
                return -1;
            }
            c->p++;
            skip_ws(c);
        }
        if (skip_value(c, depth + 1) != 0) {
            return -1;
        }
        skip_ws(c);
        if (c->p >= c->end) {
            return -1;
        }
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == close) {
            c->p++;
            return 0;
        }
        return -1;
    }
}

static int skip_word(cur_t *c, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) {
        return -1;
    }
    c->p += n;
    return 0;
}

static int skip_value(cur_t *c, int depth)
{
    if (c->p >= c->end) {
        return -1;
    }
    switch (*c->p) {
    case '"': return read_string(c, NULL, 0);
    case '{': return skip_container(c, '}', depth);
    case '[': return skip_container(c, ']', depth);
    case 't': return skip_word(c, "true");
    case 'f': return skip_word(c, "false");
    case 'n': return skip_word(c, "null");
    default: return read_number(c, NULL);
    }
}

/* An array: of integers only it is JV_INTS, anything else JV_OTHER. */
static int read_array(cur_t *c, jval_t *v)
{
    cur_t start = *c;
    c->p++;
    v->type = JV_INTS;
    v->nints = 0;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return 0;
    }
    for (;;) {
        skip_ws(c);
        jval_t num;
        if (c->p < c->end && (*c->p == '-' || (*c->p >= '0' && *c->p <= '9'))) {
            if (read_number(c, &num) != 0) {
                return -1;
            }
            if (num.type != JV_INT || num.mag > (uint64_t)INT64_MAX) {
                v->type = JV_OTHER;
            } else if (v->nints < JV_INTS_MAX) {
                v->ints[v->nints++] = num.neg ? -(int64_t)num.mag : (int64_t)num.mag;
            }
        } else {
            *c = start;
            v->type = JV_OTHER;
            return skip_value(c, 0);
        }
        skip_ws(c);
        if (c->p >= c->end) {
            return -1;
        }
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == ']') {
            c->p++;
            return 0;
        }
        return -1;
    }
}

int dshim_flat_json_parse(const char *line, size_t len, dshim_flat_json_cb cb, void *ctx, jval_t *v)
{
    cur_t c = {line, line + len};
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') {
        return -1;
    }
    c.p++;
    skip_ws(&c);
    if (c.p < c.end && *c.p == '}') {
        c.p++;
        skip_ws(&c);
        return c.p == c.end ? 0 : -1;
    }
    for (;;) {
        char key[32];
        skip_ws(&c);
        if (read_string(&c, key, sizeof(key)) != 0) {
            return -1;
        }
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':') {
            return -1;
        }
        c.p++;
        skip_ws(&c);
        if (c.p >= c.end) {
            return -1;
        }
        v->type = JV_NONE;
        int rc;
        if (*c.p == '"') {
            v->type = JV_STR;
            rc = read_string(&c, v->s, sizeof(v->s));
        } else if (*c.p == '[') {
            rc = read_array(&c, v);
        } else if (*c.p == '-' || (*c.p >= '0' && *c.p <= '9')) {
            rc = read_number(&c, v);
        } else {
            v->type = JV_OTHER;
            rc = skip_value(&c, 0);
        }
        if (rc != 0) {
            return -1;
        }
        cb(ctx, key, v);
        skip_ws(&c);
        if (c.p >= c.end) {
            return -1;
        }
        if (*c.p == ',') {
            c.p++;
            continue;
        }
        if (*c.p == '}') {
            c.p++;
            skip_ws(&c);
            return c.p == c.end ? 0 : -1;
        }
        return -1;
    }
}
