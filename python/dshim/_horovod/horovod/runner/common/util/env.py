"""A process's place in a Horovod job as the launchers give it, read through dshim's
configuration table (base/params.def, dshim_config_get) like every variable dshim reads."""
import ctypes
import re

LOG_LEVEL_STR = ['FATAL', 'ERROR', 'WARNING', 'INFO', 'DEBUG', 'TRACE']

# variables that horovodrun does not hand to its ranks (Horovod's list)
IGNORE_REGEXES = {'BASH_FUNC_.*', 'OLDPWD', '.*CUDA_VISIBLE_DEVICES'}


def is_exportable(v):
    return not any(re.match(r, v) for r in IGNORE_REGEXES)


def config(name):
    """The value of a variable of dshim's table, as text ('' or '-1' when not set)."""
    from dshim import _lib
    buf = ctypes.create_string_buffer(4096)
    if _lib.lib().dshim_config_get(name.encode(), buf, len(buf)) != 0:
        raise KeyError(f"dshim: {name} is not a variable of dshim's table (base/params.def)")
    return buf.value.decode(errors='replace')


def _int(name):
    v = config(name)
    return int(v) if v.lstrip('-').isdigit() and int(v) >= 0 else None


def get_env_rank_and_size():
    """(rank, size) from HOROVOD_RANK/SIZE (horovodrun), else Open MPI's, else PMI's variables;
    (0, 1) when none is set.  RuntimeError when only one of a pair is set."""
    for rank_var, size_var in (('HOROVOD_RANK', 'HOROVOD_SIZE'), ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE'),
                               ('PMI_RANK', 'PMI_SIZE')):
        rank, size = _int(rank_var), _int(size_var)
        if rank is not None and size is not None:
            return rank, size
        if rank is not None or size is not None:
            raise RuntimeError('Could not determine process rank and size: only one of {} and {} '
                               'found in environment'.format(rank_var, size_var))
    return 0, 1
