"""horovod.runner: Horovod's launcher on dshim (horovodrun, horovod.run).

`horovod.run(func, args=(), kwargs=None, num_proc=1, hosts=None, ...)` runs func(*args, **kwargs)
in every rank of a job placed as horovodrun places it (launch.py) and returns the list of its
results in rank order; func and its results travel with cloudpickle (run_func.py).
"""
import warnings


class _HorovodArgs(object):
    """The attributes of horovodrun's parsed arguments, for a job started from Python."""

    def __init__(self):
        from horovod.runner.launch import make_parser
        defaults = make_parser().parse_args(['-np', '1', 'true'])
        self.__dict__.update(vars(defaults))
        self.num_proc = 1
        self.command = None
        self.run_func = None
        self.executable = None


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None, slots=None,
        reset_limit=None, cooldown_range=None, hosts=None, hostfile=None, host_discovery_script=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None, output_filename=None,
        verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, network_interfaces=None, executable=None,
        np=None, min_np=None, max_np=None):
    """Launches a Horovod job running func in every process and returns the list of func's
    return values, index = rank.  Arguments as horovodrun's flags (Horovod 0.28.1); np, min_np,
    max_np and network_interface are the deprecated spellings.  Elastic arguments (min/max
    processes, a discovery script) are refused: dshim-run runs jobs of a fixed size."""
    from horovod.runner.launch import UsageError, _run
    if network_interface:
        network_interfaces = network_interface.split(',')
        warnings.warn('network_interface is deprecated, use network_interfaces instead', DeprecationWarning)
    if np is not None:
        num_proc = np
        warnings.warn('np is deprecated, use num_proc instead', DeprecationWarning)
    if min_np is not None:
        min_num_proc = min_np
        warnings.warn('min_np is deprecated, use min_num_proc instead', DeprecationWarning)
    if max_np is not None:
        max_num_proc = max_np
        warnings.warn('max_np is deprecated, use max_num_proc instead', DeprecationWarning)
    if kwargs is None:
        kwargs = {}
    if hosts is not None and hostfile is not None:
        raise ValueError('Argument hosts and hostfile only allow one provided.')
    if use_gloo and use_mpi:
        raise ValueError('Argument use_gloo and use_mpi only allow one set True.')
    if mpi_args:
        raise ValueError('mpi_args: dshim runs no mpirun')

    def wrapped_func():
        return func(*args, **kwargs)

    h = _HorovodArgs()
    h.num_proc = num_proc
    h.min_num_proc = min_num_proc
    h.max_num_proc = max_num_proc
    h.slots = slots
    h.reset_limit = reset_limit
    h.cooldown_range = cooldown_range
    h.hosts = hosts
    h.hostfile = hostfile
    h.host_discovery_script = host_discovery_script
    h.start_timeout = start_timeout
    h.ssh_port = ssh_port
    h.ssh_identity_file = ssh_identity_file
    h.disable_cache = disable_cache
    h.output_filename = output_filename
    h.verbose = verbose
    h.use_gloo = use_gloo
    h.use_mpi = use_mpi
    h.nics = list(network_interfaces) if network_interfaces else None
    h.run_func = wrapped_func
    h.executable = executable
    try:
        return _run(h)
    except UsageError as e:
        raise ValueError(str(e)) from None
