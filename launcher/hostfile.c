/*
 * Hostfiles as the dmlc tracker reads them: one "host[:port]" per line
 * (port = ssh port), "slots=N" kept (--horovod-env places that many ranks on
 * the host; otherwise it means nothing), '#' starts a comment.
 * Unlike the tracker we refuse anything odd with the file and line named,
 * because a silently skipped host is a job that hangs at rendezvous.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "run.h"

bool run_host_name_ok(const char *name)
{
    /* [user@]host: letters, digits, '.', '-', '_'; never a leading '-' (ssh would
     * read it as an option). */
    if (name[0] == '\0' || name[0] == '-' || name[0] == '@') {
        return false;
    }
    int ats = 0;
    for (const char *p = name; *p; p++) {
        if (*p == '@') {
            if (++ats > 1 || p[1] == '\0' || p[1] == '-') {
                return false;
            }
            continue;
        }
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-' && *p != '_') {
            return false;
        }
    }
    return true;
}

static bool host_is_local(const char *name)
{
    const char *at = strchr(name, '@');
    const char *host = at ? at + 1 : name;
    if (strcmp(host, "localhost") == 0) {
        return true;
    }
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0) {
        return false;
    }
    struct in_addr want = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    if ((ntohl(want.s_addr) >> 24) == 127) {
        return true;
    }
    struct ifaddrs *ifs = NULL;
    bool local = false;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == want.s_addr) {
                local = true;
                break;
            }
        }
        freeifaddrs(ifs);
    }
    return local;
}

static void trim(char *s)
{
    char *h = strchr(s, '#');
    if (h) {
        *h = '\0';
    }
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) {
        s[--n] = '\0';
    }
}

static const char *usage_hint = "each line is host or host:port (ssh port), optionally followed by slots=N";

static void parse_line(const char *path, int lineno, char *line, run_host_t *h)
{
    char *save = NULL;
    char *tok = strtok_r(line, " \t", &save);
    char *entry = tok;
    h->slots = -1;
    while ((tok = strtok_r(NULL, " \t", &save)) != NULL) {
        char *end = NULL;
        long slots = 0;
        if (strncmp(tok, "slots=", 6) != 0 || tok[6] == '\0' || (slots = strtol(tok + 6, &end, 10), *end != '\0')) {
            run_usage_error("hostfile '%s' line %d: unexpected '%s'; %s", path, lineno, tok, usage_hint);
        }
        /* checked where it counts (--horovod-env, plan.c); clamped so that it fits an int */
        h->slots = slots < 0 ? 0 : slots > 1000000 ? 1000000 : (int)slots;
    }
    char *colon = strchr(entry, ':');
    h->port = 0;
    if (colon) {
        *colon = '\0';
        char *end = NULL;
        errno = 0;
        long port = strtol(colon + 1, &end, 10);
        if (colon[1] == '\0' || *end != '\0' || errno || port < 1 || port > 65535) {
            run_usage_error("hostfile '%s' line %d: '%s' is not a port (1-65535); %s", path, lineno, colon + 1,
                            usage_hint);
        }
        h->port = (int)port;
    }
    if (!run_host_name_ok(entry)) {
        run_usage_error("hostfile '%s' line %d: '%s' is not a host name (letters, digits, '.', '-', '_', "
                        "optionally user@); %s", path, lineno, entry, usage_hint);
    }
    h->name = run_xstrdup(entry);
    h->local = host_is_local(entry);
}

void run_read_hostfile(const char *path, run_host_t **hosts_p, int *nhosts_p)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        run_usage_error("cannot read hostfile '%s': %s; pass an existing, readable file to -H/--hostfile", path,
                        strerror(errno));
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        run_usage_error("hostfile '%s' is a directory; pass the file listing the hosts to -H/--hostfile", path);
    }
    run_host_t *hosts = NULL;
    int n = 0;
    int lineno = 0;
    int blank_line = 0;  /* first blank line not yet followed by a host */
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        bool comment_only = strchr(line, '#') != NULL;
        trim(line);
        char *s = line;
        while (isspace((unsigned char)*s)) {
            s++;
        }
        if (*s == '\0') {
            if (!comment_only && blank_line == 0) {
                blank_line = lineno;
            }
            continue;
        }
        if (blank_line) {
            /* A blank line between hosts is usually a mangled file (a lost host
             * name); trailing blank lines are harmless and allowed. */
            run_usage_error("hostfile '%s' line %d is empty; remove blank lines between hosts (%s)", path,
                            blank_line, usage_hint);
        }
        hosts = realloc(hosts, (size_t)(n + 1) * sizeof(*hosts));
        if (hosts == NULL) {
            run_usage_error("out of memory reading hostfile '%s'", path);
        }
        parse_line(path, lineno, s, &hosts[n]);
        n++;
    }
    bool read_error = ferror(f);
    free(line);
    fclose(f);
    if (read_error) {
        run_usage_error("cannot read hostfile '%s': read error; check the file", path);
    }
    if (n == 0) {
        run_usage_error("hostfile '%s' lists no hosts; %s", path, usage_hint);
    }
    *hosts_p = hosts;
    *nhosts_p = n;
}
