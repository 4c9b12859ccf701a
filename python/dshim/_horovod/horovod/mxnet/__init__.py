"""horovod.mxnet on dshim: Horovod 0.28.1's MXNet API (the names its horovod/mxnet/__init__.py
exports), its operations matched by name across ranks by dshim's engine (horovod.mxnet.mpi_ops),
on CPU NDArrays.  DistributedOptimizer, DistributedTrainer and broadcast_parameters follow
Horovod's: a Gloo build (nccl_built() is 0) averages in the framework, so gradients are summed
across ranks and the optimizer's rescale_grad / the trainer's scale carry
gradient_predivide_factor / size."""
import types
import warnings
from collections import OrderedDict, defaultdict

import mxnet as mx

from horovod.common.util import split_list

from horovod.mxnet.compression import Compression
from horovod.mxnet.functions import allgather_object, broadcast_object
from horovod.mxnet.mpi_ops import allgather, grouped_allgather
from horovod.mxnet.mpi_ops import allreduce, allreduce_, grouped_allreduce, grouped_allreduce_
from horovod.mxnet.mpi_ops import alltoall
from horovod.mxnet.mpi_ops import broadcast, broadcast_
from horovod.mxnet.mpi_ops import reducescatter, grouped_reducescatter
from horovod.mxnet.mpi_ops import init, shutdown
from horovod.mxnet.mpi_ops import is_initialized, start_timeline, stop_timeline
from horovod.mxnet.mpi_ops import size, local_size, cross_size, rank, local_rank, cross_rank
from horovod.mxnet.mpi_ops import mpi_threads_supported, mpi_enabled, mpi_built
from horovod.mxnet.mpi_ops import gloo_enabled, gloo_built
from horovod.mxnet.mpi_ops import nccl_built, ddl_built, ccl_built, cuda_built, rocm_built
from horovod.mxnet.mpi_ops import ProcessSet, global_process_set, add_process_set, remove_process_set
from horovod.mxnet.mpi_ops import Average, Sum, Adasum, Min, Max, Product
from horovod.mxnet.mpi_ops import HorovodMXNetError


def _check_has_gpu():
    """Whether MXNet sees a GPU (horovod.common.util.gpu_available runs it in a child process)."""
    return mx.context.num_gpus() > 0


def _average_in_framework():
    """Horovod averages in the framework where its allreduce cannot (ROCm, or no NCCL >= 2.10):
    always so in a Gloo build such as this one."""
    return rocm_built() or nccl_built() < 21000


class DistributedOptimizer(mx.optimizer.Optimizer):
    """An mx.optimizer.Optimizer whose update() first sums each gradient over the processes of
    process_set (scaled by 1/gradient_predivide_factor before the sum; rescale_grad carries
    gradient_predivide_factor / size after it); num_groups > 0: the gradients of one update()
    call travel in that many grouped allreduces."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0, process_set=global_process_set):
        if gradient_predivide_factor != 1.0 and rocm_built():
            raise ValueError('gradient_predivide_factor not supported yet with ROCm')
        self._optimizer = optimizer
        self._gradient_predivide_factor = gradient_predivide_factor
        self._average_in_framework = False
        self._postscale_factor = gradient_predivide_factor   # the C side divides Average by size
        if _average_in_framework():
            self._optimizer.rescale_grad *= (gradient_predivide_factor / process_set.size())
            self._postscale_factor = 1.0
            self._average_in_framework = True
        self._num_groups = num_groups
        self._process_set = process_set

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _do_allreduce(self, index, grad):
        if self._process_set.size() == 1:
            return
        kw = dict(op=Average if not self._average_in_framework else Sum,
                  prescale_factor=1.0 / self._gradient_predivide_factor,
                  postscale_factor=self._postscale_factor, process_set=self._process_set)
        if isinstance(index, (tuple, list)):
            if self._num_groups > 0:
                for i, (grads, indices) in enumerate(zip(split_list(grad, self._num_groups),
                                                         split_list(index, self._num_groups))):
                    grouped_allreduce_(tensors=grads, name="{}:{}".format(indices[0], indices[-1]), priority=-i, **kw)
            else:
                for i in range(len(index)):
                    allreduce_(grad[i], name=str(index[i]), priority=-i, **kw)
        else:
            allreduce_(grad, name=str(index), **kw)

    def update(self, index, weight, grad, state):
        if self._process_set.included():
            self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        if self._process_set.included():
            self._do_allreduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon.Trainer whose gradients are summed over the processes of process_set by Horovod's
    allreduce instead of a kvstore, and averaged through the trainer's scale
    (gradient_predivide_factor / size; 1/gradient_predivide_factor before the sum).

    compression: Compression.none or .fp16 around each gradient's allreduce.  prefix: the names'
    prefix, different for each trainer of one program.  num_groups > 0: the gradients travel in
    that many grouped allreduces (per dtype)."""

    def __init__(self, params, optimizer, optimizer_params=None, compression=Compression.none,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0, process_set=global_process_set):
        self._compression = compression
        self._process_set = process_set
        if gradient_predivide_factor != 1.0 and rocm_built():
            raise ValueError('gradient_predivide_factor not supported yet with ROCm')
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer "
                          "as its optimizer. We have unwrapped it for you.")
        # the same order of parameters on every rank (gluon sorts since 1.6; Horovod does it too)
        if isinstance(params, dict):
            params = OrderedDict(params)
        elif isinstance(params, (list, tuple)):
            params = sorted(params)
        super(DistributedTrainer, self).__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._gradient_predivide_factor = gradient_predivide_factor
        self._average_in_framework = False
        self._postscale_factor = gradient_predivide_factor
        if _average_in_framework():
            self._scale *= (gradient_predivide_factor / process_set.size())
            self._postscale_factor = 1.0
            self._average_in_framework = True
        assert prefix is None or isinstance(prefix, str)
        self._prefix = prefix if prefix else ""
        self._num_groups = num_groups

    def _allreduce_grads(self):
        if self._process_set.size() == 1 or not self._process_set.included():
            return
        kw = dict(op=Average if not self._average_in_framework else Sum,
                  prescale_factor=1.0 / self._gradient_predivide_factor,
                  postscale_factor=self._postscale_factor, process_set=self._process_set)
        if self._num_groups > 0:
            grads, names, ctxs = [], [], []
            for i, param in enumerate(self._params):
                if param.grad_req != 'null':
                    compressed, ctx = self._compression.compress(param.list_grad()[0])
                    grads.append(compressed)
                    ctxs.append(ctx)
                    names.append(self._prefix + str(i))
            for i, (group_grads, group_names) in enumerate(zip(split_list(grads, self._num_groups),
                                                               split_list(names, self._num_groups))):
                by_dtype = defaultdict(list)   # one grouped allreduce per dtype, as Horovod
                for grad, name in zip(group_grads, group_names):
                    by_dtype[grad.dtype].append((grad, name))
                for entries in by_dtype.values():
                    g, n = zip(*entries)
                    grouped_allreduce_(tensors=list(g), name="{}:{}".format(n[0], n[-1]), priority=-i, **kw)
            if self._compression != Compression.none:
                k = 0
                for param in self._params:
                    if param.grad_req != 'null':
                        param.list_grad()[0][:] = self._compression.decompress(grads[k], ctxs[k])
                        k += 1
        else:
            for i, param in enumerate(self._params):
                if param.grad_req != 'null':
                    compressed, ctx = self._compression.compress(param.list_grad()[0])
                    allreduce_(compressed, name=self._prefix + str(i), priority=-i, **kw)
                    if self._compression != Compression.none:
                        param.list_grad()[0][:] = self._compression.decompress(compressed, ctx)


def _append_broadcast_init(param, root_rank, name):
    """param's _init_impl followed by a broadcast of its data from root_rank: a parameter whose
    shape is known only at the first forward pass is broadcast when it is initialised."""
    init_impl = getattr(param, '_init_impl')

    def wrapped_init_impl(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        broadcast_(self.data(), root_rank=root_rank, name=name)
    return wrapped_init_impl


def broadcast_parameters(params, root_rank=0, prefix=None):
    """The parameters of root_rank copied into every rank's: a dict of NDArrays or of gluon
    Parameters, or a gluon ParameterDict (Block.collect_params()), in the order of their sorted
    names.  Parameters not initialised yet (deferred initialisation) are broadcast when they are.
    prefix: different for each call of one program (the operations' names)."""
    if size() == 1:
        return
    tensors, names = [], []
    assert prefix is None or isinstance(prefix, str)
    prefix = prefix if prefix else ""
    try:
        from mxnet.gluon.parameter import ParameterDict
        valid_types = (dict, ParameterDict)
    except ImportError:
        valid_types = (dict,)
    if not isinstance(params, valid_types):
        raise ValueError('invalid params of type: %s' % type(params))
    for name, p in sorted(params.items()):
        try:
            tensors.append(p.data() if isinstance(p, mx.gluon.parameter.Parameter) else p)
            names.append(prefix + str(name))
        except mx.gluon.parameter.DeferredInitializationError:
            p._init_impl = types.MethodType(_append_broadcast_init(p, root_rank, prefix + str(name)), p)
    for tensor, name in zip(tensors, names):
        broadcast_(tensor, root_rank, name=name)
