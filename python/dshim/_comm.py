"""One dshim communicator per torch process group: its rendezvous through the
torch store and its completion thread.

Timeouts, the ranks that never reached a collective, dead peers and
mismatches are decided and worded by the C core (the group's timeout is the
communicator's, dshim_comm_set_timeout); an operation's RuntimeError is the
core's verdict led by torch's name of the operation.  Only the rendezvous,
which waits in torch's store before any dshim communicator exists, keeps a
timeout of its own here.

Asynchronous operations are issued with the non-blocking dshim_i* calls and
return at once; dshim completes the requests of one communicator in issue
order, and one completion thread per communicator waits for them in that
order and completes the torch Futures (ctypes releases the GIL while it
waits).  Synchronous ones run the blocking dshim call in the caller's thread.

Each dshim call is preceded by dshim_trace_label(label) in the thread that
makes it (the label of the flight recorder's entry: which torch call it came
from; process_group.py chooses it): the C core takes this thread's label at
the next submission.
"""
import atexit
import collections
import ctypes
import datetime
import hashlib
import os
import queue
import secrets
import sys
import threading
import time

import torch

from . import _lib

from ._log import log  # noqa: E402  (never propagates to the root logger)

_Future = torch.futures.Future
_byref = ctypes.byref
_c_void_p = ctypes.c_void_p


# --------------------------------------------------------------------------
# rendezvous
# --------------------------------------------------------------------------

def _store_host(store):
    """The host of the TCPStore under (Prefix)Store wrappers, or None."""
    for _ in range(16):
        host = getattr(store, "host", None)
        if isinstance(host, str) and host:
            return host
        nxt = getattr(store, "underlying_store", None)
        if nxt is None or nxt is store:
            return None
        store = nxt
    return None


def _my_address(store):
    """The IPv4 address under which the other ranks reach this host, as the C
    core chooses it for its own connections (dshim_host_address: the named
    interface, else the route to the job's master): one rule for both.  The
    master is the torch store's host (what this rank already reaches; under
    env:// it is MASTER_ADDR as the script left it, even when the script set
    os.environ after dshim was loaded), else MASTER_ADDR from dshim's
    configuration table (a store with no host: FileStore, HashStore)."""
    lib = _lib.lib()
    buf = ctypes.create_string_buffer(256)
    master = _store_host(store) or ""
    if not master and lib.dshim_config_get(b"MASTER_ADDR", buf, len(buf)) == 0:
        master = buf.value.decode()
    if lib.dshim_host_address(master.encode(), buf, len(buf)) != 0:
        raise RuntimeError(f"dshim: cannot choose the address the other ranks reach this host at "
                           f"(master {master!r}): {_lib.last_error()}; set MASTER_ADDR to an IPv4 "
                           f"address of rank 0's host") from None
    return buf.value.decode()


def _prebind_store(token, addr):
    """Rank 0 binds its dshim store on a free port now, before publishing the
    port: no other process can take it between the choice and the bind.  It
    listens only at addr (what the others are told), not on every interface."""
    lib = _lib.lib()
    port = ctypes.c_int(0)
    if lib.dshim_store_prebind_at(addr.encode(), 0, token.encode(), ctypes.byref(port)) < 0:
        raise RuntimeError(f"dshim: rank 0: cannot host the rendezvous store: {_lib.last_error()}")
    return port.value


class _Group:
    """What a torch group is, as every member must see it: its name (torch's group_name, the
    prefix of its store), its members as job ranks, and how many groups with these members this
    process created before it.  The rendezvous keys carry the members and that count, so a rank
    can only ever meet ranks that created the same group; ranks that created groups in different
    orders (gloo then sums the wrong ranks) are found through each rank's creation log in the
    job's store and fail at once, all of them, naming what each rank created."""

    def __init__(self, name, members, me, world, default):
        self.name = str(name)
        self.members = [int(m) for m in members]
        self.me = me            # this process's job rank
        self.world = world      # the store under the groups' prefixes (creation logs), or None
        self.default = default  # torch's default group: it starts a new incarnation of the job's groups
        self.digest = hashlib.sha1(",".join(map(str, self.members)).encode()).hexdigest()[:12]
        # a store outlives destroy_process_group (torchrun's agent store, a script's own): the logs
        # of the sub-groups are those of the current default group, named by its token
        self.epoch = "world" if default or _world_epoch[0] is None else _world_epoch[0]
        self.count = None       # set by log_creation

    @classmethod
    def of(cls, store, rank, size, name=None, members=None):
        """members: torch's global_ranks_in_group ([] for the default group); None when torch
        did not say (its legacy creator interface): then neither logs nor conflicts."""
        default = not members
        if members is None:
            return cls("?" if name is None else name, range(size), rank, None, False)
        if default:
            members = list(range(size))
        return cls("0" if name is None else name, members, members[rank], _world_store(store), default)

    def tag(self):
        return f"{self.digest}.{self.count or 1}"

    def joined_key(self, group_rank):
        return f"dshim/joined/{self.tag()}/{group_rank}"

    def bootstrap_key(self):
        return f"dshim/bootstrap/{self.tag()}"

    def readers_key(self):
        return f"dshim/bootstrap_readers/{self.tag()}"

    def log_creation(self):
        """Counts the groups with these members this rank created so far and, for a sub-group,
        appends (name, members) to its creation log.  Without a job store (a store torch did not
        prefix) the count is this process's own."""
        w = self.world
        if w is None:
            _local_counts[self.digest] = _local_counts.get(self.digest, 0) + 1
            self.count = _local_counts[self.digest]
            return
        base = f"dshim/groups/{self.epoch}/{self.me}"
        self.count = w.add(f"{base}/count/{self.digest}", 1)
        if not self.default:
            i = w.add(f"{base}/n", 1)
            w.set(f"{base}/{i}", f"{self.name} {','.join(map(str, self.members))}")

    def describe(self):
        return f"{self.name} {self.members}"


_local_counts = {}
_world_epoch = [None]   # the token of this process's current default group (_Group.epoch)
_CONFLICT_KEY = "dshim/group_conflict"


def _world_store(store):
    """The store under torch's PrefixStore("<device>/", PrefixStore("<group name>/", W)): W,
    which every group of the job shares; None when the store is not wrapped so."""
    try:
        inner = store.underlying_store.underlying_store
        return inner if inner is not None and inner is not store else None
    except Exception:
        return None


def _creation_log(world, epoch, job_rank):
    """[(name, members)] of the sub-groups `job_rank` created, in order (entries still being
    written are left out)."""
    out = []
    n = world.add(f"dshim/groups/{epoch}/{job_rank}/n", 0)
    for i in range(1, n + 1):
        key = f"dshim/groups/{epoch}/{job_rank}/{i}"
        if world.check([key]):
            name, members = world.get(key).decode().split(" ", 1)
            out.append((name, [int(m) for m in members.split(",") if m]))
    return out


def _conflict(group, absent):
    """A one-line verdict when a member that has not joined created this group's name with
    other members, or these members under another name at the same count; else None."""
    w = group.world
    if w is None or group.default:
        return None
    bad = None
    for m in absent:
        made = _creation_log(w, group.epoch, m)
        same_members = [name for name, members in made if members == group.members]
        for name, members in made:
            if name == group.name and members != group.members:
                bad = (m, members)
                break
        if bad is None and len(same_members) >= group.count and same_members[group.count - 1] != group.name:
            bad = (m, group.members)
        if bad is not None:
            break
    if bad is None:
        return None
    involved = sorted(set(group.members) | set(bad[1]))
    logs = "; ".join(
        f"rank {r} created " + (", ".join(f"group {n} {ms}" for n, ms in _creation_log(w, group.epoch, r)) or "nothing yet")
        for r in involved)
    return (f"process groups were created in a different order on different ranks (every rank must call "
            f"new_group for every group, in the same order): rank {group.me} creating group {group.describe()} "
            f"found rank {bad[0]} in another group under the same name or count: {logs}")


_JOIN_SLICE_S = 1.0   # how long one wait() in the store lasts; who is missing is looked at after each


def _wait_joined(store, group, rank, size, timeout_s):
    """Waits until every member has reached this group's rendezvous; on timeout an error naming
    the ranks that never did (not only "timeout"), on a creation-order conflict (found here or by
    another rank) that conflict.

    This timeout stays in Python: the wait is in torch's store, before any dshim
    communicator (and so the C core's timeout) exists.  It waits in the store (woken as the
    last key is set) in slices of _JOIN_SLICE_S; only a member late by a slice makes it look
    further: at who is missing, at the conflict verdict in the job's store, and at the missing
    members' creation logs.  So a conflict fails the ranks within about a slice, and a
    rendezvous where everyone comes in time costs no more than the wait.

    Notes who is missing after each slice: the torch store lives in rank 0's process, and when
    rank 0 gives up first (its TCPStore waits for the same missing ranks with the same
    timeout) the store is gone by the time this rank's own timeout expires -- the last list
    seen is still the answer."""
    start = time.monotonic()
    deadline = start + timeout_s
    keys = [group.joined_key(r) for r in range(size)]
    conflict_key = f"{_CONFLICT_KEY}/{group.epoch}"
    missing = None
    error = None
    while True:
        left = deadline - time.monotonic()
        try:
            store.wait(keys, datetime.timedelta(seconds=max(0.01, min(left, _JOIN_SLICE_S))))
            return
        except Exception as e:
            error = e
        try:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
        except Exception:   # the store is gone: the last list is the answer
            _rendezvous_failed(rank, size, missing, timeout_s, start, error)
        if not missing:
            return
        if group.world is not None and not group.default:
            verdict = None
            try:
                w = group.world
                if w.check([conflict_key]):
                    verdict = w.get(conflict_key).decode()
                else:
                    verdict = _conflict(group, [group.members[r] for r in missing])
                    if verdict is not None:
                        w.set(conflict_key, verdict)   # the ranks waiting elsewhere fail now too
            except Exception:
                pass
            if verdict is not None:
                raise RuntimeError(f"dshim: rank {rank}/{size} (job rank {group.me}): {verdict}") from None
        if time.monotonic() >= deadline:
            _rendezvous_failed(rank, size, missing, timeout_s, None, error)


def _rendezvous_failed(rank, size, missing, timeout_s, gone_since, error):
    who = ", ".join(str(r) for r in missing) if missing else "unknown"
    # torch's own message names only the last slice's wait ("wait timeout after 2000ms"): not useful
    why = "they never reached dshim's rendezvous"
    what = f"timed out after {timeout_s:g} s"
    if gone_since is not None:
        what = f"failed after {time.monotonic() - gone_since:.1f} s (timeout {timeout_s:g} s)"
        why = (f"the torch store hosted by rank 0 at MASTER_ADDR:MASTER_PORT went away, so rank 0 gave up "
               f"or exited: {str(error).splitlines()[0] if error and str(error) else type(error).__name__}")
    raise RuntimeError(f"dshim: rank {rank}/{size}: rendezvous {what}: "
                       f"rank(s) {who} of {size} never joined (started with the same WORLD_SIZE and "
                       f"MASTER_ADDR/MASTER_PORT? raise the timeout if they are only slow) [{why}]") from None


def _rendezvous(store, rank, size, timeout_s=None, group=None):
    """(addr, port, token, extra) of this group's dshim store, agreed through the
    torch store: group rank 0 publishes where it will host it, once every member
    has arrived.  MASTER_PORT is never used: rank 0's torch TCPStore listens
    there.  `extra` is what rank 0 says of the torch store (_StoreRelease)."""
    if group is None:
        group = _Group.of(store, rank, size)
    if size > 1:
        group.log_creation()
        store.set(group.joined_key(rank), "1")
    if rank == 0:
        addr = _my_address(store) if size > 1 else "127.0.0.1"
        token = secrets.token_hex(16)
        port = _prebind_store(token, addr) if size > 1 else 0
        extra = _StoreRelease.serves(store) if size > 1 else "-"
        value = f"{addr} {port} {token} {extra}"
        if size == 1:
            return addr, port, token, extra
        store.set(group.bootstrap_key(), value)
    _wait_joined(store, group, rank, size, timeout_s if timeout_s is not None else 1800.0)
    if rank != 0:
        value = store.get(group.bootstrap_key()).decode()
    try:
        # the last rank out of the wait removes the keys: nothing of a finished rendezvous stays
        # in a long-lived store
        if store.add(group.readers_key(), 1) == size:
            store.delete_key(group.bootstrap_key())
            store.delete_key(group.readers_key())
            for r in range(size):
                store.delete_key(group.joined_key(r))
    except Exception:   # stores without delete_key (older torch) keep the key
        pass
    addr, port, token, extra = value.split()
    return addr, int(port), token, extra


# --------------------------------------------------------------------------
# the torch store's release at destroy_process_group
# --------------------------------------------------------------------------

def _bottom_store(store):
    """The store under every PrefixStore: rank 0's TCPStore (server or client)."""
    for _ in range(16):
        nxt = getattr(store, "underlying_store", None)
        if nxt is None or nxt is store:
            return store
        store = nxt
    return store


def _own_sockets():
    inodes = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            try:
                link = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        pass
    return inodes


def _tcp_sockets(port, field):
    """(state, inode) of this process's TCP sockets whose local (field 1) or remote (field 2)
    port is `port` (/proc/self/net/tcp and tcp6; state 0A = listening, 01 = established)."""
    mine = _own_sockets()
    out = []
    for name in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(name) as f:
                next(f, None)
                for line in f:
                    p = line.split()
                    if len(p) > 9 and int(p[field].rsplit(":", 1)[1], 16) == port and p[9] in mine:
                        out.append((p[3], p[9]))
        except (OSError, ValueError, IndexError):
            continue
    return out


class _StoreRelease:
    """destroy_process_group of the default group, made safe to follow by init_process_group.

    Rank 0's process hosts torch's TCPStore at MASTER_PORT, and drops it only after its
    shutdown of the group returns.  A rank that left destroy first and starts the next
    init_process_group connects to that old store, which then closes under it (torch:
    "Broken pipe", "recvValue failed").  So the other ranks leave destroy only once the old
    store has closed (their own connection to it sees the close), or once rank 0 says the
    script keeps it (the store outlives the group: nothing to race with), bounded by the
    group's timeout (at most _WAIT_MAX_S)."""

    _WAIT_MAX_S = 60.0

    @staticmethod
    def serves(store):
        """Rank 0's word in the bootstrap value: "S" when this process hosts the store."""
        bottom = _bottom_store(store)
        port = getattr(bottom, "port", None)
        if not isinstance(port, int) or port <= 0:
            return "-"
        return "S" if any(st == "0A" for st, _ in _tcp_sockets(port, 1)) else "-"

    @staticmethod
    def host_released(store, token):
        """Rank 0, in its destroy: says so when the script itself holds the store.  pybind11 hands
        out the one Python object of a C++ store while any Python reference to it lives, so a
        store torch made (env://, tcp://: dropped when init_process_group returned) comes back as
        a new object that only this function holds, and a store the script made and passed
        (store=...) comes back as the script's own, with the script's references on it."""
        bottom = _bottom_store(store)
        if sys.getrefcount(bottom) > 2:   # this local and getrefcount's argument are the 2
            try:
                bottom.set(f"dshim/torch_store_kept/{token}", "1")
            except Exception as e:
                log.debug("dshim: telling the other ranks that the torch store stays up: %s", e)

    @classmethod
    def wait_released(cls, store, token, rank, timeout_s):
        """The other ranks, after their destroy: until rank 0's store closed or is kept."""
        bottom = _bottom_store(store)
        port = getattr(bottom, "port", None)
        if not isinstance(port, int):
            return
        key = f"dshim/torch_store_kept/{token}"
        limit = min(timeout_s, cls._WAIT_MAX_S)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if not any(st == "01" for st, _ in _tcp_sockets(port, 2)):
                return   # every connection of ours to it was closed by the far side (or by us)
            try:
                if bottom.check([key]):
                    return
            except Exception:
                return
            time.sleep(0.005)
        log.warning("dshim: rank %d: rank 0 neither closed nor kept the torch store within %g s of this rank's "
                    "destroy_process_group; going on (a next init_process_group may meet the old store)",
                    rank, limit)


# --------------------------------------------------------------------------
# one dshim communicator and its completion thread
# --------------------------------------------------------------------------

class _Op:
    __slots__ = ("label", "seq", "ncoll", "reqs", "fut", "keep", "post", "result", "done", "err", "status")


_live = []                 # open communicators, in creation order (atexit closes them)
_live_lock = threading.Lock()
_atexit_registered = False


def _at_exit():
    with _live_lock:
        comms = [c for c in reversed(_live) if c.pid == os.getpid()]
    for c in comms:
        try:
            c.close(at_exit=True)
        except Exception:
            log.exception("dshim: closing a communicator at exit")


def _recorder_on(lib):
    """False when dshim's flight recorder is off (DSHIM_TRACE_BUFFER=0): then no label is set."""
    buf = ctypes.create_string_buffer(32)
    if lib.dshim_config_get(b"DSHIM_TRACE_BUFFER", buf, len(buf)) != 0:
        return True
    return buf.value.strip() != b"0"


class _Comm:
    def __init__(self, store, rank, size, timeout_s, desc, group=None):
        global _atexit_registered
        self.lib = _lib.lib()
        self.rank = rank
        self.size = size
        self.desc = desc
        self.timeout_s = timeout_s
        self.pid = os.getpid()
        self.store = store
        group = group or _Group.of(store, rank, size)
        addr, port, token, self._store_word = _rendezvous(store, rank, size, timeout_s, group)
        self.token = token   # names this communicator's keys in the torch store (monitored_barrier)
        self._default = group.default
        if group.default:
            _world_epoch[0] = token
        args = _lib.CommArgs(rank=rank, size=size, store_addr=addr.encode(), store_port=port,
                             token=token.encode(), store_external=0)
        handle = ctypes.c_void_p()
        st = self.lib.dshim_comm_init(_byref(args), _byref(handle))
        if st < 0:
            raise RuntimeError(f"dshim: rank {rank}/{size} ({desc}): joining the group through the store at "
                               f"{addr}:{port} failed: {_lib.last_error()}")
        self.comm = handle.value
        # The C core is the one authority on timeouts: it fails an operation that
        # makes no progress for this long, names the ranks that never reached a
        # collective, and tells the peers.  The group's timeout (torch's default is
        # 30 min, DSHIM_TIMEOUT's 300 s) replaces DSHIM_TIMEOUT for this group.
        self.lib.dshim_comm_set_timeout(self.comm, ctypes.c_double(timeout_s))
        self.transport = (self.lib.dshim_comm_transport(self.comm) or b"?").decode()
        # the flight recorder's labels: none when it is off (DSHIM_TRACE_BUFFER=0)
        self._set_label = self.lib.dshim_trace_label if _recorder_on(self.lib) else None
        self._q = queue.SimpleQueue()
        self._thread = None
        self._thread_lock = threading.Lock()
        self._generation = 0              # of the completion thread (_hand_over)
        self._ops = collections.deque()   # issued and not finished, oldest first (names them at exit)
        self._ops_lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self._close_lock = threading.Lock()
        self._handle_lock = threading.Lock()
        with _live_lock:
            _live.append(self)
            if not _atexit_registered:
                atexit.register(_at_exit)
                _atexit_registered = True

    # -- errors --------------------------------------------------------------

    def set_trace_desc(self, text):
        if self.comm:
            self.lib.dshim_comm_set_desc(self.comm, text.encode())

    def error_text(self):
        """The communicator's sticky error, as the C core words it."""
        buf = ctypes.create_string_buffer(1024)
        if self.comm and self.lib.dshim_comm_get_error(self.comm, buf, len(buf)) < 0 and buf.value:
            return buf.value.decode(errors="replace")
        return _lib.last_error()

    def missing(self):
        """The C core's verdict as data (dshim_comm_get_missing): (status, seq, ranks)
        of the collective its first error found ranks missing at, ranks None when
        unknown; None when its error names no missing ranks."""
        if not self.comm:
            return None
        seq, n = ctypes.c_uint64(), ctypes.c_int()
        ranks = (ctypes.c_int * self.size)()
        st = self.lib.dshim_comm_get_missing(self.comm, _byref(seq), ranks, self.size, _byref(n))
        if st >= 0:
            return None
        return st, seq.value, (None if n.value < 0 else list(ranks[:min(n.value, self.size)]))

    def fail(self, op, cause, status=None):
        """The RuntimeError of a failed operation: the C core's verdict, led by
        torch's name of the operation.  When this operation is the collective the
        core timed out on, the ranks it found missing are restated up front."""
        head = f"dshim: rank {self.rank} ({self.desc}): {op.label} failed: "
        verdict = self.missing() if status == _lib.ERR_TIMEOUT and op.seq is not None else None
        if verdict and verdict[0] == _lib.ERR_TIMEOUT and op.seq <= verdict[1] < op.seq + op.ncoll and verdict[2]:
            # none known or unknown: the core's message says which, and why
            head += f"ranks that did not arrive at it: {', '.join(str(r) for r in verdict[2])}; "
        return RuntimeError(head + cause)

    # -- bookkeeping shared by both paths --------------------------------------

    def new_op(self, name, ncoll):
        """Records an operation about to be issued.  Collectives are numbered as
        dshim numbers them (from 0, one per dshim collective), so torch's label
        and the C core's messages name the same call; point-to-point operations
        have no number."""
        op = _Op()
        op.ncoll = ncoll
        if ncoll:
            op.seq = self._seq
            op.label = f"{name} #{self._seq}"
            self._seq += ncoll
        else:
            op.seq = None
            op.label = name
        op.done = False
        op.err = None
        op.status = None
        with self._ops_lock:
            self._ops.append(op)
        return op

    def op_done(self, op):
        op.done = True
        ops = self._ops
        with self._ops_lock:
            while ops and ops[0].done:
                ops.popleft()

    # -- the two ways to run an operation -------------------------------------

    def _refuse_closed(self, name):
        raise RuntimeError(f"dshim: rank {self.rank} ({self.desc}): {name} on a process group that was shut "
                           f"down (destroy_process_group)")

    def run_sync(self, name, calls, post, coll=True, label=None):
        """Runs blocking dshim calls in this thread; raises on error.  `label`
        (bytes, or None for none) names each call in the flight recorder."""
        if self._closed:
            self._refuse_closed(name)
        op = self.new_op(name, len(calls) if coll else 0)
        comm = self.comm
        set_label = self._set_label
        if set_label is None:
            label = None
        try:
            for i, (fn, args) in enumerate(calls):
                if label is not None:
                    set_label(label)
                st = fn(comm, *args)
                if st < 0:
                    if label is not None:
                        set_label(None)   # refused before it was queued: the label must not name a later call
                    if st in (_lib.ERR_INVALID, _lib.ERR_UNSUPPORTED) and coll:
                        # refused before it was queued: dshim numbered neither it nor the rest
                        self._seq -= len(calls) - i
                    raise self.fail(op, _lib.last_error(), st)
            if post is not None:
                with torch.no_grad():
                    post()
        finally:
            self.op_done(op)

    def run_async(self, name, calls, result, post, keep, coll=True, label=None):
        """Issues non-blocking dshim calls; returns the Future the completion
        thread completes (after `post`).  `label` as in run_sync."""
        if self._closed:
            self._refuse_closed(name)
        op = self.new_op(name, len(calls) if coll else 0)
        comm = self.comm
        set_label = self._set_label
        if set_label is None:
            label = None
        reqs = []
        for fn, args in calls:
            req = _c_void_p()
            if label is not None:
                set_label(label)
            st = fn(comm, *args, _byref(req))
            if st < 0:
                if label is not None:
                    set_label(None)
                op.err = _lib.last_error()
                op.status = st
                if coll:
                    self._seq -= len(calls) - len(reqs)
                break
            reqs.append(req)
        if op.err is not None and not reqs:
            self.op_done(op)
            raise self.fail(op, op.err, op.status)
        fut = _Future()
        op.reqs = reqs
        op.fut = fut
        op.keep = keep
        op.post = post
        op.result = result
        if self._thread is None:
            self._start_thread()
        elif self._thread is threading.current_thread():
            self._hand_over()
        self._q.put(op)
        return fut

    def _start_thread(self):
        with self._thread_lock:
            if self._thread is None:
                t = threading.Thread(target=self._complete_main, name=f"dshim-complete-{self.desc}", daemon=True)
                t.start()
                self._thread = t

    def _hand_over(self):
        """A Future's callback, which the completion thread runs, issued an operation -- and may wait
        for it (PowerSGD's DDP hook does, in then()), which only a completion thread can complete: a
        new thread takes over the queue, and this one ends when its callback returns.  (gloo runs
        callbacks in its 2 worker threads, and hangs once both wait in one: PowerSGD on 2 buckets.)"""
        with self._thread_lock:
            self._generation += 1
            t = threading.Thread(target=self._complete_main, args=(self._generation,),
                                 name=f"dshim-complete-{self.desc}", daemon=True)
            self._thread = t
            t.start()

    def _complete_main(self, generation=0):
        lib = self.lib
        q = self._q
        wait = lib.dshim_wait
        free = lib.dshim_request_free
        while True:
            if self._generation != generation:
                return   # a callback this thread ran handed the queue to a new thread (_hand_over)
            op = q.get()
            if op is None:
                return
            err, status = op.err, op.status
            for req in op.reqs:
                st = wait(req)
                if st < 0 and err is None:
                    err, status = self.error_text(), st
                free(req)
            fut = op.fut
            try:
                if err is None and op.post is not None:
                    with torch.no_grad():
                        op.post()
            except Exception as e:   # a copy back failed: report it on the Future
                err = f"copying the result back failed: {e}"
            # release the tensors before completing: a callback may free memory
            result = op.result
            op.reqs = op.keep = op.post = op.result = op.fut = None
            self.op_done(op)
            try:
                if err is None:
                    fut.set_result(result)
                else:
                    fut.set_exception(self.fail(op, err, status))
            except Exception:
                log.exception("dshim: completing the future of %s", op.label)

    # -- teardown -------------------------------------------------------------

    def pending(self):
        with self._ops_lock:
            return sum(1 for o in self._ops if not o.done)

    def abort(self, reason):
        """Fails outstanding and later operations here and at the peers (any thread)."""
        with self._handle_lock:   # never on a communicator close() is destroying
            if self.comm and os.getpid() == self.pid:
                self.lib.dshim_comm_abort(self.comm, reason.encode())

    def close(self, at_exit=False):
        """Waits for outstanding operations (bounded by the C core's timeout), stops the
        completion thread and destroys the communicator.  At interpreter exit,
        unfinished operations are aborted instead of waited for: a rank leaving
        with work in flight would otherwise hang its peers until the timeout."""
        with self._close_lock:
            if self._closed:
                return
            if os.getpid() != self.pid:
                # a forked child (data-loader worker): the communicator is the parent's
                self._closed = True
                return
            if at_exit:
                n = self.pending()
                if n:
                    first = self._ops[0] if self._ops else None
                    what = first.label if first else "?"
                    self.abort(f"rank {self.rank} is exiting with {n} unfinished operation(s), first {what}")
            self._closed = True
            t = self._thread
            if t is not None:
                # the C core's timeout bounds this wait: it fails a stalled operation
                self._q.put(None)
                if t is not threading.current_thread():
                    t.join()
            with self._handle_lock:
                handle, self.comm = self.comm, None
            # destroy blocks while the store host waits for the other ranks' goodbye
            if self.lib.dshim_comm_destroy(handle) < 0:
                log.debug("dshim: rank %d (%s): destroy: %s", self.rank, self.desc, _lib.last_error())
            store, self.store = self.store, None
            if self._default and self._store_word == "S" and not at_exit:
                if self.rank == 0:
                    _StoreRelease.host_released(store, self.token)
                else:
                    _StoreRelease.wait_released(store, self.token, self.rank, self.timeout_s)
            del store
        with _live_lock:
            if self in _live:
                _live.remove(self)

    def stats(self):
        s = _lib.Stats()
        if self.comm:
            self.lib.dshim_comm_stats(self.comm, _byref(s))
        return {"collectives": s.collectives, "bytes_sent": s.bytes_sent, "bytes_received": s.bytes_received}
