"""torch's own distributed test suite, driven the way upstream drives it.

torch ships the tests (torch/testing/_internal/distributed/distributed_test.py) but not
their driver, test/distributed/test_distributed_spawn.py.  This is our equivalent of that
driver: the same environment contract and the same test class,

    BACKEND=gloo WORLD_SIZE=2 TEMP_DIR=<dir with a 'barrier' folder> [INIT_METHOD=file://...]
    python dist_spawn.py [--results FILE] [--not-run FILE] [TEST_NAME ...]
    python dist_spawn.py --list

with TestDistBackendWithSpawn = TestDistBackend + DistributedTest._DistTestBase, whose setUp
spawns WORLD_SIZE processes with the "spawn" start method (each rank is a fresh interpreter
that imports this module again).  INIT_METHOD defaults to env:// as in distributed_test.py;
the class is named TestDistBackendWithSpawnGLOO, or ...GLOONoInitFile with env://, as upstream.

--not-run FILE (JSON: test name -> reason) makes those tests skip ("not run: <reason>") before their
ranks are spawned; decorators that skip without spawning still skip first, with torch's reason.
Two more things upstream does not do, both observation only:
- --results FILE: one JSON line per test (name, outcome, skip reason or the error's last
  lines), for tests/peer/torch_suite.py to compare runs;
- PEER_PROBE_DIR (environment): each rank writes, once its process group is up and again
  when the test returns, the classes of the backends that carry every live process group
  (file <test>.<rank>.json), so a run under LD_PRELOAD=libdshim.so can prove that dshim, not
  gloo, carried each test.
Tests run in this one process, one after another (upstream's CI adds --subprocess, which
only re-imports torch per test); each test's ranks are their own processes either way.
"""
import json
import os
import sys
import time
import unittest

import torch
import torch.distributed as dist

torch.backends.cuda.matmul.allow_tf32 = False  # as upstream's driver

_ALLOWED_BACKENDS = ("gloo", "nccl", "ucc")


def _check_environment():
    missing = [v for v in ("BACKEND", "WORLD_SIZE", "TEMP_DIR") if v not in os.environ]
    if missing or not os.path.isdir(os.path.join(os.environ["TEMP_DIR"], "barrier")):
        sys.exit(f"dist_spawn.py: set BACKEND (one of {_ALLOWED_BACKENDS}), WORLD_SIZE (>= 2) and "
                 f"TEMP_DIR (a directory holding a folder named 'barrier'); missing: "
                 f"{', '.join(missing) or 'TEMP_DIR/barrier'}")
    if os.environ["BACKEND"] not in _ALLOWED_BACKENDS:
        sys.exit(f"dist_spawn.py: BACKEND={os.environ['BACKEND']} is not one of {_ALLOWED_BACKENDS}")


_check_environment()

# imported after the check: distributed_test.py reads BACKEND and TEMP_DIR at import
from torch.testing._internal.common_utils import parse_cmd_line_args  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


def _backend_class_names():
    """The class carrying each live process group, e.g. DshimProcessGroup or ProcessGroupGloo."""
    names = []
    for pg in list(dist.distributed_c10d._world.pg_map):
        try:
            carrier = pg._get_backend(torch.device("cpu"))
        except Exception:  # a group without a CPU backend: name the group itself
            carrier = pg
        names.append(f"{type(carrier).__module__}.{type(carrier).__name__}")
    return sorted(set(names))


def _probe(test_name, rank, when):
    probe_dir = os.environ.get("PEER_PROBE_DIR")
    if not probe_dir:
        return
    path = os.path.join(probe_dir, f"{test_name}.{rank}.json")
    record = {}
    if os.path.exists(path):
        with open(path) as f:
            record = json.load(f)
    record[when] = _backend_class_names()
    with open(path, "w") as f:
        json.dump(record, f)


# test name -> why this run leaves it out (--not-run FILE); such a test skips before spawning its ranks
_NOT_RUN = {}


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        reason = _NOT_RUN.get(self._testMethodName)
        if reason:
            raise unittest.SkipTest(f"not run: {reason}")
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    # Runs in each rank after TestDistBackend._run brought the default group up.
    def run_test(self, test_name, parent_pipe):
        _probe(test_name, self.rank, "start")
        super().run_test(test_name, parent_pipe)  # exits the process on failure or skip
        _probe(test_name, self.rank, "end")


_SUFFIX = "NoInitFile" if os.environ.get("INIT_METHOD", "env://") == "env://" else ""
TestDistBackendWithSpawn.__name__ = f"TestDistBackendWithSpawn{os.environ['BACKEND'].upper()}{_SUFFIX}"
TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__
# the spawned ranks find the class by this name in the re-imported main module
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn


class _JsonLinesResult(unittest.TextTestResult):
    """A text result that also appends one JSON line per finished test to a file."""

    results_path = None

    def _record(self, test, outcome, detail=""):
        if self.results_path is None:
            return
        line = {"test": test.id().split(".")[-1], "outcome": outcome, "detail": detail,
                "seconds": round(time.monotonic() - self._started, 1)}
        with open(self.results_path, "a") as f:
            f.write(json.dumps(line) + "\n")

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test)[-4000:])

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test)[-4000:])

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def main(argv):
    results_path = None
    if "--results" in argv:
        i = argv.index("--results")
        results_path = argv[i + 1]
        del argv[i:i + 2]
    if "--not-run" in argv:
        i = argv.index("--not-run")
        with open(argv[i + 1]) as f:
            _NOT_RUN.update(json.load(f))
        del argv[i:i + 2]
    if "--list" in argv:  # the test names, one a line (tests/peer/torch_suite.py compares them)
        print("\n".join(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn)))
        return 0
    names = [a for a in argv[1:] if not a.startswith("-")]
    sys.argv = [argv[0]] + [a for a in argv[1:] if a.startswith("-")]
    parse_cmd_line_args()  # torch's TestCase reads the globals this sets (seed, executor)

    loader = unittest.TestLoader()
    cls = TestDistBackendWithSpawn
    if names:
        suite = unittest.TestSuite(cls(n) for n in names)
    else:
        suite = loader.loadTestsFromTestCase(cls)
    _JsonLinesResult.results_path = results_path
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=_JsonLinesResult)
    result = runner.run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(list(sys.argv)))
