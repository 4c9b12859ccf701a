"""TCP ports for the listeners a test starts (rendezvous stores, schedulers).

Ports come from 20000-31999, below the kernel's ephemeral range (32768 up), for the reason
tests/common/free_port.h gives: a port the kernel picked for bind(0) can be picked again, as another
test's outgoing source port or data listener, before the test's own listener binds it.
"""
import random
import socket

FIRST_PORT = 20000
PORT_COUNT = 12000

_rng = random.Random()  # seeded from os.urandom: tests side by side do not walk the range in step


def _binds(port):
    with socket.socket() as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def free_port(consecutive=1):
    """The first of `consecutive` ports that all bind on 0.0.0.0 right now."""
    for _ in range(500):
        port = FIRST_PORT + _rng.randrange(PORT_COUNT - consecutive + 1)
        if all(_binds(p) for p in range(port, port + consecutive)):
            return port
    raise RuntimeError(f"no {consecutive} free consecutive TCP ports in {FIRST_PORT}-{FIRST_PORT + PORT_COUNT - 1}")
