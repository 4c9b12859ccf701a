/* Base64 (see base64.h). */
#include "base64.h"

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t run_b64_encode(const unsigned char *in, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        if (i + 1 < n) {
            v |= (unsigned)in[i + 1] << 8;
        }
        if (i + 2 < n) {
            v |= in[i + 2];
        }
        out[o++] = b64chars[(v >> 18) & 63];
        out[o++] = b64chars[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64chars[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64chars[v & 63] : '=';
    }
    return o;
}

static int b64_val(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }
    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }
    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

long run_b64_decode(const char *in, size_t n, unsigned char *out)
{
    size_t o = 0;
    if (n % 4 != 0) {
        return -1;
    }
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            unsigned char ch = (unsigned char)in[i + k];
            /* '=' only in the last two places of the last quantum */
            v[k] = ch == '=' && k >= 2 && i + 4 == n ? 0 : b64_val(ch);
            if (v[k] < 0) {
                return -1;
            }
        }
        if (in[i + 2] == '=' && in[i + 3] != '=') {
            return -1;
        }
        unsigned w = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 | (unsigned)v[3];
        out[o++] = (unsigned char)(w >> 16);
        if (in[i + 2] != '=') {
            out[o++] = (unsigned char)(w >> 8);
        }
        if (in[i + 3] != '=') {
            out[o++] = (unsigned char)w;
        }
    }
    return (long)o;
}
