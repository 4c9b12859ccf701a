#!/usr/bin/env python3
"""Writes the seed corpus of tests/fuzz (corpus/<target>/*): a few valid and a few
refused messages per target, in each harness's input format (see the comment at
the top of each fuzz_<target>.c).  Rerun after changing a format:
    python3 tests/fuzz/gen_corpus.py
Regression inputs (crash-*, named after the bug) are kept by hand beside the
seeds and are not touched here."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = b"fuzz-token"


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- store (docs/wire-protocol.md §1; little-endian) ----
SET, GET, TRY_GET, ADD, SET_IF_ABSENT, DELETE = range(1, 7)


def hello(token=TOKEN, magic=0x564B5344, version=1):
    return struct.pack("<IHHI", magic, version, 0, len(token)) + token


def req(kind, seq, key, val=b"", arg=0, klen=None, vlen=None):
    return struct.pack("<IIIIQ", kind, seq, len(key) if klen is None else klen, arg,
                       len(val) if vlen is None else vlen) + key + val


def rec(conn, data):  # fuzz_store's framing: u8 connection, u16 length, bytes
    return struct.pack("<BH", conn, len(data)) + data


def store_seeds():
    s = "store"
    write(s, "hello", rec(0, hello()))
    write(s, "every_kind", rec(0, hello() + req(SET, 1, b"a/k", b"value") + req(GET, 2, b"a/k")
                           + req(TRY_GET, 3, b"a/none") + req(ADD, 4, b"a/n", struct.pack("<q", 5))
                           + req(ADD, 5, b"a/n", struct.pack("<q", -7)) + req(SET_IF_ABSENT, 6, b"a/k", b"x")
                           + req(SET_IF_ABSENT, 7, b"a/new", b"y") + req(DELETE, 8, b"a/k")
                           + req(DELETE, 9, b"a/k")))
    write(s, "parked_get_woken", rec(0, hello()) + rec(1, hello()) + rec(0, req(GET, 1, b"c0/peer/1", arg=0xFFFFFFFF))
          + rec(1, req(SET, 1, b"c0/peer/1", b"record")) + rec(0, req(TRY_GET, 2, b"c0/peer/1")))
    write(s, "parked_get_failed", rec(0, hello()) + rec(1, hello()) + rec(0, req(GET, 1, b"c0/x", arg=100))
          + rec(1, req(SET, 1, b"c0/failed", b"rank 1 failed")) + rec(0, req(GET, 2, b"c0/y", arg=0)))
    write(s, "get_timeout", rec(0, hello()) + rec(0, req(GET, 1, b"k", arg=5)))
    write(s, "add_not_counter", rec(0, hello() + req(SET, 1, b"k", b"text") + req(ADD, 2, b"k", struct.pack("<q", 1))
                                + req(SET, 3, b"m", b"9223372036854775807") + req(ADD, 4, b"m", struct.pack("<q", 1))))
    write(s, "bad_token", rec(0, hello(b"other-token")))
    write(s, "bad_version", rec(0, hello(version=2)))
    write(s, "bad_magic", rec(0, b"GET / HTTP/1.0\r\n\r\n"))
    write(s, "token_too_long", rec(0, struct.pack("<IHHI", 0x564B5344, 1, 0, 4097)))
    write(s, "bad_kind", rec(0, hello() + req(9, 1, b"k")))
    write(s, "key_too_long", rec(0, hello() + req(SET, 1, b"", klen=4097)))
    write(s, "value_too_long", rec(0, hello() + req(SET, 1, b"k", vlen=(64 << 20) + 1)))
    write(s, "get_with_value", rec(0, hello() + req(GET, 1, b"k", b"v")))
    write(s, "add_short_delta", rec(0, hello() + req(ADD, 1, b"k", b"1234")))
    write(s, "half_request", rec(0, hello() + req(SET, 1, b"key", b"v" * 100)[:60]))


# ---- store_client: u8 n, n call codes, then the server's stream ----
OK, NOT_FOUND, EXISTS, TIMEOUT, BAD_VALUE, FAILED = range(6)


def ack(status=0, magic=0x564B5344, version=1):
    return struct.pack("<IHH", magic, version, status)


def reply(status, seq, val=b""):
    return struct.pack("<IIQ", status, seq, len(val)) + val


def client(calls, stream):
    return bytes([len(calls)]) + bytes(calls) + stream


def store_client_seeds():
    s = "store_client"
    # call codes: 0 set, 1 get, 2 try_get, 3 add, 4 set_if_absent, 5 delete
    write(s, "every_call_ok", client([0, 1, 2, 3, 4, 5], ack() + reply(OK, 1) + reply(OK, 2, b"value")
                                     + reply(OK, 3, b"v") + reply(OK, 4, struct.pack("<q", 7)) + reply(OK, 5)
                                     + reply(OK, 6)))
    write(s, "other_answers", client([2, 4, 3, 1, 1], ack() + reply(NOT_FOUND, 1) + reply(EXISTS, 2)
                                     + reply(BAD_VALUE, 3) + reply(TIMEOUT, 4) + reply(FAILED, 5, b"rank 2 failed")))
    write(s, "bad_token", client([0], ack(1)))
    write(s, "bad_version", client([0], ack(2, version=7)))
    write(s, "not_a_store", client([0], b"HTTP/1.1 400 Bad Request\r\n"))
    write(s, "wrong_seq", client([0, 0], ack() + reply(OK, 9) + reply(OK, 2)))
    write(s, "too_long", client([1], ack() + struct.pack("<IIQ", OK, 1, (64 << 20) + 1)))
    write(s, "cut_value", client([1, 0], ack() + struct.pack("<IIQ", OK, 1, 100) + b"abc"))
    write(s, "add_short", client([3], ack() + reply(OK, 1, b"12")))


# ---- bootstrap: u8 size, u8 rank, then 24-byte hellos, version 3 (host byte order: x86-64) ----
def token_hash(token, prefix):
    h = 1469598103934665603
    m = (1 << 64) - 1
    for b in token:
        h = ((h ^ b) * 1099511628211) & m
    h = ((h ^ 0xFF) * 1099511628211) & m
    for b in prefix:
        h = ((h ^ b) * 1099511628211) & m
    return h


TH = token_hash(TOKEN, b"c0/")


def dhello(rank, size, th=TH, magic=0x43485344, version=3):
    return struct.pack("<IIQii", magic, version, th, rank, size)


def bootstrap_seeds():
    s = "bootstrap"
    write(s, "valid_3", bytes([1, 0]) + dhello(1, 3) + dhello(2, 3))
    write(s, "valid_8_rank_4", bytes([6, 4]) + dhello(7, 8) + dhello(5, 8) + dhello(6, 8))
    write(s, "wrong_token", bytes([0, 0]) + dhello(1, 2, th=token_hash(b"other", b"c0/")))
    write(s, "not_a_hello", bytes([0, 0]) + b"GET / HTTP/1.0\r\n\r\nxxxxxx")
    write(s, "bad_version", bytes([0, 0]) + dhello(1, 2, version=2))
    write(s, "short", bytes([1, 0]) + dhello(1, 3)[:10])
    write(s, "rank_misfit", bytes([2, 1]) + dhello(1, 4) + dhello(4, 4) + dhello(-1, 4) + dhello(2, 5))
    write(s, "duplicate", bytes([2, 0]) + dhello(2, 4) + dhello(2, 4))


# ---- ps (docs/wire-protocol.md §7; raw struct, host byte order) ----
HELLO, ASSIGN, BARRIER, BARRIER_DONE, DEAD, BYE, WHELLO, PUSH, PULL, CMD, REPLY, ERROR, STOP = range(1, 14)
F_PULL, F_COMPRESSED, F_PIECE, F_ROWS = 1, 2, 4, 8


def hdr(type_, key=0, len_=0, flags=0, dtype=0, seq=0, nelem=0, off=0, magic=0x53505344):
    return struct.pack("<IBBHiIQQQ", magic, type_, flags, dtype, key, seq, nelem, len_, off)


def msg(type_, payload=b"", **kw):
    return hdr(type_, len_=len(payload), **kw) + payload


def whello(rank=0, token=TOKEN):
    return msg(WHELLO, token.ljust(64, b"\0"), key=rank)


def f32(*v):
    return struct.pack("<%df" % len(v), *v)


def ps_seeds():
    s = "ps"
    sync1 = bytes([1])  # sync mode, one worker
    write(s, "push_pull_sync", sync1 + whello() + msg(PUSH, f32(1, 2, 3, 4), key=3, seq=1)
          + msg(PUSH, f32(1, 1, 1, 1), key=3, seq=2, flags=F_PULL) + msg(PULL, key=3, seq=3)
          + msg(BYE))
    write(s, "async_no_updater", bytes([0]) + whello() + msg(PUSH, f32(1), key=1, seq=1)
          + msg(PUSH, f32(2), key=1, seq=2))
    write(s, "two_workers", bytes([3]) + whello(1) + msg(PUSH, f32(5, 6), key=9, seq=1)
          + msg(PUSH, f32(1, 2), key=9, seq=2) + msg(PULL, key=9, seq=3))
    write(s, "commands", sync1 + whello() + msg(CMD, b"", key=3, seq=1) + msg(CMD, b"", key=1, seq=2)
          + msg(CMD, b"x", key=4, seq=3) + msg(CMD, b"", key=5, seq=4) + msg(CMD, b"body", key=0, seq=5)
          + msg(CMD, b"", key=2, seq=6))
    write(s, "float16_master", sync1 + whello() + msg(PUSH, struct.pack("<4e", 1, 2, 3, 4), key=4, dtype=2, seq=1)
          + msg(PUSH, struct.pack("<4e", 1, 1, 1, 1), key=4, dtype=2, seq=2, flags=F_PULL))
    write(s, "twobit", sync1 + whello() + msg(PUSH, f32(*([0.0] * 16)), key=2, seq=1)
          + msg(PUSH, struct.pack("<I", 0x5555AAAA), key=2, seq=2, flags=F_COMPRESSED, nelem=16)
          + msg(PUSH, struct.pack("<I", 0x12345678), key=2, seq=3, flags=F_COMPRESSED | F_PULL, nelem=16))
    write(s, "pieces", sync1 + whello() + msg(PUSH, f32(0, 0, 0, 0, 0, 0, 0, 0), key=5, seq=1)
          + msg(PUSH, f32(1, 2, 3, 4), key=5, seq=2, flags=F_PIECE | F_PULL, nelem=8, off=0)
          + msg(PUSH, f32(5, 6, 7, 8), key=5, seq=3, flags=F_PIECE | F_PULL, nelem=8, off=4)
          + msg(PUSH, f32(1, 2, 3, 4, 5, 6, 7, 8), key=5, seq=4))
    rows = struct.pack("<q", 0) + f32(1, 2) + struct.pack("<q", 2) + f32(3, 4)
    write(s, "rows", sync1 + whello() + msg(PUSH, rows, key=7, seq=1, flags=F_ROWS, nelem=4, off=2)
          + msg(PUSH, struct.pack("<q", 1) + f32(9, 9), key=7, seq=2, flags=F_ROWS, nelem=4, off=2)
          + msg(PULL, struct.pack("<qq", 0, 3), key=7, seq=3, flags=F_ROWS, nelem=4, off=2)
          + msg(PUSH, f32(1, 2, 3, 4, 5, 6, 7, 8), key=7, seq=4))
    write(s, "refused", sync1 + whello() + msg(PULL, key=8, seq=1) + msg(PUSH, f32(1), key=8, dtype=99, seq=2)
          + msg(PUSH, f32(1), key=8, seq=3) + msg(PUSH, f32(1, 2), key=8, seq=4) + msg(BARRIER, key=4))
    write(s, "bad_token", sync1 + whello(token=b"other-token") + msg(PUSH, f32(1), key=1))
    write(s, "bad_magic", sync1 + b"GET / HTTP/1.0\r\n\r\n" + b"\0" * 80)
    write(s, "worker_out_of_range", sync1 + whello(rank=5))
    # regressions: a length of 2^64 - 1 after a first message (the receive buffer's size
    # wrapped to 0 and the body ran past it), and a row of 2^64 - 8 bytes (a division by 0)
    write(s, "regress_len_wrap", sync1 + whello() + msg(PUSH, f32(1), key=1, seq=1)
          + hdr(PUSH, key=1, seq=2, len_=(1 << 64) - 1) + b"\xab" * 200)
    write(s, "regress_rows_shape_wrap", sync1 + whello()
          + msg(PUSH, struct.pack("<q", 0) + b"\0" * 8, key=7, seq=1, flags=F_ROWS, dtype=1, nelem=1,
                off=(1 << 61) - 1))
    # regression: a float32 push of 6 bytes (its copy overran the 4-byte key)
    write(s, "regress_ragged_push", sync1 + whello() + msg(PUSH, b"\0\0\x80\x3f\0\0", key=3, seq=1)
          + msg(PUSH, b"\0\0\x80\x3f\0\0", key=3, seq=2))


def ps_worker_seeds():
    s = "ps_worker"
    # n requests: seq i expects 16*i bytes when i is odd, nothing when even; seq 3 refusable
    write(s, "replies", bytes([4]) + msg(REPLY, b"\1" * 16, seq=1) + msg(REPLY, seq=2)
          + msg(REPLY, b"\3" * 48, seq=3) + msg(REPLY, seq=4))
    write(s, "refused_command", bytes([3]) + msg(ERROR, b"this server has no profiler", seq=3)
          + msg(REPLY, b"\1" * 16, seq=1) + msg(REPLY, seq=2))
    write(s, "error_fails_job", bytes([2]) + msg(ERROR, b"key 3: bad dtype", seq=2))
    write(s, "wrong_size", bytes([1]) + msg(REPLY, b"\1" * 8, seq=1))
    write(s, "unknown_seq", bytes([2]) + msg(REPLY, b"x" * 5, seq=77) + msg(DEAD, b"who", seq=1)
          + msg(REPLY, b"\1" * 16, seq=1))
    write(s, "bad_magic", bytes([1]) + b"\0" * 40)
    write(s, "cut_body", bytes([1]) + hdr(REPLY, seq=1, len_=16) + b"\1" * 5)


if __name__ == "__main__":
    store_seeds()
    store_client_seeds()
    bootstrap_seeds()
    ps_seeds()
    ps_worker_seeds()
