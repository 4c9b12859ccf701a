"""Broadcasting model and optimizer state, and moving arbitrary Python objects between ranks
(Horovod 0.28.1's horovod.torch.functions): broadcast_parameters, broadcast_optimizer_state,
broadcast_object, allgather_object.

Objects travel as cloudpickle bytes in a uint8 tensor, preceded by their length, exactly as
Horovod sends them, so the names a script sees in a timeline or a stall warning
("<name>.sz", "<name>.t") are Horovod's.
"""
import collections
import io

import torch

from horovod.torch.mpi_ops import allgather, broadcast_, broadcast_async_
from horovod.torch.mpi_ops import synchronize
from horovod.torch.mpi_ops import rank, size
from horovod.torch.mpi_ops import global_process_set



def _cloudpickle():
    """cloudpickle, which Horovod itself requires; imported on first use so that horovod.torch loads
    without it (pip install dshim[horovod] brings it)."""
    try:
        import cloudpickle
    except ImportError:
        raise ImportError("horovod.torch on dshim: broadcast_object and allgather_object need cloudpickle, as "
                          "Horovod does: pip install cloudpickle (or dshim[horovod])") from None
    return cloudpickle

def broadcast_parameters(params, root_rank):
    """Overwrites every rank's parameters with root_rank's.

    params: a dict name -> tensor (e.g. model.state_dict(), broadcast in sorted name order), or a
    list of tensors or of (name, tensor) tuples (e.g. list(model.named_parameters())).
    """
    if isinstance(params, dict):
        named = sorted(params.items())
    elif isinstance(params, list):
        named = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError('invalid params of type: %s' % type(params))

    # all submitted before any is waited for: the engine fuses and runs them together
    handles = [broadcast_async_(tensor, root_rank, name) for name, tensor in named]
    for handle in handles:
        synchronize(handle)


def _create_missing_state(optimizer, model):
    """Gives a fresh optimizer its state (momentum buffers, Adam's moments...) by one step on
    zero gradients, so that there is something to overwrite with root's.  A DistributedOptimizer
    steps its base class: its own step() would allreduce, and only this rank is here."""
    from horovod.torch.optimizer import DistributedOptimizer

    sparse_ids = set()
    if model:
        for module in model.modules():
            if isinstance(module, torch.nn.modules.sparse.Embedding) and module.sparse:
                sparse_ids.update(id(p) for p in module.parameters())

    for group in optimizer.param_groups:
        for p in group['params']:
            if not p.requires_grad:
                continue
            p.grad = p.data.new(p.size()).zero_()
            if isinstance(optimizer, torch.optim.SparseAdam) or \
                    (isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_ids):
                p.grad = p.grad.to_sparse()

    if optimizer.__module__ == DistributedOptimizer.__module__:
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Overwrites every rank's optimizer state and options (learning rate, momentum, ...) with
    root_rank's.  optimizer: a torch optimizer or a DistributedOptimizer; model (optional) tells
    which parameters have sparse gradients (sparse Embedding) when the state must be created."""
    if isinstance(optimizer, torch.optim.LBFGS):
        # its state is deeply nested and holds None values: only a whole state_dict would do
        raise ValueError('cannot broadcast torch.optim.LBFGS state')

    state_dict = optimizer.state_dict()
    if len(state_dict['state']) == 0:
        _create_missing_state(optimizer, model)
        state_dict = optimizer.state_dict()
    if len(state_dict['state']) == 0:
        return  # a stateless optimizer: nothing to send

    # state_dict()['state'] holds the optimizer's own per-parameter dicts and tensors: tensors are
    # broadcast in place, scalars (and every param_group option) go in one pickled dict, written
    # back through a setter per key.
    tensors = []
    scalars = {}
    setters = {}
    seen = collections.defaultdict(int)

    def option_setter(index, key):
        def set_option(value):
            optimizer.param_groups[index][key] = value
        return set_option

    def state_setter(pid, key):
        def set_state(value):
            state_dict['state'][pid][key] = value
        return set_state

    for index, group in enumerate(state_dict['param_groups']):
        for key, value in group.items():
            if key == 'params':
                continue
            tag = '%s.%d' % (key, index)
            scalars[tag] = value
            setters[tag] = option_setter(index, key)

        for pid in group['params']:
            if pid not in state_dict['state']:
                continue  # no state: the parameter does not require grad
            for key, value in state_dict['state'][pid].items():
                # the same key recurs for every parameter: its count makes the name unique
                seen[key] += 1
                tag = '%s.%d' % (str(key), seen[key])
                if torch.is_tensor(value):
                    tensors.append((tag, value))
                else:
                    scalars[tag] = value
                    setters[tag] = state_setter(pid, key)

    broadcast_parameters(tensors, root_rank)

    for tag, value in broadcast_object(scalars, root_rank).items():
        setters[tag](value)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's obj on every rank of process_set (root_rank is a global rank).  name (default:
    the object's type name) names the two broadcasts that carry it."""
    if name is None:
        name = type(obj).__name__

    if rank() == root_rank:
        buf = io.BytesIO()
        _cloudpickle().dump(obj, buf)
        payload = torch.ByteTensor(bytearray(buf.getvalue()))
        length = torch.IntTensor([payload.shape[0]])
        broadcast_(length, root_rank, name + '.sz', process_set)
    else:
        length = torch.IntTensor([0])
        broadcast_(length, root_rank, name + '.sz', process_set)
        payload = torch.ByteTensor(length.tolist()[0])

    broadcast_(payload, root_rank, name + '.t', process_set)

    if rank() != root_rank:
        obj = _cloudpickle().load(io.BytesIO(payload.numpy().tobytes()))
    return obj


def allgather_object(obj, name=None):
    """[obj of rank 0, obj of rank 1, ...] on every rank.  name (default: the object's type
    name) names the two allgathers that carry them."""
    if name is None:
        name = type(obj).__name__

    buf = io.BytesIO()
    _cloudpickle().dump(obj, buf)
    payload = torch.ByteTensor(bytearray(buf.getvalue()))
    length = torch.IntTensor([payload.shape[0]])

    lengths = allgather(length, name=name + '.sz').numpy()
    gathered = allgather(payload, name=name + '.t').numpy()

    objects = []
    start = 0
    for i in range(size()):
        end = start + int(lengths[i])
        objects.append(_cloudpickle().load(io.BytesIO(gathered[start:end].tobytes())))
        start = end
    return objects
