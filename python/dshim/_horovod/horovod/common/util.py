"""Helpers of horovod.common.util (Horovod 0.28.1) that scripts, the runner and the framework
layers use: extension probes, the `average=` compatibility rule, small utilities.

Horovod's framework layers are compiled extensions; dshim's are Python modules over
libdshim.so.  "Built" here means the layer's module exists; extension_available() and the
*_built() probes import the layer in a forked child, as Horovod does (a framework that fails
to import, or CUDA initialised by a probe, stays out of the caller's process).
"""
import multiprocessing
import os
import sysconfig
import warnings
from contextlib import contextmanager

EXTENSIONS = ['tensorflow', 'torch', 'mxnet']


def get_ext_suffix():
    """The file suffix of Python extension modules here."""
    return sysconfig.get_config_var('EXT_SUFFIX') or sysconfig.get_config_var('SO') or '.so'


def get_extension_full_path(pkg_path, *args):
    assert len(args) >= 1
    dir_path = os.path.join(os.path.dirname(pkg_path), *args[:-1])
    return os.path.join(dir_path, args[-1] + get_ext_suffix())


def check_extension(ext_name, ext_env_var, pkg_path, *args):
    """Raises ImportError when extension module `args` beside pkg_path is missing (Horovod's
    compiled layers; dshim's layers are Python and do not call it)."""
    full_path = get_extension_full_path(pkg_path, *args)
    if not os.path.exists(full_path):
        raise ImportError(
            'Extension {} has not been built: {} not found\n'
            'If this is not expected, reinstall Horovod with {}=1 to debug the build error.'.format(
                ext_name, full_path, ext_env_var))


def _check_extension_lambda(ext_base_name, fn, fn_desc, verbose):
    """fn(horovod.<ext_base_name>) computed in a forked child (None when the import or fn fails)."""
    def _target_fn(ext_base_name, fn, fn_desc, queue, verbose):
        import importlib
        import sys
        import traceback
        if verbose:
            print(f'Checking whether extension {ext_base_name} was {fn_desc}.')
        else:
            sys.stdout = open(os.devnull, 'w')
            sys.stderr = open(os.devnull, 'w')
        try:
            ext = importlib.import_module('.' + ext_base_name, 'horovod')
            result = fn(ext)
        except BaseException:
            traceback.print_exc()
            result = None
        if verbose:
            print(f"Extension {ext_base_name} {'was' if result else 'was NOT'} {fn_desc}.")
        queue.put(result)

    ctx = multiprocessing.get_context('fork')
    queue = ctx.Queue()
    p = ctx.Process(target=_target_fn, args=(ext_base_name, fn, fn_desc, queue, verbose))
    p.daemon = True
    p.start()
    p.join()
    try:
        return queue.get_nowait()
    except Exception:
        return None


def extension_available(ext_base_name, verbose=False):
    return _check_extension_lambda(ext_base_name, lambda ext: ext is not None, 'built', verbose) or False


def _cache(f):
    cache = dict()

    def wrapper(*args, **kwargs):
        key = (args, frozenset(kwargs.items()))
        if key not in cache:
            cache[key] = f(*args, **kwargs)
        return cache[key]

    return wrapper


@_cache
def gpu_available(ext_base_name, verbose=False):
    return _check_extension_lambda(ext_base_name, lambda ext: ext._check_has_gpu(), 'running with GPU',
                                   verbose) or False


def _first_answer(method, desc, verbose):
    for ext_base_name in EXTENSIONS:
        result = _check_extension_lambda(ext_base_name, lambda ext: getattr(ext, method)(), desc, verbose)
        if result is not None:
            return result
    return None


@_cache
def mpi_built(verbose=False):
    return _first_answer('mpi_built', 'built with MPI', verbose)


@_cache
def gloo_built(verbose=False):
    return _first_answer('gloo_built', 'built with Gloo', verbose)


@_cache
def nccl_built(verbose=False):
    return _first_answer('nccl_built', 'built with NCCL', verbose)


@_cache
def ddl_built(verbose=False):
    return _first_answer('ddl_built', 'built with DDL', verbose)


@_cache
def ccl_built(verbose=False):
    return _first_answer('ccl_built', 'built with CCL', verbose)


@contextmanager
def env(**kwargs):
    """Sets the given environment variables (None values skipped) for the block, then restores them."""
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    backup = {k: os.environ.get(k) for k in kwargs}
    for k, v in kwargs.items():
        os.environ[k] = v
    try:
        yield
    finally:
        for k, v in backup.items():
            if v is not None:
                os.environ[k] = v
            else:
                del os.environ[k]


def get_average_backwards_compatibility_fun(reduce_ops):
    """The rule between the deprecated `average=` and `op=`: op wins, both given is an error,
    average=True/False means Average/Sum (with a DeprecationWarning), neither means Average."""
    def impl(op, average):
        if op is not None:
            if average is not None:
                raise ValueError('The op parameter supersedes average. Please provide only one of them.')
            return op
        elif average is not None:
            warnings.warn('Parameter `average` has been replaced with `op` and will be removed in v1.0',
                          DeprecationWarning)
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average
    return impl


def num_rank_is_power_2(num_rank):
    """Whether num_rank is a power of two (Adasum's requirement)."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(l, n):
    """l split into n chunks of nearly equal size."""
    d, r = divmod(len(l), n)
    return [l[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True


@_cache
def is_version_greater_equal_than(ver, target):
    from packaging import version
    if any(not isinstance(s, str) for s in (ver, target)):
        raise ValueError("This function only accepts string arguments. \n"
                         f"Received:\n\t- ver (type {type(ver)}: {ver})\t- target (type {type(target)}: {target})")
    if len(target.split(".")) != 3:
        raise ValueError("We only accepts target version values in the form "
                         f"of: major.minor.patch. Received: {target}")
    return version.parse(ver) >= version.parse(target)
