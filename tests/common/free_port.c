/* Test listener ports below the ephemeral range (see free_port.h). */
#include "free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FIRST_PORT 20000
#define PORT_COUNT 12000

int test_free_port(void)
{
    static unsigned seed;
    if (seed == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = ((unsigned)getpid() * 2654435761u) ^ (unsigned)ts.tv_nsec;
    }
    for (int tries = 0; tries < 200; tries++) {
        int port = FIRST_PORT + (int)(rand_r(&seed) % PORT_COUNT);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            return -1;
        }
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_ANY)};
        int ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        close(fd);
        if (ok) {
            return port;
        }
    }
    return -1;
}

int test_listen_addr(int port, char *buf, unsigned len)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    if (!f) {
        return -1;
    }
    char line[512];
    int found = -1;
    while (found < 0 && fgets(line, sizeof(line), f)) {
        unsigned ip, lport, st;
        /* "  sl  local_address rem_address   st ...": hex ip (host order of the
         * kernel's u32, i.e. network bytes read little-endian), hex port */
        if (sscanf(line, " %*d: %8x:%4x %*8x:%*4x %2x", &ip, &lport, &st) == 3 && (int)lport == port &&
            st == 0x0A) {
            struct in_addr a = {.s_addr = ip};
            inet_ntop(AF_INET, &a, buf, len);
            found = 0;
        }
    }
    fclose(f);
    return found;
}
