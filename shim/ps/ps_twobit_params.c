/* The parameters of MXNet's 2-bit gradient compression (ps_twobit.h): the user's
 * key/value strings, as GradientCompression::SetParams validates them, and the
 * "type,threshold" text that a 'dist' worker sends its servers (EncodeParams and
 * DecodeParams).  MXNet 1.9.1: src/kvstore/gradient_compression.{h,cc}; the float
 * parser is dmlc-core's (include/dmlc/strtonum.h, as shipped in the MXNet wheel). */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dshim.h"
#include "ps_twobit.h"
#include "status.h"

typedef enum {
    FLOAT_OK,
    FLOAT_NO_CONVERSION,  /* nothing consumed: std::invalid_argument */
    FLOAT_OUT_OF_RANGE,   /* exponent beyond float's: std::out_of_range */
    FLOAT_BAD_NAN,        /* "nan(" without ")": a dmlc CHECK failure */
} float_parse_t;

static int dmlc_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f';
}
static int dmlc_digit(char c)
{
    return c >= '0' && c <= '9';
}
static int dmlc_alpha(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Case-insensitive length of the prefix of `s` matching `word` (no reads past a NUL). */
static size_t match_word(const char *s, const char *word)
{
    size_t i = 0;
    while (word[i] != '\0' && (char)(s[i] | 32) == word[i]) {
        i++;
    }
    return i;
}

/* dmlc::stof as dmlc::Parameter runs it for a float field.  It is not a correctly rounded
 * strtof: integer part, fraction (first 19 digits, divided in double) and a power of ten
 * built by float multiplications are combined in float, so e.g. "1e-12" can land an ulp
 * away from strtof's.  Doing the same steps gives the threshold MXNet's worker uses. */
static float_parse_t parse_float_dmlc(const char *s, float *value, size_t *consumed)
{
    const char *p = s;
    while (dmlc_space(*p)) {
        p++;
    }
    int negative = 0;
    if (*p == '-') {
        negative = 1;
        p++;
    } else if (*p == '+') {
        p++;
    }
    size_t inf_len = match_word(p, "infinity");
    if (inf_len == 3 || inf_len == 8) {
        *value = negative ? -INFINITY : INFINITY;
        *consumed = (size_t)(p + inf_len - s);
        return FLOAT_OK;
    }
    if (match_word(p, "nan") == 3) {
        p += 3;
        if (*p == '(') {
            p++;
            while (dmlc_digit(*p) || dmlc_alpha(*p) || *p == '_') {
                p++;
            }
            if (*p != ')') {
                return FLOAT_BAD_NAN;
            }
            p++;
        }
        *value = NAN;  /* dmlc returns quiet_NaN() whatever the sign */
        *consumed = (size_t)(p - s);
        return FLOAT_OK;
    }
    uint64_t predec = 0;
    for (; dmlc_digit(*p); p++) {
        predec = predec * 10u + (uint64_t)(*p - '0');
    }
    float v = (float)predec;
    if (*p == '.') {
        uint64_t pow10 = 1, frac_digits = 0;
        int count = 0;
        for (p++; dmlc_digit(*p); p++, count++) {
            if (count < 19) {
                frac_digits = frac_digits * 10u + (uint64_t)(*p - '0');
                pow10 *= 10u;
            }
        }
        v += (float)((double)frac_digits / (double)pow10);
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        int frac = 0;
        if (*p == '-') {
            frac = 1;
            p++;
        } else if (*p == '+') {
            p++;
        }
        unsigned expon = 0;
        for (; dmlc_digit(*p); p++) {
            expon = expon * 10u + (unsigned)(*p - '0');
        }
        if (expon > 38u) {
            return FLOAT_OUT_OF_RANGE;
        }
        if (expon == 38u && ((!frac && v > (float)3.402823466) ||
                             (frac && v < (float)1.175494351))) {
            return FLOAT_OUT_OF_RANGE;
        }
        float scale = 1.0f;
        for (; expon >= 8u; expon -= 8u) {
            scale *= 1E8f;
        }
        for (; expon > 0u; expon--) {
            scale *= 10.0f;
        }
        v = frac ? v / scale : v * scale;
    }
    if (*p == 'f' || *p == 'F') {
        p++;
    }
    if (p == s) {
        return FLOAT_NO_CONVERSION;
    }
    *value = negative ? -v : v;
    *consumed = (size_t)(p - s);
    return FLOAT_OK;
}

/* dmlc's FieldEntry<float>::Set for "threshold": the whole text must be a float. */
static int parse_threshold(const char *text, float *threshold)
{
    size_t consumed = 0;
    switch (parse_float_dmlc(text, threshold, &consumed)) {
    case FLOAT_OK:
        break;
    case FLOAT_OUT_OF_RANGE:
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: threshold '%s' is out of float's range "
                           "(MXNet rejects it too); pass a positive float such as 0.5",
                           text);
    case FLOAT_NO_CONVERSION:
    case FLOAT_BAD_NAN:
    default:
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: threshold '%s' is not a float (MXNet rejects "
                           "it too); pass a positive float such as 0.5",
                           text);
    }
    if (text[consumed] != '\0') {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: threshold '%s' has trailing characters '%s' "
                           "(MXNet rejects it too); pass a positive float such as 0.5",
                           text, text + consumed);
    }
    return DSHIM_OK;
}

int dshim_twobit_parse(uint32_t num, const char *const *keys, const char *const *vals,
                       float *threshold, int *enabled)
{
    if (num > 0 && (keys == NULL || vals == NULL)) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: %u parameters but no key or value array",
                           num);
    }
    const char *type = NULL;
    float value = DSHIM_TWOBIT_DEFAULT_THRESHOLD;
    /* in the caller's order, a repeated key counting last, as dmlc's parameter init */
    for (uint32_t i = 0; i < num; i++) {
        if (keys[i] == NULL || vals[i] == NULL) {
            return dshim_error(DSHIM_ERR_INVALID,
                               "gradient compression: parameter %u has a NULL key or value", i);
        }
        if (strcmp(keys[i], "type") == 0) {
            type = vals[i];
        } else if (strcmp(keys[i], "threshold") == 0) {
            DSHIM_CHECK(parse_threshold(vals[i], &value));
        } else {
            /* MXNet's InitAllowUnknown ignores other keys */
            DSHIM_INFO("gradient compression: ignoring unknown parameter '%s' (as MXNet does)",
                       keys[i]);
        }
    }
    if (type == NULL) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: no 'type' given; pass {'type': '2bit'} "
                           "(optionally with 'threshold')");
    }
    if (!(value > 0.0f)) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: threshold must be greater than 0, got %g; "
                           "pass a positive float such as 0.5", (double)value);
    }
    if (strcmp(type, "2bit") != 0) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: unknown type '%s': MXNet 1.9.1 supports only "
                           "'2bit' (to train uncompressed, do not set gradient compression)",
                           type);
    }
    *threshold = value;
    *enabled = 1;
    return DSHIM_OK;
}

int dshim_twobit_encode_params(int enabled, float threshold, char *buf, size_t cap)
{
    /* std::to_string(int) then "," + std::to_string(float), which is "%f" of the double */
    int len = enabled ? snprintf(buf, cap, "1,%f", (double)threshold) : snprintf(buf, cap, "0");
    if (len < 0 || (size_t)len >= cap) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: %zu bytes are too few for the parameter text "
                           "(use DSHIM_TWOBIT_PARAMS_MAX)", cap);
    }
    return len;
}

/* std::stoi: strtol's syntax (leading space, sign, digits, the rest ignored), int range. */
static int decode_type(const char *item, const char *body, int *type)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(item, &end, 10);
    if (end == item || errno == ERANGE || v < INT_MIN || v > INT_MAX) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: parameter text '%s' does not start with a "
                           "type number (expected '1,<threshold>' or '0')", body);
    }
    *type = (int)v;
    return DSHIM_OK;
}

/* std::stof: strtof's syntax, the rest ignored; ERANGE is an error. */
static int decode_threshold(const char *item, const char *body, float *threshold)
{
    char *end = NULL;
    errno = 0;
    float v = strtof(item, &end);
    if (end == item || errno == ERANGE) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: parameter text '%s' has no valid threshold "
                           "after the comma (expected '1,<threshold>')", body);
    }
    *threshold = v;
    return DSHIM_OK;
}

int dshim_twobit_decode_params(const char *body, float *threshold, int *enabled)
{
    if (body == NULL || body[0] == '\0') {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: empty parameter text (expected "
                           "'1,<threshold>' or '0')");
    }
    /* MXNet splits on ',' with std::getline: items are the text between commas, and a
     * final empty item (after a trailing comma) does not count */
    char first[64], second[64];
    const char *comma = strchr(body, ',');
    size_t first_len = comma ? (size_t)(comma - body) : strlen(body);
    const char *rest = comma ? comma + 1 : "";
    size_t second_len = strcspn(rest, ",");
    if (first_len >= sizeof(first) || second_len >= sizeof(second)) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: parameter text '%.80s' is too long "
                           "(expected '1,<threshold>' or '0')", body);
    }
    memcpy(first, body, first_len);
    first[first_len] = '\0';
    memcpy(second, rest, second_len);
    second[second_len] = '\0';

    int type = 0;
    DSHIM_CHECK(decode_type(first, body, &type));
    if (type != 0 && type != 1) {
        return dshim_error(DSHIM_ERR_INVALID,
                           "gradient compression: parameter text '%s' names type %d; MXNet "
                           "1.9.1 knows 0 (none) and 1 (2bit)", body, type);
    }
    float value = *threshold;
    if (second_len > 0) {
        DSHIM_CHECK(decode_threshold(second, body, &value));
    }
    *threshold = value;
    *enabled = type;
    return DSHIM_OK;
}

float dshim_twobit_server_threshold(float t)
{
    char text[DSHIM_TWOBIT_PARAMS_MAX];
    /* "%f" of any float fits: at most 39 integer digits, sign, point and 6 decimals */
    snprintf(text, sizeof(text), "%f", (double)t);
    return strtof(text, NULL);
}
