"""Horovod's exception types (horovod.common.exceptions of Horovod 0.28.1)."""


class HorovodInternalError(RuntimeError):
    """A collective operation failed (mismatched arguments across ranks, a lost rank, a shutdown).

    Elastic mode treats it as recoverable: the job resets to the last committed state."""
    pass


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts of an elastic job changed; elastic mode resets without restoring state
    (skip_sync: whether the state's sync after the reset may be skipped)."""

    def __init__(self, skip_sync):
        self.skip_sync = skip_sync


def get_version_mismatch_message(name, version, installed_version):
    return (f'Framework {name} installed with version {installed_version} but found version {version}.\n'
            f'             This can result in unexpected behavior including runtime errors.\n'
            f'             Reinstall Horovod using `pip install --no-cache-dir` to build with the new version.')


class HorovodVersionMismatchError(ImportError):
    """The framework's version at run time differs from the one Horovod was built against."""

    def __init__(self, name, version, installed_version):
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version
