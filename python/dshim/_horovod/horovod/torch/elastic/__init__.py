"""hvd.elastic for PyTorch (Horovod 0.28.1): the run decorator, TorchState and ElasticSampler."""
from horovod.common.elastic import run_fn
from horovod.torch.mpi_ops import init, shutdown

from horovod.torch.elastic.sampler import ElasticSampler
from horovod.torch.elastic.state import TorchState


def run(func):
    """Decorator running an elastic training function func(state, ...).

    Before func runs, and again after every reset (a worker added or removed, or a failed
    collective), state is synchronized from rank 0, so new workers start where the others are.
    func's first argument must be a horovod.common.elastic.State (e.g. TorchState).  The call of
    the decorated function must not itself be a collective: new workers would run it while the
    others synchronize the state.
    """
    return run_fn(func, _reset)


def _reset():
    shutdown()
    init()


__all__ = [
    'TorchState',
    'ElasticSampler',
    'run',
]
