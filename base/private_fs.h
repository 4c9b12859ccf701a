/*
 * THE rule for files and directories dshim makes where another local user
 * may have been first (/tmp, $TMPDIR, a shared DSHIM_TRACE_DIR, a --log-dir):
 * used by the launcher (job directory, logs, dumps, timelines, the mpirun
 * host file, the status directory) and by the library (flight-recorder
 * dumps, timeline part files, DSHIM_DEBUG_FILE).
 *
 *   - a directory dshim names itself in a shared place is unpredictable
 *     (mkdtemp) or, when it must be found again by name (the status
 *     directory of a user), checked: a directory, no link, this user's,
 *     nobody else may enter it;
 *   - a file is opened without following a symbolic link on its last
 *     component (O_NOFOLLOW), created with mode 0600, and written only when
 *     it is a regular file of this user with one name: a file planted by
 *     someone else (or a hard link to one) is refused, never written into.
 *
 * Errors: -1 with errno; dshim_private_why() words the two refusals.
 */
#ifndef DSHIM_PRIVATE_FS_H
#define DSHIM_PRIVATE_FS_H

#include <stddef.h>

/* $TMPDIR when it is an absolute path, else /tmp (as Python's tempfile and so torchrun do). */
const char *dshim_tmpdir(void);

/* Makes $TMPDIR/<stem>.XXXXXX (mode 0700, random suffix) and writes its path to out. 0 or -1. */
int dshim_private_mkdtemp(const char *stem, char *out, size_t len);

/* 0 when path is a directory of this user that no one else may enter and
 * not a link; an own directory with looser permissions is tightened to 0700.
 * With make: created (mode 0700) first when missing.  Else -1 with errno
 * (EEXIST: something of another user, or a link, is there). */
int dshim_private_dir(const char *path, int make);

/* mkdir -p: the missing components get mode 0700 (existing ones are the
 * user's choice and stay as they are).  0, or -1 with errno of the first
 * component that could not be made (EACCES, EROFS, ENOTDIR, ...). */
int dshim_make_dirs(const char *path);

#define DSHIM_OPEN_TRUNC 0   /* start the file afresh */
#define DSHIM_OPEN_APPEND 1  /* keep what is there and append */

/* Opens path for writing under the rule above; a file descriptor (O_CLOEXEC)
 * or -1 with errno (ELOOP: a symbolic link is there; EEXIST: a file that
 * is not this user's regular file with one name is there). */
int dshim_private_open(const char *path, int how);

/* Words errno from the calls above: the two refusals by what they found. */
const char *dshim_private_why(int err);

/* Reads a secret (the job token) from a file only this user can read: a
 * regular file of this user, no link, no permission for group or others.
 * The first line without its line end goes to out.  0, or -1 with a
 * one-line reason in why (e.g. "... is readable by others; chmod 600 ..."). */
int dshim_read_secret_file(const char *path, char *out, size_t len, char *why, size_t whylen);

#endif
