"""Process sets (horovod.common.process_sets of Horovod 0.28.1): subsets of the ranks that run
collective operations among themselves.

A ProcessSet is made from a list of global ranks, then registered by hvd.init(process_sets=[...])
or hvd.add_process_set() (with HOROVOD_DYNAMIC_PROCESS_SETS=1), which gives it its id.  Each
registered set is its own engine of named operations on a communicator split from the world
(horovod.common.basics); registering and removing are collective over every rank, as in Horovod.
"""
from typing import List, Optional, Sequence, Union

from horovod.common.util import is_iterable

_basics = None   # the HorovodBasics of the framework layer (set by _setup)


class MPI:
    class Comm:
        ...


class ProcessSet:
    """A set of Horovod processes that run collective operations together.

    Made from a list of process ranks; passed to hvd.init() or hvd.add_process_set(), which set
    process_set_id once the set is registered."""
    process_set_id = None
    ranks = None
    mpi_comm = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], MPI.Comm]):
        if is_iterable(ranks_or_comm):
            ranks_or_comm = sorted(ranks_or_comm)
            if any(not isinstance(rk, int) for rk in ranks_or_comm):
                raise ValueError(
                    "ProcessSet should be initialized with a list of process ranks or an mpi4py Comm object")
            self.ranks = ranks_or_comm
        else:
            # dshim's Horovod is a Gloo-style build: there are no MPI communicators to build sets from
            raise ValueError(
                "Apparently you tried to build a ProcessSet from an MPI communicator, "
                "but Horovod has not been built with MPI support. Ensure MPI is installed and "
                "reinstall Horovod with HOROVOD_WITH_MPI=1 to debug the build error.")

    def _invalidate(self):
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """The number of processes in the set, or None if it is not registered."""
        if self.process_set_id is None:
            return None
        return _basics._process_set_size(self.process_set_id)

    def rank(self) -> Optional[int]:
        """This process's rank within the set, or None if it is not registered.

        Operations such as hvd.broadcast() still take global ranks (hvd.rank()), not this one."""
        if self.process_set_id is None:
            return None
        return _basics._process_set_rank(self.process_set_id)

    def included(self) -> Optional[bool]:
        """Whether this process belongs to the set, or None if the set has no ranks yet."""
        if self.ranks is None:
            return None
        return _basics.rank() in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"


def _temp_process_set_object(process_set_id: int) -> ProcessSet:
    """A ProcessSet standing for a known id (internal use)."""
    ps = ProcessSet.__new__(ProcessSet)
    ps.process_set_id = process_set_id
    return ps


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _setup(basics):
    """Called by the framework layer once its basics exist."""
    global _basics
    _basics = basics


def _init_process_sets(process_set_list: List[ProcessSet]):
    """Gives the sets passed to hvd.init() their ids (a duplicate of an earlier one is invalidated)
    and the global set its ranks."""
    ids_seen = {0}
    id_to_ranks = _basics._get_process_set_ids_and_ranks()
    ranks_to_id = {tuple(ranks): ps_id for ps_id, ranks in id_to_ranks.items()}
    for ps in process_set_list:
        if ps.ranks is not None:
            ps.process_set_id = ranks_to_id[tuple(ps.ranks)]
        if ps.process_set_id in ids_seen:
            ps._invalidate()
        else:
            ids_seen.add(ps.process_set_id)
    if global_process_set.ranks != id_to_ranks[0]:
        global_process_set.ranks = id_to_ranks[0]


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers a new process set after hvd.init() and returns it (every rank must call it, in
    the same order).  Requires HOROVOD_DYNAMIC_PROCESS_SETS=1; no set of the same ranks may exist."""
    assert _basics is not None
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    assert process_set.ranks is not None
    process_set_id = _basics._add_process_set_impl(process_set.ranks)
    if process_set_id is None:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = process_set_id
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered process set (every rank must call it); True when it was removed.
    The global set and sets not registered are not removed.  Requires HOROVOD_DYNAMIC_PROCESS_SETS=1."""
    assert _basics is not None
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    process_set._invalidate()
    return _basics._remove_process_set_impl(process_set_id) is not None
