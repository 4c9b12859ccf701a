/* Test listener ports below the ephemeral range (see free_port.h). */
#include "free_port.h"

#include <netinet/in.h>
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
