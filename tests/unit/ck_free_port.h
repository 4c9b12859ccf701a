/* test_free_port() for a Check test: a port, or the test fails saying why. */
#ifndef DSHIM_CK_FREE_PORT_H
#define DSHIM_CK_FREE_PORT_H

#include <check.h>

#include "free_port.h"

static inline int ck_free_port(void)
{
    int port = test_free_port();
    ck_assert_msg(port > 0, "no free port in 20000-31999");
    return port;
}

#endif
