"""hvd.DistributedOptimizer (Horovod 0.28.1): wraps a torch optimizer so that every gradient is
allreduced across the ranks as soon as backward() has produced it, and step() applies the
reduced gradients.

DistributedOptimizer(opt) returns an instance of a class made on the spot, a subclass of
opt's own class (isinstance(hvd_opt, torch.optim.SGD) holds, state_dict() is the base
class's), whose methods are those of _DistributedOptimizer below; it takes over opt's
param_groups.  A hook on each parameter's gradient accumulator submits that gradient's
allreduce, named after the parameter, when backward_passes_per_step backward passes have
accumulated into it; the engine matches names across ranks, so gradients that become ready in
a different order on each rank (or not at all: synchronize() submits zeros for them) still meet.
"""
import ctypes
import warnings

from contextlib import contextmanager

import torch

from horovod.common.util import split_list

from horovod.torch.compression import Compression
from horovod.torch.functions import broadcast_object
from horovod.torch.mpi_ops import allreduce_async_, grouped_allreduce_async_, sparse_allreduce_async
from horovod.torch.mpi_ops import synchronize
from horovod.torch.mpi_ops import size
from horovod.torch.mpi_ops import Average, Adasum
from horovod.torch.mpi_ops import rocm_built
from horovod.torch.mpi_ops import global_process_set

_TOO_MANY_PASSES = ("Gradients were computed more than "
                    "backward_passes_per_step times before call "
                    "to step(). Increase backward_passes_per_step to "
                    "accumulate gradients locally.")
_ZERO_GRAD_RACE = ("optimizer.zero_grad() was called after loss.backward() "
                   "but before optimizer.step() or optimizer.synchronize(). "
                   "This is prohibited as it can cause a race condition.")
_STEP_AFTER_SYNC = ("optimizer.step() called without "
                    "optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training "
                    "slowdown. You may want to consider using "
                    "optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.")


def _elastic_job():
    """HOROVOD_ELASTIC=1 (horovodrun's elastic mode), read from dshim's configuration table: an
    elastic job hooks the gradients even while it has one rank, since ranks may join later."""
    from dshim._lib import lib
    buf = ctypes.create_string_buffer(8)
    return lib().dshim_config_get(b"HOROVOD_ELASTIC", buf, len(buf)) == 0 and buf.value == b"1"


def _find_duplicates(names):
    seen, dups = set(), set()
    for name in names:
        if name in seen:
            dups.add(name)
        seen.add(name)
    return dups


def _checked_names(param_groups, named_parameters, default_name):
    """named_parameters as a list of (name, tensor), with Horovod's checks: tuples only, unique
    names, every parameter of the optimizer named.  None: default_name(group index, index in
    group) for each parameter."""
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(default_name(i, j), p)
                            for i, group in enumerate(param_groups)
                            for j, p in enumerate(group['params'])]

    if any(not isinstance(entry, tuple) for entry in named_parameters):
        raise ValueError('named_parameters should be a sequence of '
                         'tuples (name, parameter), usually produced by '
                         'model.named_parameters().')

    dups = _find_duplicates([name for name, _ in named_parameters])
    if dups:
        raise ValueError('Parameter names in named_parameters must be unique. '
                         'Found duplicates: %s' % ', '.join(dups))

    all_ids = {id(p) for group in param_groups for p in group['params']}
    unnamed = all_ids - {id(p) for _, p in named_parameters}
    if unnamed:
        raise ValueError('named_parameters was specified, but one or more model '
                         'parameters were not named. Python object ids: '
                         '%s' % ', '.join(str(i) for i in unnamed))
    return named_parameters


def _grad_accumulator(p):
    """The autograd node that accumulates p's gradient into p.grad: a hook on it runs once the
    gradient of this backward pass has been added."""
    return p.expand_as(p).grad_fn.next_functions[0][0]


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression,
                 backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0,
                 groups=None,
                 sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression

        named_parameters = _checked_names(self.param_groups, named_parameters,
                                          lambda i, j: f'allreduce.noname.{i}.{j}')
        self._parameter_names = {p: name for name, p in sorted(named_parameters)}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for _, p in sorted(named_parameters)}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set

        # parameter (or tuple of a group's parameters) -> (handle or None, compression ctx)
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True

        if groups is not None:
            if not (isinstance(groups, list) or groups > 0):
                raise ValueError('groups should be a non-negative integer or '
                                 'a list of list of torch.Tensor.')
            if isinstance(groups, list):
                grouped = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError('groups must consist of torch.Tensor.')
                        if id(p) in grouped:
                            raise ValueError('A parameter can only appear once in groups.')
                        grouped.add(id(p))
        self._groups = groups
        self._p_to_group = {}
        self._group_counts = {}

        if self.process_set.included() and (size() > 1 or _elastic_job()):
            self._register_hooks()

    def load_state_dict(self, *args, **kwargs):
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    @staticmethod
    def find_duplicates(lst):
        return _find_duplicates(lst)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _form_groups(self):
        """Tuples of parameters whose gradients travel in one grouped allreduce.  Every rank
        must form the same tuples, so the order of the parameters is rank 0's."""
        trainable = [p for group in self.param_groups for p in group['params'] if p.requires_grad]
        order = broadcast_object([self._parameter_names.get(p) for p in trainable],
                                 root_rank=0, process_set=self.process_set)
        trainable.sort(key=lambda p: order.index(self._parameter_names.get(p)))

        if isinstance(self._groups, list):
            trainable_ids = {id(p) for p in trainable}
            formed, placed = [], set()
            for group in self._groups:
                members = [p for p in group if id(p) in trainable_ids]
                formed.append(members)
                placed.update(id(p) for p in members)
            formed.extend([p] for p in trainable if id(p) not in placed)
        else:
            formed = split_list(trainable, self._groups)

        for members in formed:
            group = tuple(members)
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0

    def _register_hooks(self):
        if self._groups is not None:
            self._form_groups()
        for group in self.param_groups:
            for p in group['params']:
                if p.requires_grad:
                    self._requires_update.add(p)
                    acc = _grad_accumulator(p)
                    acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(acc)  # the node lives as long as the hook is wanted

    def _allreduce_grad_async(self, p):
        if p.grad is None:
            # This rank computed no gradient for p (a branch it did not take) but others may
            # have: it still takes part, with zeros.  A sparse gradient cannot be foreseen here.
            p.grad = p.data.new(p.size()).zero_()

        name = self._parameter_names.get(p)
        tensor = p.grad
        if tensor.is_sparse:
            if not self.sparse_as_dense:
                return self._sparse_allreduce_grad_async(p, name)
            tensor = tensor.to_dense()

        compressed, ctx = self._compression.compress(tensor)
        if self.op == Average:
            # the average split around the sum: x / f summed, times f / size (the engine
            # divides by the size for Average)
            prescale = 1.0 / self.gradient_predivide_factor
            postscale = self.gradient_predivide_factor
        else:
            prescale = postscale = 1.0
        handle = allreduce_async_(compressed, name=name, op=self.op,
                                  prescale_factor=prescale, postscale_factor=postscale,
                                  process_set=self.process_set)
        return handle, ctx

    def _grouped_allreduce_grad_async(self, group):
        name = self._parameter_names.get(group[0])
        compressed, ctxs = zip(*[self._compression.compress(p.grad) for p in group])
        handle = grouped_allreduce_async_(compressed, name=name, op=self.op,
                                          process_set=self.process_set)
        return handle, ctxs

    def _sparse_allreduce_grad_async(self, p, name):
        handle = sparse_allreduce_async(p.grad, name=name, op=self.op,
                                        process_set=self.process_set)
        return handle, None

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None and \
                    self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0

            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                if self._groups is not None:
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        self._handles[group] = self._grouped_allreduce_grad_async(group)
                        for member in group:  # their placeholders from earlier hooks
                            self._handles.pop(member, None)
                        self._group_counts[group] = 0
                        return
                else:
                    handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        """Waits for every gradient's allreduce (submitting those whose hooks did not fire,
        or fired fewer than backward_passes_per_step times) and writes the results into .grad."""
        if not self.process_set.included():
            self._synchronized = True
            return

        submitted = set()
        for key in self._handles:
            if isinstance(key, tuple):
                submitted.update(key)
            else:
                submitted.add(key)
        for p in self._requires_update - submitted:
            self._handles[p] = self._allreduce_grad_async(p)

        for p, (handle, ctx) in self._handles.items():
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)

        for p, (handle, ctx) in self._handles.items():
            if isinstance(p, tuple):
                outputs = synchronize(handle)
                for member, output, member_ctx in zip(p, outputs, ctx):
                    self._allreduce_delay[member] = self.backward_passes_per_step
                    member.grad.set_(self._compression.decompress(output, member_ctx))
                if self._groups is not None and self._group_counts[p] != 0:
                    self._group_counts[p] = 0
                continue

            # a sparse allreduce's handle is a function returning the result
            output = handle() if callable(handle) else synchronize(handle)
            self._allreduce_delay[p] = self.backward_passes_per_step
            if self._groups is not None:
                group = self._p_to_group[p]
                if self._group_counts[group] != 0:
                    self._group_counts[group] = 0
            if p.grad.is_sparse:
                reduced = self._compression.decompress(output, ctx)
                if not reduced.is_sparse:
                    reduced = reduced.to_sparse()  # sparse_as_dense: back to the grad's layout
                # set_ does not take sparse tensors
                p.grad.zero_().add_(reduced)
            else:
                p.grad.set_(self._compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """step() inside this context does not synchronize: for a synchronize() the script
        called itself (e.g. to clip gradients in between)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(_STEP_AFTER_SYNC)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(_ZERO_GRAD_RACE)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    """op=Adasum with more than one rank: each parameter's hook runs the wrapped optimizer's
    step for that parameter alone, from a zeroed start, so the parameter then holds the step's
    delta; the deltas are Adasum-reduced, and step() adds the reduced delta to the parameter's
    value before the step."""

    def __init__(self, params, named_parameters, compression,
                 backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        self._compression = compression

        named_parameters = _checked_names(self.param_groups, named_parameters,
                                          lambda i, j: 'allreduce.noname.%s' % j)
        self._parameter_names = {p: name for name, p in sorted(named_parameters)}
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for _, p in sorted(named_parameters)}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._starting_models = {p: torch.zeros_like(p, requires_grad=False)
                                 for _, p in named_parameters}
        self._register_hooks()

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def _register_hooks(self):
        for group in self.param_groups:
            for p in group['params']:
                if p.requires_grad:
                    p.grad = p.data.new(p.size()).zero_()
                    self._requires_update.add(p)
                    acc = _grad_accumulator(p)
                    acc.register_hook(self._make_hook(p))
                    self._grad_accs.append(acc)

    def _allreduce_grad_async(self, p):
        name = self._parameter_names.get(p)
        start = self._starting_models[p]

        # the wrapped optimizer steps p alone: every group but p's is emptied for the call
        stashed = [group['params'] for group in self.param_groups]
        for group in self.param_groups:
            group['params'] = [p] if any(p is q for q in group['params']) else []

        start.data.copy_(p)
        super(self.__class__, self).step()
        p.data.sub_(start)  # p now holds the step's delta

        compressed, ctx = self._compression.compress(p)
        handle = allreduce_async_(compressed.data, name=name, op=Adasum)

        for params, group in zip(stashed, self.param_groups):
            group['params'] = params
        return handle, ctx

    def _make_hook(self, p):
        def hook(*ignore):
            if p in self._handles and self._handles[p][0] is not None and \
                    self._allreduce_delay[p] <= 0:
                raise AssertionError(_TOO_MANY_PASSES)
            assert not p.grad.requires_grad
            assert self._allreduce_delay[p] > 0
            handle, ctx = None, None
            self._allreduce_delay[p] -= 1
            if self._allreduce_delay[p] == 0:
                handle, ctx = self._allreduce_grad_async(p)
            self._handles[p] = (handle, ctx)
        return hook

    def synchronize(self):
        pass

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")

    def step(self, closure=None):
        loss = None
        if closure is not None:
            loss = closure()

        for p in self._requires_update - set(self._handles.keys()):
            self._handles[p] = self._allreduce_grad_async(p)

        for p, (handle, ctx) in self._handles.items():
            if not handle:
                # step() came before backward_passes_per_step passes: reduce what there is now
                handle, ctx = self._allreduce_grad_async(p)
                self._handles[p] = (handle, ctx)
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._starting_models[p]
            start.data.add_(delta.data)
            p.data.copy_(start)
            self._allreduce_delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError(_ZERO_GRAD_RACE)
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None,
                         compression=Compression.none,
                         backward_passes_per_step=1,
                         op=Average,
                         gradient_predivide_factor=1.0,
                         num_groups=0, groups=None,
                         sparse_as_dense=False,
                         process_set=global_process_set):
    """An optimizer that allreduces the gradients across the ranks before the wrapped
    optimizer applies them.

    Each gradient's allreduce starts as soon as backward() has produced it; step() waits for all
    of them (synchronize()) and then steps.  To work on the reduced gradients before the step
    (e.g. clipping), call optimizer.synchronize() and then step inside
    `with optimizer.skip_synchronize():`.

    Arguments:
        optimizer: the torch optimizer to wrap.
        named_parameters: (name, parameter) pairs, usually model.named_parameters(); the names
            name the allreduces and must be unique.  Default: names by position.
        compression: Compression.none (default) or Compression.fp16.
        backward_passes_per_step: backward passes accumulated locally before the allreduce.
        op: Average (default), Sum or Adasum.
        gradient_predivide_factor: with op=Average, gradients are multiplied by
            1 / gradient_predivide_factor before the sum and by gradient_predivide_factor / size
            after it.
        num_groups: deprecated spelling of an integer groups.
        groups: an integer n (the gradients travel in n grouped allreduces) or a list of lists of
            parameters (each list one grouped allreduce; parameters in no list alone).
        sparse_as_dense: sparse gradients are reduced as dense tensors and made sparse again.
        process_set: the ranks whose gradients are reduced (default: all).
    """
    if gradient_predivide_factor != 1.0:
        if rocm_built():
            raise ValueError('gradient_predivide_factor not supported yet with ROCm')
        if op != Average:
            raise ValueError('gradient_predivide_factor not supported with op != Average')

    if num_groups != 0:
        warnings.warn('Parameter `num_groups` has been replaced by `groups` '
                      'and will be removed in v0.23.0.', DeprecationWarning)
        if groups is None:
            groups = num_groups

    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")

    base = optimizer.__class__
    if op != Adasum or size() == 1:
        cls = type(base.__name__, (base,), dict(_DistributedOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step,
                   op, gradient_predivide_factor, groups, sparse_as_dense, process_set)

    if process_set != global_process_set:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    cls = type(base.__name__, (base,), dict(_DistributedAdasumOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
