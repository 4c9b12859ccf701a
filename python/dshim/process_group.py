"""The "dshim" torch.distributed ProcessGroup: a Python subclass of
torch.distributed.ProcessGroup whose collectives call libdshim through ctypes.

Per process group (the default one and every new_group) there is one dshim
communicator (_comm.py).  Operations with asyncOp=False (torch's Python API
with async_op=False) run the blocking dshim call in the caller's thread: no
thread hand-off on the latency path.  Everything else is issued non-blocking
and completed by the group's completion thread.

Tensors: contiguous CPU tensors are handed to dshim by pointer, no copy.
Non-contiguous ones go through a contiguous copy, CUDA tensors through pinned
host blocks of libdshim's GPU staging pool (shim/gpu, the NCCL API's too), in
stream order; results are copied back before the Future completes
(_staging.py).  The paths that first concatenate a list of tensors
(allgather_coalesced, reduce_scatter, alltoall, scatter) still copy with
torch's .cpu().
The reduction itself runs on the host.  Every tensor an operation
touches stays referenced until it completes.

Data that is only moved (broadcast, all_gather, all_to_all, gather, scatter,
send/recv) travels as bytes, so every torch dtype works there; reductions
need a dtype dshim knows (_dtypes.py).
"""
import ctypes
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist

from . import _builtin_hooks
from . import _dtypes as D
from . import _lib
from . import _monitored
from . import _sparse
from ._comm import _Comm, _Group
from ._staging import _Staging, _host_clone, _nbytes, _plain
from ._work import DshimWork, profiled

from ._log import log  # noqa: E402  (never propagates to the root logger)

# dshim's engine tells a send from a receive by its buffer being non-NULL; an
# empty tensor's data_ptr() is 0, so a zero-byte send passes this instead
_NONNULL_BUF = ctypes.create_string_buffer(8)
_NONNULL = ctypes.addressof(_NONNULL_BUF)


def _as_list(x):
    if isinstance(x, torch.Tensor):
        return [x]
    return list(x)


def _is_async(opts):
    # options built in C++ (DDP) and calls without options are asynchronous
    return opts is None or getattr(opts, "asyncOp", True)


def _reduce_op_of(opts):
    if opts is None:
        return D.unpack_op(None)
    if isinstance(opts, (D._RT, dist.ReduceOp)):
        return D.unpack_op(opts)
    return D.unpack_op(getattr(opts, "reduceOp", None))


def _back_to_back(tensors, nbytes):
    """True when the tensors are plain and lie one after the other in memory."""
    if not all(_plain(t) for t in tensors):
        return False
    p = tensors[0].data_ptr()
    for t, n in zip(tensors, nbytes):
        if n and t.data_ptr() != p:
            return False
        p += n
    return True


def _cumsum(values):
    out = []
    acc = 0
    for v in values:
        out.append(acc)
        acc += v
    return out


# profiler event titles (after the backend's name) per operation, as ProcessGroupGloo
# titles its Work: every all-gather variant is "all_gather", both all-to-alls "all_to_all"
_PROFILE_TITLES = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce", "broadcast": "broadcast",
    "reduce": "reduce", "all_gather": "all_gather", "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all", "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}


# --------------------------------------------------------------------------
# flight-recorder labels (dshim_trace_label): which torch call an entry came from
# --------------------------------------------------------------------------

# "torch " + the name torch's own flight recorder gives the operation: ProcessGroupNCCL's
# profilingTitle without "nccl:" (what torch.distributed.flight_recorder.fr_trace calls the entry's
# type), e.g. all_gather_into_tensor is "_all_gather_base" there.  Two exceptions, named after torch's
# Python API: "barrier" (NCCL's "all_reduce_barrier" names its implementation, an all_reduce) and
# all_gather_coalesced (NCCL has none; gloo's profiler calls it "all_gather").  Pre-encoded: setting
# one costs a single ctypes call (~0.15 us).
_LABELS = {name: b"torch " + title.encode() for name, title in {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "allreduce_coalesced", "broadcast": "broadcast",
    "reduce": "reduce", "all_gather": "all_gather", "all_gather_coalesced": "all_gather_coalesced",
    "all_gather_into_tensor": "_all_gather_base",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced", "all_to_all_single": "all_to_all",
    "all_to_all": "all_to_all", "gather": "gather", "scatter": "scatter", "barrier": "barrier",
    "send": "send", "recv": "recv", "recv_anysource": "recv_anysource",
    "sparse_all_reduce": "all_reduce (sparse)",
}.items()}
_L_ALL_REDUCE = _LABELS["all_reduce"]
_L_SEND, _L_RECV, _L_RECV_ANY = _LABELS["send"], _LABELS["recv"], _LABELS["recv_anysource"]
_L_DDP_USED_MAP = b"DDP unused-parameter map"

# DDP's gradient all-reduces: "DDP bucket K", K the bucket's index.
#
# DDP's reducer calls the group's allreduce from C++ (its default hook, or a built-in C++ comm hook)
# with the bucket's flat gradient, nothing else: no GradBucket reaches the backend.  The rules:
#  1. Only inside a backward pass: torch._C._current_graph_task_id() != -1 in this thread (the thread
#     that runs the autograd hooks: the caller of backward() for CPU tensors, the engine's device
#     thread for CUDA ones); outside one every all_reduce is "torch all_reduce".
#  2. A Python comm hook (ddp.register_comm_hook(state, hook), the hooks of
#     torch.distributed.algorithms.ddp_comm_hooks) calls dist.all_reduce itself: the GradBucket is a
#     local of a frame above (the hook's `bucket`), found by walking at most _BUCKET_FRAMES frames up:
#     K = bucket.index(), exact, also when the hook reduces a bucket in several calls.  Calls made
#     later in a Future's then() callback (PowerSGD's second all_reduce) run outside the hook, in the
#     thread that completed the Future, outside the backward: "torch all_reduce".
#  3. Called from C++ (the caller's Python frame, if any, is not torch.distributed's): DDP's reducer.
#     An int32 tensor is the map of used parameters (find_unused_parameters=True, or static_graph's
#     first step): "DDP unused-parameter map".  Gradients are floating: the reducer launches its
#     buckets strictly in index order (Reducer::mark_bucket_ready: bucket i+1 never before bucket i),
#     one all_reduce each, so K = how many gradient all_reduces this thread issued so far in this
#     backward (counted per graph task id; a new backward starts again at 0).
# Limits of rule 3: two DDP models over the same group in one backward count as one sequence; a
# reentrant backward (torch.utils.checkpoint with use_reentrant=True) runs the hooks of the
# checkpointed part in an inner graph task, which restarts the count; a user's own group.allreduce
# made from C++ or directly from a custom backward (not through torch.distributed) is counted as a
# bucket.  A Python hook frame not found within _BUCKET_FRAMES frames leaves "torch all_reduce".
# The optimizer step is not seen: nothing of it reaches the backend (the next collectives are those
# of the next forward, or its backward's bucket 0).
_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_GradBucket = getattr(dist, "GradBucket", None)
_BUCKET_FRAMES = 8
_ddp_count = threading.local()   # .task: graph task id of the count, .next: the next bucket index


def _ddp_bucket_label(caller, tensors):
    """The label of an all_reduce issued inside a backward pass (rules above), or None.  caller:
    the Python frame that called DshimProcessGroup.allreduce (None when C++ called it from a thread
    with no Python frame)."""
    if caller is not None and caller.f_globals.get("__name__", "").startswith("torch.distributed."):
        # through torch.distributed's Python API: DDP's only when a Python comm hook made the call
        if _GradBucket is None:
            return None
        f = caller
        for _ in range(_BUCKET_FRAMES):
            f = f.f_back
            if f is None:
                return None
            for v in f.f_locals.values():
                if isinstance(v, _GradBucket):
                    return f"DDP bucket {v.index()}".encode()
        return None
    if len(tensors) == 1 and tensors[0].dtype == torch.int32:
        return _L_DDP_USED_MAP
    task = _graph_task_id()
    state = _ddp_count
    if getattr(state, "task", None) != task:
        state.task = task
        state.next = 0
    k = state.next
    state.next = k + 1
    return f"DDP bucket {k}".encode()


# The optimizer step on the timeline (DSHIM_TIMELINE): it issues no collective,
# so the backend sees it only through torch.optim's global step hooks, which
# fire for every optimizer of the process without a change to the script.
# Registered once, by the first group, and only while a timeline is written.
_optimizer_hooks = None
_optimizer_start = threading.local()


def _time_optimizer_steps(lib):
    global _optimizer_hooks
    if _optimizer_hooks is not None:
        return
    _optimizer_hooks = ()
    buf = ctypes.create_string_buffer(4096)
    if lib.dshim_config_get(b"DSHIM_TIMELINE", buf, len(buf)) != 0 or not buf.value:
        return
    try:
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
    except ImportError:   # torch before 2.0
        return

    def pre(optimizer, args, kwargs):
        _optimizer_start.t = time.monotonic_ns()

    def post(optimizer, args, kwargs):
        t0 = getattr(_optimizer_start, "t", None)
        if t0 is not None:
            _optimizer_start.t = None
            name = f"optimizer step ({type(optimizer).__name__})".encode()
            lib.dshim_trace_span(name, t0, time.monotonic_ns())

    _optimizer_hooks = (register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post))


# --------------------------------------------------------------------------
# the ProcessGroup
# --------------------------------------------------------------------------

class DshimProcessGroup(dist.ProcessGroup):
    """torch.distributed.ProcessGroup over one dshim communicator."""

    def __init__(self, store, rank, size, timeout, group_name=None, members=None):
        # the 2-argument constructor: the (store, rank, size) one is a pybind
        # factory that cannot build a Python subclass
        super().__init__(rank, size)
        if isinstance(timeout, datetime.timedelta):
            timeout_s = timeout.total_seconds()
        else:
            timeout_s = float(timeout) if timeout else 1800.0
        self._rank = rank
        self._size = size
        self._group_name = ""
        self._group_desc = ""
        self._observed_backend = "dshim"   # the asked name under the takeover (set_observed_backend)
        self._monitored_barriers = 0   # calls so far: names each call's keys in the store
        # "group of N" until torch names the group (setGroupName)
        # members: the group's job ranks as torch gives them ([] for the default group, None when
        # torch's legacy creator interface does not): they tie the rendezvous to this very group
        self._comm = _Comm(store, rank, size, timeout_s if timeout_s > 0 else 1800.0, f"group of {size}",
                           _Group.of(store, rank, size, group_name, members))
        self._dshim_lib = self._comm.lib
        _time_optimizer_steps(self._dshim_lib)
        log.info("dshim: rank %d/%d joined over %s", rank, size, self._comm.transport)

    # -- identity ---------------------------------------------------------------

    # always "dshim", also under the takeover (where get_backend() answers the
    # asked name): C++ readers act on it -- DDP's logger casts a group named
    # "gloo" to ProcessGroupGloo -- and dshim is not one
    def getBackendName(self):
        return "dshim"

    def name(self):
        return "dshim"

    def set_observed_backend(self, name):
        """The takeover's: the backend the script asked for ("gloo", "nccl"),
        which names what the script sees, e.g. profiler events ("gloo:send")."""
        self._observed_backend = name

    # the group name and description live in Python: the C++ accessors of a
    # ProcessGroup without C++ backends raise "ProcessGroup name not set"
    def getGroupName(self):
        return self._group_name

    def setGroupName(self, name):
        self._group_name = name
        self._comm.desc = f"group {name} of {self._size}"   # names the group in error messages
        self._name_ring()

    def getGroupDesc(self):
        return self._group_desc

    def setGroupDesc(self, desc):
        self._group_desc = desc
        self._name_ring()

    def _name_ring(self):
        """Names the group in flight-recorder dumps and the launcher's diagnosis."""
        text = f"torch group {self._group_name or '?'}"
        if self._group_desc:
            text += f" ({self._group_desc})"
        self._comm.set_trace_desc(text)

    # torch asks a group for its per-device backend object in a few places, e.g.
    # init_process_group(device_id=...) checks `pg._get_backend(dev).supports_splitting`.
    # This group serves every device itself.
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def _get_backend(self, device=None):
        return self

    @property
    def transport(self):
        """What carries this rank's traffic: "shm", "tcp", "shm+tcp" or "self"."""
        return self._comm.transport

    def dshim_stats(self):
        """dshim's counters for this group's communicator (collectives, bytes sent/received)."""
        return self._comm.stats()

    # -- plumbing ---------------------------------------------------------------

    def _go(self, name, opts, calls, stage, result, sync_ok=True, coll=True, inputs=None, label=None):
        """Issues `calls`; a collective runs inside a profiler event named as
        gloo names its own ("gloo:all_reduce" under the takeover of gloo), with
        `inputs` (default: the tensors of `result`) as the event's inputs.
        `label`: the flight recorder's name of the call (default _LABELS[name])."""
        if label is None:
            label = _LABELS.get(name)
        title = _PROFILE_TITLES.get(name)
        if title is None:
            return self._issue(name, opts, calls, stage, result, sync_ok, coll, label)
        if inputs is None:
            inputs = [t for t in result if isinstance(t, torch.Tensor)]
        return profiled(f"{self._observed_backend}:{title}", inputs,
                        lambda: self._issue(name, opts, calls, stage, result, sync_ok, coll, label))

    def _issue(self, name, opts, calls, stage, result, sync_ok, coll, label):
        # opts.timeout is not read: torch leaves it unset (kUnsetTimeout) on every
        # collective's options -- distributed_c10d.py never sets it, nor does DDP --
        # so the group's timeout applies, which the C core enforces (_comm.py)
        post = stage.post() if stage is not None else None
        comm = self._comm
        if sync_ok and not _is_async(opts):
            comm.run_sync(name, calls, post, coll, label)
            return DshimWork(None, result)
        src = comm.run_async(name, calls, result, post, stage.keep if stage is not None else None, coll, label)
        return DshimWork(src, result)

    def _premul(self, h, factor, dtype):
        """h *= factor, the local half of a PREMUL_SUM (h: a host buffer of the
        tensor of torch `dtype`): through dshim's reduction backend where that
        gives torch's bits (_dtypes.premul_scalar), else torch's mul_."""
        plain = h.dtype == dtype and h.is_contiguous() and h.device.type == "cpu"
        scalar = D.premul_scalar(dtype, factor) if plain else None
        with torch.no_grad():
            if scalar is None:
                h.mul_(factor)
                return
            code, value = scalar
            _lib.check(self._dshim_lib.dshim_scale_mul(self._comm.comm, h.data_ptr(), h.data_ptr(), h.numel(),
                                                       code, ctypes.byref(value)), "PREMUL_SUM scaling")

    def _check_root(self, root, what):
        if not 0 <= root < self._size:
            raise RuntimeError(f"dshim: {what}: root {root} is outside 0..{self._size - 1}")

    # -- collectives ------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        # in a backward pass: DDP's bucket? (_ddp_bucket_label); outside one this costs ~0.05 us
        label = _L_ALL_REDUCE
        if _graph_task_id() != -1:
            # the caller's frame; None when C++ called from a thread with no Python frame (CUDA autograd)
            label = _ddp_bucket_label(sys._getframe().f_back, tensors) or _L_ALL_REDUCE
        kind, factor = _reduce_op_of(opts)
        if any(t.layout != torch.strided for t in tensors):
            return self._sparse_allreduce(tensors, kind, factor, opts)
        lib = self._dshim_lib
        if len(tensors) == 1:
            t = tensors[0]
            dt, op, view = D.reduction(t.dtype, kind, "all_reduce")
            if _plain(t) and view is None and factor is None:
                # the hot path: no staging at all
                p = t.data_ptr()
                calls = ((lib.dshim_allreduce if not _is_async(opts) else lib.dshim_iallreduce,
                          (p, p, t.numel(), dt, op)),)
                # `tensors` (the Future's value) keeps the tensor alive until completion
                return self._go("all_reduce", opts, calls, None, tensors, label=label)
        stage = _Staging()
        calls = []
        for t in tensors:
            dt, op, view = D.reduction(t.dtype, kind, "all_reduce")
            h = stage.inout(t)
            if view is not None:
                h = torch.view_as_real(h)
            if factor is not None:
                self._premul(h, factor, t.dtype)
            calls.append((dt, op, h))
        return self._reduce_calls("all_reduce", opts, calls, stage, tensors, label)

    def _sparse_allreduce(self, tensors, kind, factor, opts):
        _sparse.check_layouts(tensors)
        _sparse.check_op(kind, factor)
        trace = _LABELS["sparse_all_reduce"]
        _sparse.allreduce(self, tensors, lambda label, calls: self._comm.run_sync(label, calls, None, label=trace))
        return DshimWork(None, tensors)

    def _reduce_calls(self, name, opts, calls, stage, result, label=None):
        lib = self._dshim_lib
        sync = not _is_async(opts)
        fn = lib.dshim_allreduce if sync else lib.dshim_iallreduce
        c = [(fn, (h.data_ptr(), h.data_ptr(), h.numel(), dt, op)) for dt, op, h in calls]
        return self._go(name, opts, c, stage, result, label=label)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._reduce_many("all_reduce_coalesced", tensors, opts)

    def _reduce_many(self, name, tensors, opts):
        tensors = _as_list(tensors)
        kind, factor = _reduce_op_of(opts)
        stage = _Staging()
        calls = []
        for t in tensors:
            dt, op, view = D.reduction(t.dtype, kind, name)
            h = stage.inout(t)
            if view is not None:
                h = torch.view_as_real(h)
            if factor is not None:
                self._premul(h, factor, t.dtype)
            calls.append((dt, op, h))
        return self._reduce_calls(name, opts, calls, stage, tensors)

    def broadcast(self, tensors, opts=None):
        tensors = _as_list(tensors)
        if isinstance(opts, int):   # broadcast(tensor, root)
            root, opts = opts, None
        else:
            root = opts.rootRank if opts is not None else 0
        self._check_root(root, "broadcast")
        lib = self._dshim_lib
        sync = not _is_async(opts)
        fn = lib.dshim_broadcast if sync else lib.dshim_ibroadcast
        stage = _Staging()
        calls = []
        for t in tensors:
            h = stage.inout(t) if root != self._rank else stage.input(t)
            calls.append((fn, (h.data_ptr(), _nbytes(h), D.BYTES, root)))
        return self._go("broadcast", opts, calls, stage, tensors)

    def reduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        kind, factor = _reduce_op_of(opts)
        root = opts.rootRank if opts is not None and hasattr(opts, "rootRank") else 0
        self._check_root(root, "reduce")
        lib = self._dshim_lib
        fn = lib.dshim_reduce if not _is_async(opts) else lib.dshim_ireduce
        stage = _Staging()
        calls = []
        for t in tensors:
            dt, op, view = D.reduction(t.dtype, kind, "reduce")
            if root == self._rank:
                h = stage.inout(t)
            else:
                # non-roots' tensors stay as they were: dshim reads a copy when
                # it must be scaled, the tensor itself otherwise
                h = stage.input(t) if factor is None else _host_clone(t)
                stage.keep.append(h)
            if view is not None:
                h = torch.view_as_real(h)
            if factor is not None:
                self._premul(h, factor, t.dtype)
            recv = h.data_ptr() if root == self._rank else None
            calls.append((fn, (h.data_ptr(), recv, h.numel(), dt, op, root)))
        return self._go("reduce", opts, calls, stage, tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if isinstance(input_tensors, torch.Tensor):   # allgather([outs], tensor)
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        if len(input_tensors) != 1 or len(output_tensors) != 1:
            raise RuntimeError("dshim: all_gather takes one input tensor and one list of outputs")
        outs, inp = output_tensors[0], input_tensors[0]
        n = self._size
        if len(outs) != n:
            raise RuntimeError(f"dshim: all_gather: {len(outs)} output tensors for a group of {n}")
        for o in outs:
            if o.dtype != inp.dtype:
                raise RuntimeError(f"dshim: all_gather: output dtype {o.dtype} differs from input dtype {inp.dtype}")
        if outs[self._rank].numel() != inp.numel():
            raise RuntimeError(f"dshim: all_gather: my output tensor has {outs[self._rank].numel()} elements, "
                               f"the input {inp.numel()}")
        stage = _Staging()
        src = stage.input(inp)
        counts = [_nbytes(o) for o in outs]
        if _back_to_back(outs, counts):
            # consecutive pieces of one buffer (all_gather_object's layout): gather in place
            stage.keep.extend(outs)
            base = outs[0].data_ptr()
        else:
            buf = torch.empty(sum(counts), dtype=torch.uint8)
            stage.keep.append(buf)
            for o, off, c in zip(outs, _cumsum(counts), counts):
                stage.keep.append(o)
                stage.add_back(o, buf[off:off + c].view(o.dtype))
            base = buf.data_ptr()
        lib = self._dshim_lib
        sync = not _is_async(opts)
        if all(c == counts[0] for c in counts):
            fn = lib.dshim_allgather if sync else lib.dshim_iallgather
            calls = ((fn, (src.data_ptr(), base, counts[0], D.BYTES)),)
        else:
            fn = lib.dshim_allgatherv if sync else lib.dshim_iallgatherv
            calls = ((fn, (src.data_ptr(), base, _lib.size_array(counts),
                           _lib.size_array(_cumsum(counts)), D.BYTES)),)
        # the Future's value: the list of outputs, as gloo's Work gives it
        return self._go("all_gather", opts, calls, stage, list(outs), inputs=[inp])

    def _allgather_base(self, output, input, opts=None):
        return self._gather_into("all_gather_into_tensor", [output], [input], opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._gather_into("all_gather_into_tensor_coalesced", outputs, inputs, opts)

    def _gather_into(self, name, outputs, inputs, opts):
        if len(outputs) != len(inputs):
            raise RuntimeError(f"dshim: {name}: {len(outputs)} outputs for {len(inputs)} inputs")
        lib = self._dshim_lib
        fn = lib.dshim_allgather if not _is_async(opts) else lib.dshim_iallgather
        stage = _Staging()
        calls = []
        for out, inp in zip(outputs, inputs):
            if out.dtype != inp.dtype or out.numel() != inp.numel() * self._size:
                raise RuntimeError(f"dshim: {name}: output ({out.numel()} x {out.dtype}) must hold group size "
                                   f"{self._size} x input ({inp.numel()} x {inp.dtype})")
            src = stage.input(inp)
            dst = stage.output(out)
            calls.append((fn, (src.data_ptr(), dst.data_ptr(), _nbytes(src), D.BYTES)))
        return self._go(name, opts, calls, stage, self._gathered_value(outputs, inputs), inputs=list(inputs))

    def _gathered_value(self, outputs, inputs):
        """The Future's value of all_gather_into_tensor(_coalesced), as gloo's: gloo gathers into the
        output's per-rank chunks along dim 0 and answers those views -- [chunk 0, chunk 1, ...] for
        one tensor, [[every output's chunk 0], [... chunk 1], ...] for several.  Output shapes gloo
        refuses (flat, stacked) and groups carried for NCCL answer the outputs, as NCCL does."""
        n = self._size
        if self._observed_backend == "nccl" or not all(
                i.dim() >= 1 and i.shape[0] > 0 and tuple(o.shape) == (n * i.shape[0],) + tuple(i.shape[1:])
                for o, i in zip(outputs, inputs)):
            return list(outputs)
        chunks = [o.split(i.shape[0]) for o, i in zip(outputs, inputs)]
        if len(outputs) == 1:
            return list(chunks[0])
        return [[c[r] for c in chunks] for r in range(n)]

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch's layout (gloo's too): output_lists[r] holds rank r's copy of
        every input.  The inputs travel as one block of bytes per rank."""
        name = "all_gather_coalesced"
        n = self._size
        if not input_list:
            raise RuntimeError(f"dshim: {name}: the input tensor list is empty")
        if any(t.dtype != input_list[0].dtype for t in input_list):
            raise RuntimeError(f"dshim: {name}: the input tensors mix dtypes; pass tensors of one dtype "
                               f"(as torch.distributed.all_gather_coalesced requires)")
        if len(output_lists) != n:
            raise RuntimeError(f"dshim: {name}: {len(output_lists)} output lists for a group of {n}; "
                               f"pass one list per rank, each shaped like the input list")
        for r, outs in enumerate(output_lists):
            if len(outs) != len(input_list):
                raise RuntimeError(f"dshim: {name}: output list {r} has {len(outs)} tensors, the input list "
                                   f"{len(input_list)}")
            for i, (o, inp) in enumerate(zip(outs, input_list)):
                if o.shape != inp.shape or o.dtype != inp.dtype:
                    raise RuntimeError(f"dshim: {name}: output {r}[{i}] is {tuple(o.shape)} x {o.dtype}, "
                                       f"input {i} is {tuple(inp.shape)} x {inp.dtype}")
        stage = _Staging()
        if len(input_list) == 1:
            src = stage.input(input_list[0])
        else:
            src = torch.cat([t.detach().reshape(-1).cpu().view(torch.uint8) for t in input_list])
            stage.keep.append(src)
        block = _nbytes(src)
        buf = torch.empty(block * n, dtype=torch.uint8)
        stage.keep.append(buf)
        sizes = [_nbytes(t) for t in input_list]
        for r, outs in enumerate(output_lists):
            for o, off, c in zip(outs, _cumsum(sizes), sizes):
                stage.keep.append(o)
                if c:
                    start = r * block + off
                    stage.add_back(o, buf[start:start + c].view(o.dtype))
        lib = self._dshim_lib
        fn = lib.dshim_allgather if not _is_async(opts) else lib.dshim_iallgather
        calls = ((fn, (src.data_ptr(), buf.data_ptr(), block, D.BYTES)),)
        return self._go(name, opts, calls, stage, output_lists, inputs=list(input_list))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        if isinstance(output_tensors, torch.Tensor):   # reduce_scatter(out, [ins], op)
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise RuntimeError("dshim: reduce_scatter takes one output tensor and one list of inputs")
        out, ins = output_tensors[0], input_tensors[0]
        n = self._size
        if len(ins) != n:
            raise RuntimeError(f"dshim: reduce_scatter: {len(ins)} input tensors for a group of {n}")
        kind, factor = _reduce_op_of(opts)
        dt, op, view = D.reduction(out.dtype, kind, "reduce_scatter")
        if any(i.dtype != out.dtype for i in ins):
            raise RuntimeError("dshim: reduce_scatter: input and output dtypes differ")
        if ins[self._rank].numel() != out.numel():
            raise RuntimeError(f"dshim: reduce_scatter: my input block has {ins[self._rank].numel()} elements, "
                               f"the output {out.numel()}")
        stage = _Staging()
        # the blocks, concatenated into one host buffer dshim may read (and, uneven, write)
        flat = torch.cat([i.detach().reshape(-1).cpu() for i in ins])
        stage.keep.append(flat)
        if factor is not None:
            self._premul(flat, factor, out.dtype)
        fview = torch.view_as_real(flat) if view is not None else flat
        lib = self._dshim_lib
        sync = not _is_async(opts)
        counts = [i.numel() for i in ins]
        dst = stage.output(out)
        dview = torch.view_as_real(dst) if view is not None else dst
        if all(c == counts[0] for c in counts):
            fn = lib.dshim_reduce_scatter if sync else lib.dshim_ireduce_scatter
            calls = ((fn, (fview.data_ptr(), dview.data_ptr(), dview.numel(), dt, op)),)
        else:
            # uneven blocks (counts in the elements dshim sees: complex ones are pairs)
            per = 2 if view is not None else 1
            fn = lib.dshim_reduce_scatterv if sync else lib.dshim_ireduce_scatterv
            calls = ((fn, (fview.data_ptr(), dview.data_ptr(), _lib.size_array([c * per for c in counts]), dt, op)),)
        return self._go("reduce_scatter", opts, calls, stage, output_tensors, inputs=list(ins))

    def _reduce_scatter_base(self, output, input, opts=None):
        return self._scatter_into("reduce_scatter_tensor", [output], [input], opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._scatter_into("reduce_scatter_tensor_coalesced", outputs, inputs, opts)

    def _scatter_into(self, name, outputs, inputs, opts):
        if len(outputs) != len(inputs):
            raise RuntimeError(f"dshim: {name}: {len(outputs)} outputs for {len(inputs)} inputs")
        kind, factor = _reduce_op_of(opts)
        lib = self._dshim_lib
        fn = lib.dshim_reduce_scatter if not _is_async(opts) else lib.dshim_ireduce_scatter
        stage = _Staging()
        calls = []
        for out, inp in zip(outputs, inputs):
            if out.dtype != inp.dtype or inp.numel() != out.numel() * self._size:
                raise RuntimeError(f"dshim: {name}: input ({inp.numel()} x {inp.dtype}) must hold group size "
                                   f"{self._size} x output ({out.numel()} x {out.dtype})")
            dt, op, view = D.reduction(out.dtype, kind, name)
            if factor is not None:
                src = _host_clone(inp)
                self._premul(src, factor, inp.dtype)
                stage.keep.append(src)
            else:
                src = stage.input(inp)
            dst = stage.output(out)
            if view is not None:
                src, dst = torch.view_as_real(src), torch.view_as_real(dst)
            calls.append((fn, (src.data_ptr(), dst.data_ptr(), dst.numel(), dt, op)))
        return self._go(name, opts, calls, stage, outputs, inputs=list(inputs))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self._size
        if output.dtype != input.dtype:
            raise RuntimeError("dshim: all_to_all_single: input and output dtypes differ")
        stage = _Staging()
        src = stage.input(input)
        dst = stage.output(output)
        lib = self._dshim_lib
        sync = not _is_async(opts)
        if not output_split_sizes and not input_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise RuntimeError(f"dshim: all_to_all_single: input of {input.numel()} elements does not split "
                                   f"evenly into {n} blocks, or the output ({output.numel()}) differs in size")
            fn = lib.dshim_alltoall if sync else lib.dshim_ialltoall
            calls = ((fn, (src.data_ptr(), dst.data_ptr(), _nbytes(src) // n, D.BYTES)),)
        else:
            scounts = self._split_bytes(input, input_split_sizes, "input")
            rcounts = self._split_bytes(output, output_split_sizes, "output")
            fn = lib.dshim_alltoallv if sync else lib.dshim_ialltoallv
            calls = ((fn, (src.data_ptr(), _lib.size_array(scounts), _lib.size_array(_cumsum(scounts)),
                           dst.data_ptr(), _lib.size_array(rcounts), _lib.size_array(_cumsum(rcounts)),
                           D.BYTES)),)
        return self._go("all_to_all_single", opts, calls, stage, [output], inputs=[input])

    def _split_bytes(self, t, splits, what):
        n = self._size
        if not splits:
            if t.numel() % n:
                raise RuntimeError(f"dshim: all_to_all_single: {what} of {t.numel()} elements does not split "
                                   f"evenly into {n} blocks")
            return [_nbytes(t) // n] * n
        splits = list(splits)
        if len(splits) != n:
            raise RuntimeError(f"dshim: all_to_all_single: {len(splits)} {what} split sizes for a group of {n}")
        rows = t.shape[0] if t.dim() > 0 else 1
        if sum(splits) != rows:
            raise RuntimeError(f"dshim: all_to_all_single: {what} split sizes sum to {sum(splits)}, "
                               f"but the tensor has {rows} rows")
        row_bytes = _nbytes(t) // rows if rows else 0
        return [s * row_bytes for s in splits]

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise RuntimeError(f"dshim: all_to_all: needs {n} input and {n} output tensors")
        stage = _Staging()
        scounts = [_nbytes(t) for t in input_tensors]
        rcounts = [_nbytes(t) for t in output_tensors]
        sbuf = torch.cat([t.detach().reshape(-1).cpu().view(torch.uint8) for t in input_tensors]) \
            if sum(scounts) else torch.empty(0, dtype=torch.uint8)
        rbuf = torch.empty(sum(rcounts), dtype=torch.uint8)
        stage.keep += [sbuf, rbuf]
        for o, off, c in zip(output_tensors, _cumsum(rcounts), rcounts):
            stage.keep.append(o)
            stage.add_back(o, rbuf[off:off + c].view(o.dtype))
        lib = self._dshim_lib
        fn = lib.dshim_alltoallv if not _is_async(opts) else lib.dshim_ialltoallv
        calls = ((fn, (sbuf.data_ptr(), _lib.size_array(scounts), _lib.size_array(_cumsum(scounts)),
                       rbuf.data_ptr(), _lib.size_array(rcounts), _lib.size_array(_cumsum(rcounts)), D.BYTES)),)
        return self._go("all_to_all", opts, calls, stage, output_tensors, inputs=list(input_tensors))

    def gather(self, output_tensors, input_tensors, opts=None):
        inp = _as_list(input_tensors)
        if len(inp) != 1:
            raise RuntimeError("dshim: gather takes one input tensor")
        inp = inp[0]
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "gather")
        stage = _Staging()
        src = stage.input(inp)
        nb = _nbytes(src)
        recv = None
        if root == self._rank:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise RuntimeError(f"dshim: gather: the root needs a list of {self._size} output tensors")
            outs = output_tensors[0]
            if any(_nbytes(o) != nb or o.dtype != inp.dtype for o in outs):
                raise RuntimeError("dshim: gather: every output tensor must be shaped like the input")
            buf = torch.empty(nb * self._size, dtype=torch.uint8)
            stage.keep.append(buf)
            for i, o in enumerate(outs):
                stage.keep.append(o)
                stage.add_back(o, buf[i * nb:(i + 1) * nb].view(o.dtype))
            recv = buf.data_ptr()
        lib = self._dshim_lib
        fn = lib.dshim_gather if not _is_async(opts) else lib.dshim_igather
        calls = ((fn, (src.data_ptr(), recv, nb, D.BYTES, root)),)
        # the Future's value, as gloo's: the root's list of outputs, an empty list elsewhere
        result = list(output_tensors[0]) if root == self._rank else []
        return self._go("gather", opts, calls, stage, result, inputs=[inp])

    def scatter(self, output_tensors, input_tensors, opts=None):
        out = _as_list(output_tensors)
        if len(out) != 1:
            raise RuntimeError("dshim: scatter takes one output tensor")
        out = out[0]
        root = opts.rootRank if opts is not None else 0
        self._check_root(root, "scatter")
        stage = _Staging()
        dst = stage.output(out)
        nb = _nbytes(dst)
        send = None
        if root == self._rank:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise RuntimeError(f"dshim: scatter: the root needs a list of {self._size} input tensors")
            ins = input_tensors[0]
            if any(_nbytes(i) != nb or i.dtype != out.dtype for i in ins):
                raise RuntimeError("dshim: scatter: every input tensor must be shaped like the output")
            buf = torch.cat([i.detach().reshape(-1).cpu().view(torch.uint8) for i in ins]) if nb \
                else torch.empty(0, dtype=torch.uint8)
            stage.keep.append(buf)
            send = buf.data_ptr()
        lib = self._dshim_lib
        fn = lib.dshim_scatter if not _is_async(opts) else lib.dshim_iscatter
        calls = ((fn, (send, dst.data_ptr(), nb, D.BYTES, root)),)
        return self._go("scatter", opts, calls, stage, [out], inputs=list(input_tensors[0]) if send is not None else [])

    def barrier(self, opts=None):
        lib = self._dshim_lib
        fn = lib.dshim_barrier if not _is_async(opts) else lib.dshim_ibarrier
        return self._go("barrier", opts, ((fn, ()),), None, [])

    # -- point to point -----------------------------------------------------------
    # always asynchronous: send and recv are matched by order per peer (dshim has
    # no tags), and a blocking send could wait for a receive posted after it.
    # A receive from any source takes the first message of whichever rank sends
    # (MPI's matching, include/dshim.h); its Work's _source_rank() says who.

    def send(self, tensors, dst, tag=0):
        tensors = _as_list(tensors)
        self._check_peer(dst, "send")
        stage = _Staging()
        lib = self._dshim_lib
        calls = [(lib.dshim_isend, (h.data_ptr() or _NONNULL, _nbytes(h), D.BYTES, dst))
                 for h in map(stage.input, tensors)]
        return profiled(f"{self._observed_backend}:send", tensors,
                        lambda: self._go(f"send to rank {dst}", None, calls, stage, tensors, sync_ok=False,
                                         coll=False, label=_L_SEND))

    def recv(self, tensors, src, tag=0):
        tensors = _as_list(tensors)
        self._check_peer(src, "recv")
        stage = _Staging()
        lib = self._dshim_lib
        calls = [(lib.dshim_irecv, (h.data_ptr(), _nbytes(h), D.BYTES, src)) for h in map(stage.output, tensors)]
        work = profiled(f"{self._observed_backend}:recv", tensors,
                        lambda: self._go(f"recv from rank {src}", None, calls, stage, tensors, sync_ok=False,
                                         coll=False, label=_L_RECV))
        work._set_source(src)
        return work

    def recv_anysource(self, tensors, tag=0):
        tensors = _as_list(tensors)
        if len(tensors) != 1:
            raise RuntimeError(f"dshim: recv from any source takes one tensor, got {len(tensors)} (each could come "
                               f"from another rank); receive them one by one")
        if self._size < 2:
            raise RuntimeError("dshim: recv from any source in a group of 1 rank: no other rank could ever send")
        stage = _Staging()
        source = ctypes.c_int(-1)   # dshim writes the sender's rank before the receive completes
        stage.keep.append(source)
        h = stage.output(tensors[0])
        calls = [(self._dshim_lib.dshim_irecv_any, (h.data_ptr(), _nbytes(h), D.BYTES, ctypes.byref(source)))]
        work = profiled(f"{self._observed_backend}:recvAnySource", tensors,
                        lambda: self._go("recv from any source", None, calls, stage, tensors, sync_ok=False,
                                         coll=False, label=_L_RECV_ANY))
        work._set_source(source)
        return work

    def _check_peer(self, peer, what):
        if not 0 <= peer < self._size or peer == self._rank:
            raise RuntimeError(f"dshim: {what}: peer {peer} is not another rank of this group "
                               f"(0..{self._size - 1}, I am {self._rank})")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """gloo's monitored barrier: rank 0 names the ranks that did not arrive
        within `timeout` (the group's timeout when None); _monitored.py."""
        if self._comm._closed:
            self._comm._refuse_closed("monitored_barrier")
        call = self._monitored_barriers
        self._monitored_barriers += 1
        _monitored.monitored_barrier(self._comm.store, self._comm.token, call, self._rank, self._size, timeout,
                                     self._comm.timeout_s, wait_all_ranks)

    # -- lifetime -------------------------------------------------------------------

    def shutdown(self):
        """destroy_process_group(): waits for outstanding work, then closes."""
        self._comm.close()

    def abort(self):
        self._comm.abort(f"rank {self._rank} called abort()")
        self._comm.close()

    def __del__(self):
        comm = getattr(self, "_comm", None)
        if comm is not None and not comm._closed:
            # destroy can block (the store host waits for every rank's goodbye):
            # never in the garbage collector's thread; at interpreter exit the
            # atexit handler closes what is left
            try:
                threading.Thread(target=comm.close, name="dshim-close", daemon=True).start()
            except RuntimeError:   # no new threads during interpreter shutdown
                pass


def create_process_group(store, rank, size, timeout, group_name=None, members=None):
    """The creator registered with Backend.register_backend (through dshim._create)."""
    pg = DshimProcessGroup(store, rank, size, timeout, group_name, members)
    # dist.monitored_barrier on a group created as "dshim" by name (torch's own
    # guard lets only "gloo" through; the takeover's groups already answer "gloo")
    _monitored.let_torch_call_dshim()
    # ddp._register_builtin_comm_hook(FP16_COMPRESS) on a dshim group: _builtin_hooks.py
    _builtin_hooks.install()
    return pg
