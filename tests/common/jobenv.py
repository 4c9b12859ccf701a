"""The environment a test gives the job it starts: this shell's, without the variables of an
enclosing job (torchrun, mpirun, srun, dshim-run), which would change what the ranks do.

Shared by the torch suites (tests/torch); each names the prefixes and variables it drops."""
import os

# the test run's flight-recorder dump directory (scripts/run_tests.sh removes it): not a job setting,
# so the dumps of the failure scenarios go there and not into /tmp/dshim-trace-<uid>
KEEP = frozenset({"DSHIM_TRACE_DIR"})


def job_free_env(drop_prefixes, drop_exact):
    """os.environ without drop_prefixes* and drop_exact, but with KEEP."""
    return {k: v for k, v in os.environ.items()
            if (not k.startswith(drop_prefixes) or k in KEEP) and k not in drop_exact}
