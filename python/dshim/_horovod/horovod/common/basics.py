"""Horovod's basics (horovod.common.basics of Horovod 0.28.1) over dshim.

One core per process, shared by the torch and MXNet layers:
- the world communicator, created once per process and kept across hvd.init()/hvd.shutdown()
  (Horovod's Gloo controller re-initialises; a dshim communicator's rendezvous happens once);
- the identity: rank and size of the world; local and cross ranks from HOROVOD_LOCAL_*/CROSS_*
  when horovodrun set them, else from an allgather of every rank's host identity;
- per hvd.init(): one engine of operations matched by name (dshim._named, over
  dshim_named_create) for the global process set and one for every other registered set, on a
  communicator split from the world; hvd.shutdown() shuts them down and destroys them.

Where the world communicator comes from, in order:
1. the variables dshim_comm_init_env reads (dshim-run, torchrun, mpirun, srun: DSHIM_RANK, RANK,
   OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID with a store address), unless HOROVOD_RANK says
   something else;
2. HOROVOD_RANK/HOROVOD_SIZE with HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT (horovodrun's Gloo mode):
   rank 0 hosts dshim's rendezvous store at that address;
3. nothing at all (`python script.py`): a job of one rank, as Horovod runs one.
Every variable is read through dshim's table (base/params.def, dshim_config_get).

What this build answers to the *_built() questions: a Gloo build of Horovod for CPU
(gloo_built True, mpi_built False, nccl_built 0, ddl/ccl/rocm False); cuda_built is True when
torch was built with CUDA, since CUDA tensors are staged through host memory (as Horovod built
with CUDA but without HOROVOD_GPU_OPERATIONS does).
"""
import atexit
import collections
import ctypes
import os
import socket
import threading
from typing import Dict, List, Optional, Sequence

from horovod.common import util as util
from horovod.common.exceptions import HorovodInternalError
from horovod.common.process_sets import _init_process_sets

NOT_INITIALIZED = 'Horovod has not been initialized; use hvd.init().'

# Horovod's ReduceOp values (horovod/common/message.h)
AVERAGE, SUM, ADASUM, MIN, MAX, PRODUCT = range(6)

_LAUNCHER_RANKS = ("DSHIM_RANK", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_HOST_ID_BYTES = 64


class MPI:
    class Comm:
        ...


def _lib():
    from dshim import _lib as lib_module
    return lib_module


def config(name):
    """The value of a variable of dshim's table (base/params.def), as text.  Horovod's own
    variables are read as the environment has them now (Horovod reads them at hvd.init(), and
    scripts set them after `import horovod.torch`, when dshim may have loaded its table
    already); dshim's as the library uses them."""
    buf = ctypes.create_string_buffer(4096)
    lib = _lib().lib()
    get = lib.dshim_config_get_current if name.startswith("HOROVOD_") else lib.dshim_config_get
    if get(name.encode(), buf, len(buf)) != 0:
        raise KeyError(f"dshim: {name} is not a variable of dshim's table (base/params.def)")
    return buf.value.decode(errors="replace")


def config_int(name):
    v = config(name)
    return int(v) if v.lstrip("-").isdigit() else -1


def config_bool(name):
    return config(name) not in ("", "0")


class _SetEntry:
    """A registered process set: its ranks and, on members, its engine and communicator."""
    __slots__ = ("ps_id", "ranks", "comm", "engine", "rank", "global_to_set")

    def __init__(self, ps_id, ranks, comm, engine, my_rank):
        self.ps_id = ps_id
        self.ranks = ranks
        self.comm = comm
        self.engine = engine
        self.rank = ranks.index(my_rank) if my_rank in ranks else -1
        self.global_to_set = {g: i for i, g in enumerate(ranks)}


class _Core:
    """The process's Horovod state (one per process, whichever layers are imported)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.world = None          # dshim_comm_t * (int), kept for the life of the process
        self.rank = self.size = -1
        self.local_rank = self.local_size = self.cross_rank = self.cross_size = -1
        self.homogeneous = True
        self.initialized = False
        self.sets = {}             # process set id -> _SetEntry
        self.free_ids = collections.deque()
        self.next_id = 1
        self.dynamic = False
        self.timeline_enabled = False
        self.atexit_registered = False
        self.reset_hooks = []      # called at shutdown (the layers' handle tables)

    # ---- the world communicator and the identity (once per process) ----------------------------

    def _open_world(self):
        lib_mod = _lib()
        lib = lib_mod.lib()
        hvd_rank, hvd_size = config_int("HOROVOD_RANK"), config_int("HOROVOD_SIZE")
        launcher_rank = next((r for r in (config_int(n) for n in _LAUNCHER_RANKS) if r >= 0), -1)
        has_store = bool(config("DSHIM_STORE_ADDR") or config("MASTER_ADDR"))
        comm = ctypes.c_void_p()
        if launcher_rank >= 0 and (hvd_rank < 0 or (hvd_rank == launcher_rank and has_store)):
            st = lib.dshim_comm_init_env(ctypes.byref(comm))
        else:
            if hvd_rank >= 0:
                if hvd_size < 1 or hvd_rank >= hvd_size:
                    raise ValueError(f"Horovod initialization failed: HOROVOD_RANK={hvd_rank} is not below "
                                     f"HOROVOD_SIZE={hvd_size}")
                rank, size = hvd_rank, hvd_size
            else:
                rank, size = 0, 1   # no launcher: a job of one process, as Horovod runs it
            addr = config("HOROVOD_GLOO_RENDEZVOUS_ADDR")
            port = config_int("HOROVOD_GLOO_RENDEZVOUS_PORT")
            if size == 1 and not addr:
                addr, port = "127.0.0.1", 0
            elif not addr or port < 0:
                raise ValueError(
                    f"Horovod initialization failed: rank {rank} of {size} (HOROVOD_RANK/HOROVOD_SIZE) has no "
                    f"rendezvous: set HOROVOD_GLOO_RENDEZVOUS_ADDR and HOROVOD_GLOO_RENDEZVOUS_PORT (horovodrun "
                    f"sets them), or start the job with horovodrun or dshim-run")
            args = lib_mod.CommArgs(rank=rank, size=size, store_addr=addr.encode(), store_port=port, token=None,
                                    store_external=0)
            st = lib.dshim_comm_init(ctypes.byref(args), ctypes.byref(comm))
        if st < 0:
            raise ValueError(f"Horovod initialization failed: {lib_mod.last_error()}")
        lib.dshim_comm_set_desc(comm, b"horovod world")
        self.world = comm.value
        self.rank = lib.dshim_comm_rank(comm)
        self.size = lib.dshim_comm_size(comm)
        self._identity()

    def _host_id(self):
        host = config("DSHIM_HOST_ID") or config("HOROVOD_HOSTNAME") or socket.gethostname()
        raw = host.encode()
        if len(raw) > _HOST_ID_BYTES:
            import hashlib
            raw = hashlib.sha256(raw).hexdigest().encode()
        return raw.ljust(_HOST_ID_BYTES, b"\0")

    def _identity(self):
        """Local and cross rank/size: horovodrun's HOROVOD_LOCAL_*/CROSS_* when set, else computed
        from every rank's host identity (one allgather over the world, every rank takes part)."""
        lib_mod = _lib()
        lib = lib_mod.lib()
        rec = _HOST_ID_BYTES + 8
        env_local_size = config_int("HOROVOD_LOCAL_SIZE")
        mine = self._host_id() + int(env_local_size).to_bytes(8, "little", signed=True)
        send = ctypes.create_string_buffer(mine, rec)
        recv = ctypes.create_string_buffer(rec * self.size)
        lib_mod.check(lib.dshim_allgather(self.world, send, recv, rec, 0), "gathering the ranks' hosts")
        raw = recv.raw
        hosts = [raw[i * rec:i * rec + _HOST_ID_BYTES] for i in range(self.size)]
        env_ls = [int.from_bytes(raw[i * rec + _HOST_ID_BYTES:(i + 1) * rec], "little", signed=True)
                  for i in range(self.size)]
        local_rank_of = []
        seen = collections.Counter()
        for h in hosts:
            local_rank_of.append(seen[h])
            seen[h] += 1
        me = hosts[self.rank]
        lr = local_rank_of[self.rank]
        ls = seen[me]
        # hosts in order of their first rank; the cross group of local rank lr: hosts that have one
        order = list(dict.fromkeys(hosts))
        cross = [h for h in order if seen[h] > lr]
        self.local_rank = self._env_or("HOROVOD_LOCAL_RANK", lr)
        self.local_size = self._env_or("HOROVOD_LOCAL_SIZE", ls)
        self.cross_rank = self._env_or("HOROVOD_CROSS_RANK", cross.index(me))
        self.cross_size = self._env_or("HOROVOD_CROSS_SIZE", len(cross))
        sizes = {env_ls[r] if env_ls[r] >= 1 else seen[hosts[r]] for r in range(self.size)}
        self.homogeneous = len(sizes) == 1

    @staticmethod
    def _env_or(name, computed):
        v = config_int(name)
        return v if v >= 0 else computed

    # ---- init / shutdown ----------------------------------------------------------------------------

    def init(self, process_sets):
        with self.lock:
            if self.initialized:
                return
            if self.world is None:
                self._open_world()
            if not self.atexit_registered:
                atexit.register(self._at_exit)
                self.atexit_registered = True
            from dshim import _named
            self.dynamic = config_bool("HOROVOD_DYNAMIC_PROCESS_SETS") or self.dynamic
            self.sets = {0: _SetEntry(0, list(range(self.size)), None, _named.Engine(self.world), self.rank)}
            self.free_ids = collections.deque()
            self.next_id = 1
            self.initialized = True
            try:
                for ranks in process_sets:
                    self._validate(ranks)
                    if self._find(ranks) is None:
                        self._register(ranks)
                timeline = config("HOROVOD_TIMELINE")
                self.timeline_enabled = bool(timeline)
                if timeline and timeline != "DYNAMIC":
                    self.sets[0].engine.timeline(timeline, config_bool("HOROVOD_TIMELINE_MARK_CYCLES"))
            except BaseException:
                self.shutdown()
                raise

    def shutdown(self):
        with self.lock:
            for hook in self.reset_hooks:
                hook()
            if not self.initialized:
                return
            self.initialized = False
            entries = list(self.sets.values())
            self.sets = {}
            for e in entries:
                if e.engine is not None:
                    e.engine.shutdown()
            first = None
            for e in entries:
                try:
                    if e.engine is not None:
                        e.engine.destroy()
                    if e.comm is not None:
                        _lib().lib().dshim_comm_destroy(e.comm)
                except Exception as ex:   # destroy every engine, report the first failure
                    first = first or ex
            if first is not None:
                raise first

    def _at_exit(self):
        try:
            self.shutdown()
        except Exception:
            # an engine whose communicator failed (a rank died) cannot be destroyed cleanly; the
            # operation that met the failure raised it to the script already, and a traceback at
            # exit would only repeat it (Horovod's own exit handler says nothing either)
            pass
        finally:
            world, self.world = self.world, None
            if world is not None:
                _lib().lib().dshim_comm_destroy(world)

    # ---- process sets -----------------------------------------------------------------------------

    def _validate(self, ranks):
        if len(set(ranks)) != len(ranks):
            dup = next(r for r in ranks if ranks.count(r) > 1)
            raise ValueError(f"Tried to register process set with duplicate rank: {dup}")
        for rk in ranks:
            if rk < 0 or rk >= self.size:
                raise ValueError(f"Tried to register process set with invalid rank: {rk}")

    def _find(self, ranks):
        key = list(ranks) if ranks else list(range(self.size))
        for ps_id, e in self.sets.items():
            if e.ranks == key:
                return ps_id
        return None

    def _register(self, ranks):
        """Collective over the world: a communicator of the set's members and its engine."""
        from dshim import _named
        lib_mod = _lib()
        lib = lib_mod.lib()
        member = self.rank in ranks
        sub = ctypes.c_void_p()
        lib_mod.check(lib.dshim_comm_split(self.world, 0 if member else -1, self.rank, ctypes.byref(sub)),
                      f"creating process set {ranks}")
        engine = None
        if member:
            lib.dshim_comm_set_desc(sub, f"horovod process set {ranks}".encode())
            try:
                engine = _named.Engine(sub.value)
            except BaseException:
                lib.dshim_comm_destroy(sub)
                raise
        ps_id = self.free_ids.popleft() if self.free_ids else self.next_id
        if ps_id == self.next_id:
            self.next_id += 1
        self.sets[ps_id] = _SetEntry(ps_id, list(ranks), sub.value if member else None, engine, self.rank)
        return ps_id

    def check_initialized_for_sets(self):
        if not self.initialized:
            raise ValueError(NOT_INITIALIZED)

    def add_process_set(self, ranks):
        with self.lock:
            self.check_initialized_for_sets()
            if not self.dynamic:
                raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets after Horovod "
                                 "initialization.")
            ranks = sorted(ranks)
            self._validate(ranks)
            if self._find(ranks) is not None:
                return None
            return self._register(ranks)

    def remove_process_set(self, ps_id):
        with self.lock:
            self.check_initialized_for_sets()
            if not self.dynamic:
                raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets after Horovod "
                                 "initialization.")
            e = self.sets.get(ps_id)
            if e is None or ps_id == 0:
                return None
            del self.sets[ps_id]
            self.free_ids.append(ps_id)
            if e.engine is not None:
                e.engine.destroy()
            if e.comm is not None:
                _lib().lib().dshim_comm_destroy(e.comm)
            return ps_id

    def entry(self, process_set, what):
        """The registered set an operation runs on; raises as Horovod's enqueue does."""
        if not self.initialized:
            raise HorovodInternalError(NOT_INITIALIZED)
        ps_id = process_set.process_set_id
        e = self.sets.get(ps_id) if ps_id is not None else None
        if e is None:
            raise ValueError(f"{what}: Process set provided does not exist, or has not been registered.")
        if e.engine is None:
            raise ValueError(f"{what}: Rank {self.rank} is not a member of the provided process set.")
        return e


_core = _Core()


class HorovodBasics(object):
    """The basic Horovod API (init, ranks, build flags, timeline, process set internals) of a
    framework layer; every layer of the process shares one core."""

    def __init__(self, pkg_path=None, *args):
        self._core = _core
        self.Average = AVERAGE
        self.Sum = SUM
        self.Adasum = ADASUM
        self.Min = MIN
        self.Max = MAX
        self.Product = PRODUCT
        # Horovod's process set error codes (operations.cc)
        self.HOROVOD_PROCESS_SET_ERROR_INIT = -1
        self.HOROVOD_PROCESS_SET_ERROR_DYNAMIC = -2
        self.HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET = -3
        self.HOROVOD_PROCESS_SET_ERROR_FOREIGN_SET = -4
        self.HOROVOD_PROCESS_SET_ERROR_SHUTDOWN = -5
        self.HOROVOD_PROCESS_SET_ERROR_EXISTING_SET = -6

    def init(self, comm=None, process_sets=None):
        """Initializes Horovod (idempotent).

        comm: None, or a list of all the job's ranks (a subset, or an mpi4py communicator, is not
        supported: this is not an MPI build).  process_sets: None, a list of ProcessSet to register
        now besides the global one (every rank passes the same list), or "dynamic" (none now;
        hvd.add_process_set() allowed later, as with HOROVOD_DYNAMIC_PROCESS_SETS=1)."""
        if comm is None:
            comm = []
        if process_sets is None:
            process_sets = []
        elif isinstance(process_sets, str) and process_sets.lower() == "dynamic":
            process_sets = []
            os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
            _core.dynamic = True
        process_sets = list(process_sets)
        if not util.is_iterable(comm):
            raise ValueError("Horovod has not been built with MPI support. Ensure MPI is installed and "
                             "reinstall Horovod with HOROVOD_WITH_MPI=1 to debug the build error.")
        if any(ps.ranks is None for ps in process_sets):
            raise ValueError("Horovod has not been built with MPI support: process sets can only be made from "
                             "lists of ranks.")
        _core.init([ps.ranks for ps in process_sets])
        comm = list(comm)
        if comm and sorted(comm) != list(range(_core.size)):
            _core.shutdown()
            raise NotImplementedError(
                f"hvd.init(comm={comm}): a communicator of a subset of the {_core.size} ranks is not supported by "
                f"dshim's Horovod; pass no comm and use process sets (hvd.ProcessSet) for subsets")
        _init_process_sets(process_sets)
        for idx, ps in enumerate(process_sets):
            if ps.process_set_id is None:
                raise ValueError(
                    f"Horovod could not be initialized because process_sets entry number {idx} is a duplicate: {ps}")

    def shutdown(self):
        """Shuts Horovod down: pending operations fail on every rank; hvd.init() may follow."""
        _core.shutdown()

    def is_initialized(self):
        return _core.initialized

    def start_timeline(self, file_path, mark_cycles=False):
        """Starts Horovod's timeline (a Chrome trace, written by rank 0) into file_path; needs
        HOROVOD_TIMELINE set at init (DYNAMIC: no file until this call)."""
        if not _core.initialized:
            raise ValueError(NOT_INITIALIZED)
        if not _core.timeline_enabled:
            raise ValueError('Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.')
        _core.sets[0].engine.timeline(file_path, mark_cycles)

    def stop_timeline(self):
        """Stops the timeline and closes its file."""
        if not _core.initialized:
            raise ValueError(NOT_INITIALIZED)
        _core.sets[0].engine.timeline(None)

    def _get(self, attr):
        if not _core.initialized:
            raise ValueError(NOT_INITIALIZED)
        return getattr(_core, attr)

    def size(self):
        """The number of Horovod processes."""
        return self._get("size")

    def local_size(self):
        """The number of Horovod processes on this process's host."""
        return self._get("local_size")

    def cross_size(self):
        """The number of hosts that have a process of this process's local rank."""
        return self._get("cross_size")

    def rank(self):
        """This process's Horovod rank."""
        return self._get("rank")

    def local_rank(self):
        """This process's rank among the processes of its host."""
        return self._get("local_rank")

    def cross_rank(self):
        """The index of this process's host among the hosts that have its local rank."""
        return self._get("cross_rank")

    def is_homogeneous(self):
        """Whether every host runs as many processes."""
        return bool(_core.homogeneous)

    def mpi_threads_supported(self):
        raise ValueError('Horovod MPI is not enabled; Please make sure it\'s installed and enabled.')

    def mpi_enabled(self):
        return False

    def mpi_built(self):
        return False

    def gloo_enabled(self):
        return _core.initialized

    def gloo_built(self):
        return True

    def nccl_built(self):
        return 0

    def ddl_built(self):
        return False

    def ccl_built(self):
        return False

    def cuda_built(self):
        try:
            import torch
        except ImportError:
            return False
        return torch.version.cuda is not None

    def rocm_built(self):
        return False

    # ---- process sets (horovod.common.process_sets calls these) --------------------------------

    def _add_process_set_impl(self, ranks: Sequence[int]) -> Optional[int]:
        return _core.add_process_set(list(ranks))

    def _remove_process_set_impl(self, process_set_id: int) -> Optional[int]:
        assert isinstance(process_set_id, int)
        if process_set_id == 0:
            return None
        return _core.remove_process_set(process_set_id)

    def _process_set_rank(self, process_set_id: int) -> int:
        if not _core.initialized:
            raise ValueError(NOT_INITIALIZED)
        e = _core.sets.get(process_set_id)
        if e is None:
            raise ValueError("Process set does not exist or has not been registered.")
        if e.rank < 0:
            raise ValueError("Process is not part of provided process set.")
        return e.rank

    def _process_set_size(self, process_set_id: int) -> int:
        if not _core.initialized:
            raise ValueError(NOT_INITIALIZED)
        e = _core.sets.get(process_set_id)
        if e is None:
            raise ValueError("Process set does not exist or has not been registered.")
        return len(e.ranks)

    def _get_process_set_ids_and_ranks(self) -> Dict[int, List[int]]:
        if not _core.initialized:
            raise ValueError('Horovod has not been initialized properly; use hvd.init().')
        return {ps_id: list(e.ranks) for ps_id, e in _core.sets.items()}

    def _comm_process_set_id(self, comm: MPI.Comm) -> int:
        raise ValueError("Horovod has not been built with MPI support. Ensure MPI is installed and "
                         "reinstall Horovod with HOROVOD_WITH_MPI=1 to debug the build error.")
