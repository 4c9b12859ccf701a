"""monitored_barrier with gloo's semantics, through the group's torch store.

torch documents monitored_barrier as a debugging barrier: rank 0 waits for
every other rank and names, in gloo's words, the first rank that did not
arrive (or, with wait_all_ranks, all of them); the other ranks wait for rank
0's answer.  gloo does it with tagged send/recv pairs.  dshim matches
point-to-point messages by order, without tags, so a receive rank 0 gives up
on would stay posted and swallow the next message from that rank; the
communicator would be out of step after any failure.  The torch store has no
such state: every call has its own keys, so a failed call leaves nothing
behind that a later operation could match, and the communicator is not
touched at all.

Per call k of a group (the group's store is already prefixed by its name; the
communicator's token tells a re-created group on a reused store apart):
  rank r > 0:  sets  dshim/mbarrier/<token>/<k>/arrived/<r>, then waits for
               .../<k>/release (the group's timeout: gloo waits for rank 0's
               answer as long as for any receive) and fails unless it is "ok";
  rank 0:      waits for each arrived key in rank order, then sets release to
               "ok", or, when a rank did not arrive, to its error, so the ranks
               that did arrive fail at once with gloo's message.
Keys are deleted once read: rank 0 deletes the arrival keys, and the release
key of call k-1 when call k has succeeded (every rank has read it by then).
"""
import datetime
import time

_NO_ANSWER = "no answer from rank 0"


def _timeout_s(timeout, default_s):
    if timeout is None:
        return default_s
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _quiet(store, method, *args):
    try:
        return getattr(store, method)(*args)
    except Exception:   # cleanup only: an absent key or a store without delete_key
        return None


def _arrived_within(store, key, seconds):
    """True when `key` appears in the store within `seconds` (0: look once)."""
    if seconds <= 0:
        return bool(_quiet(store, "check", [key]))
    try:
        store.wait([key], datetime.timedelta(seconds=seconds))
        return True
    except Exception:   # torch's store raises DistStoreError (a RuntimeError) on timeout
        return bool(_quiet(store, "check", [key]))


def monitored_barrier(store, token, call, rank, size, timeout, default_timeout_s, wait_all_ranks):
    """Runs call number `call` of the group's monitored barrier; raises
    RuntimeError with gloo's messages."""
    limit_s = _timeout_s(timeout, default_timeout_s)
    limit_ms = int(round(limit_s * 1000))
    base = f"dshim/mbarrier/{token}/{call}"
    release = f"{base}/release"
    if rank != 0:
        _non_root(store, base, release, rank, default_timeout_s)
        return
    start = time.monotonic()
    deadline = start + limit_s
    arrived, failed = [], []
    for r in range(1, size):
        key = f"{base}/arrived/{r}"
        left = deadline - time.monotonic()
        failed_msg = f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {limit_ms} ms"
        if not wait_all_ranks and left <= 0:
            # gloo's checkRemainingTime: the time is used up before rank r's turn (gloo raises it inside
            # the try that names rank r, so it arrives wrapped in rank r's message)
            info = (f"Successfully processed ranks: {', '.join(map(str, arrived))}" if arrived
                    else "No ranks successfully processed in monitoredBarrier.")
            _fail(store, release, f"{failed_msg}\n Original exception: \nRank 0 timed out in monitoredBarrier "
                                  f"after {limit_ms} ms.\n{info}")
        # wait_all_ranks: past the common deadline the remaining ranks are only
        # looked at, so the call ends within the timeout (gloo gives every rank
        # a full timeout of its own: (size - 1) x timeout at worst)
        if _arrived_within(store, key, left):
            arrived.append(r)
            _quiet(store, "delete_key", key)
            continue
        failed.append(r)
        if not wait_all_ranks:
            _fail(store, release, f"{failed_msg}\n Original exception: \n dshim: rank {r} did not reach "
                                  f"monitored_barrier (call {call} of this group) within {limit_s:g} s")
    if failed:
        _fail(store, release, f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier "
                              f"in {limit_ms} ms")
    store.set(release, "ok")
    if call > 0:
        # every rank arrived at this call, so every rank has read the previous answer
        _quiet(store, "delete_key", f"dshim/mbarrier/{token}/{call - 1}/release")


def _fail(store, release, message):
    # the ranks that did arrive learn it now instead of at their timeout
    _quiet(store, "set", release, message)
    raise RuntimeError(message)


def _non_root(store, base, release, rank, wait_s):
    store.set(f"{base}/arrived/{rank}", "1")
    try:
        store.wait([release], datetime.timedelta(seconds=wait_s))
        answer = store.get(release).decode(errors="replace")
    except Exception as e:   # rank 0 never answered within the group's timeout, or its store is gone
        answer = f"{_NO_ANSWER} within {wait_s:g} s: {e}"
    if answer != "ok":
        raise RuntimeError(f"Rank {rank} successfully reached monitoredBarrier, but received errors while waiting "
                           f"for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n"
                           f" Original exception: \n{answer}")


_torch_wrapped = False


def let_torch_call_dshim():
    """torch's dist.monitored_barrier refuses every group whose get_backend()
    is not "gloo" before it reaches the group.  Wraps it so that a group
    created as "dshim" by name gets the same argument handling and then its
    own monitored_barrier; every other group goes to torch's function as is.
    Installed when the first dshim group is created (idempotent)."""
    global _torch_wrapped
    if _torch_wrapped:
        return
    import functools
    import warnings
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.monitored_barrier

    @functools.wraps(original)
    def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
        if (c10d.is_initialized() and not c10d._rank_not_in_group(group)
                and c10d.get_backend(group) == "dshim"):
            pg = group if group is not None else c10d._get_default_group()
            if timeout is None:
                timeout = c10d._get_default_timeout(c10d.get_backend(group))
            elif isinstance(timeout, float):
                warnings.warn("Please specify timeout arg as a timedelta. "
                              f"Converting current value of {timeout} assuming it represents seconds",
                              stacklevel=2)
                timeout = datetime.timedelta(seconds=timeout)
            check = getattr(c10d, "_check_valid_timeout", None)
            if check is not None:
                check(timeout)
            return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
        return original(group, timeout, wait_all_ranks)

    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier
    _torch_wrapped = True
