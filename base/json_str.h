/* JSON strings, written one way everywhere dshim writes JSON (flight-recorder
 * dumps, the timeline, dshim-run's merged timeline and process table).
 *
 * The strings come from frameworks and users (tensor names, labels, host
 * names, command lines): any byte may appear, and one stray byte must not
 * make a whole line unreadable.  So: `"` and `\` escaped, \n \t \r by their
 * short forms, every other control byte as \u00XX, valid UTF-8 copied as it
 * is, and each byte that does not start a valid UTF-8 sequence (Latin-1, a
 * character cut in half) as \ufffd. */
#ifndef DSHIM_JSON_STR_H
#define DSHIM_JSON_STR_H

#include <stddef.h>
#include <stdio.h>

/* The escaped text of s (NULL: "") into out, without the quotes, cut
 * before an escape or a character that does not fit, NUL-terminated;
 * returns its length.  cap 0 writes nothing. */
size_t dshim_json_escape(char *out, size_t cap, const char *s);

/* The escaped text of s (NULL: "") to f, without the quotes, whole. */
void dshim_json_write(FILE *f, const char *s);

#endif
