/* The rule for files and directories in shared places (private_fs.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "private_fs.h"

const char *dshim_tmpdir(void)
{
    const char *t = dshim_config()->tmpdir;
    return (t && t[0] == '/') ? t : "/tmp";
}

int dshim_private_mkdtemp(const char *stem, char *out, size_t len)
{
    /* mkdtemp: a name nobody could guess before, made with O_EXCL semantics and mode 0700 */
    int n = snprintf(out, len, "%s/%s.XXXXXX", dshim_tmpdir(), stem);
    if (n < 0 || (size_t)n >= len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    return mkdtemp(out) ? 0 : -1;
}

int dshim_private_dir(const char *path, int make)
{
    if (make && mkdir(path, 0700) != 0 && errno != EEXIST) {
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) != 0) {
        return -1;
    }
    /* a link, or anything another user made, is not ours: whoever owns it
     * could read or replace what we would put there */
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid()) {
        errno = EEXIST;
        return -1;
    }
    if ((st.st_mode & 077) != 0 && chmod(path, 0700) != 0) {
        return -1;
    }
    return 0;
}

int dshim_make_dirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf) || buf[0] == '\0') {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char ch = *p;
            *p = '\0';
            if (mkdir(buf, 0700) != 0 && errno != EEXIST) {
                return -1;  /* the real cause (EACCES, EROFS), not the ENOENT a later stat would say */
            }
            *p = ch;
            if (ch == '\0') {
                break;
            }
        }
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

int dshim_private_open(const char *path, int how)
{
    /* no O_TRUNC here: a file is emptied only after it proved to be ours;
     * O_NONBLOCK: a planted fifo must not block the open */
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK |
                  (how == DSHIM_OPEN_APPEND ? O_APPEND : 0), 0600);
    if (fd < 0) {
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() || st.st_nlink != 1) {
        close(fd);
        errno = EEXIST;
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || (how == DSHIM_OPEN_TRUNC && ftruncate(fd, 0) != 0)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

const char *dshim_private_why(int err)
{
    if (err == ELOOP) {
        return "a symbolic link is there (not followed)";
    }
    if (err == EEXIST) {
        return "something that is not this user's own file or directory is there (another user's, a link)";
    }
    return strerror(err);
}

int dshim_read_secret_file(const char *path, char *out, size_t len, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, whylen, "cannot read %s: %s", path, dshim_private_why(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid()) {
        close(fd);
        snprintf(why, whylen, "%s is not a regular file of this user", path);
        return -1;
    }
    if ((st.st_mode & 077) != 0) {
        /* a secret others can read keeps nobody out */
        close(fd);
        snprintf(why, whylen, "%s is readable by group or others (mode %03o); chmod 600 %s", path,
                 (unsigned)(st.st_mode & 0777), path);
        return -1;
    }
    ssize_t n = read(fd, out, len - 1);
    close(fd);
    if (n < 0) {
        snprintf(why, whylen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    out[n] = '\0';
    size_t line = strcspn(out, "\r\n");
    if (line == (size_t)n && (size_t)n == len - 1) {
        snprintf(why, whylen, "%s: the secret is longer than %zu bytes", path, len - 2);
        return -1;
    }
    out[line] = '\0';
    if (out[0] == '\0') {
        snprintf(why, whylen, "%s is empty; put the job's secret on its first line", path);
        return -1;
    }
    return 0;
}
