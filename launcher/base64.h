/* Base64 (RFC 4648, with padding) for what the launcher sends as text: the
 * job description on an agent's stdin (spec.c) and flight-recorder dump files
 * in frames (collect.c). */
#ifndef DSHIM_RUN_BASE64_H
#define DSHIM_RUN_BASE64_H

#include <stddef.h>

/* Encodes n bytes into out, which has room for 4 * ((n + 2) / 3) characters
 * (no NUL is written); returns the number written. */
size_t run_b64_encode(const unsigned char *in, size_t n, char *out);
/* Decodes n characters (a multiple of 4; '=' only as padding at the very
 * end) into out, which has room for n / 4 * 3 bytes; returns the number of
 * bytes, or -1 on anything else. */
long run_b64_decode(const char *in, size_t n, unsigned char *out);

#endif
