"""The checks of tests/horovod/hvd_suite.py fail where they must: made-up junit XML and results against
made-up expectations (no ranks run), and expected.txt matches the upstream files it describes."""
import ast
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import hvd_suite  # noqa: E402

EXPECTED = {("f.py", "test_pass"): ("passed", ""), ("f.py", "test_fail"): ("failed", "Muon only supports"),
            ("f.py", "test_skip"): ("skipped", "No GPUs available")}
GOOD = {"test_pass": ("passed", ""), "test_fail": ("failed", "ValueError: Muon only supports 2D parameters"),
        "test_skip": ("skipped", "No GPUs available")}


def _check(results, differences=None, complete=True):
    return hvd_suite.check("f.py", results, EXPECTED, differences or {}, complete)


def test_clean_run_has_no_problem():
    assert _check(GOOD) == []


def test_each_difference_is_a_problem():
    assert "passes on real Horovod, failed on dshim" in _check(dict(GOOD, test_pass=("failed", "E  boom")))[0]
    assert "passes on real Horovod, skipped on dshim" in _check(dict(GOOD, test_pass=("skipped", "why")))[0]
    assert "fails on real Horovod" in _check(dict(GOOD, test_fail=("passed", "")))[0]
    assert "fails on real Horovod" in _check(dict(GOOD, test_fail=("failed", "another error")))[0]
    assert "skips on real Horovod" in _check(dict(GOOD, test_skip=("passed", "")))[0]
    assert "not in expected.txt" in _check(dict(GOOD, test_new=("passed", "")))[0]
    missing = dict(GOOD)
    del missing["test_pass"]
    assert "no result" in _check(missing)[0]
    assert _check(missing, complete=False) == []   # -k runs check only what ran


def test_a_test_that_hangs_on_real_horovod_accepts_any_outcome():
    expected = {**EXPECTED, ("f.py", "test_hang"): ("hangs", "real Horovod never ends it")}
    for got in (("passed", ""), ("failed", "E boom"), ("skipped", "why")):
        assert hvd_suite.check("f.py", dict(GOOD, test_hang=got), expected, {}, True) == []
    assert "no result" in hvd_suite.check("f.py", GOOD, expected, {}, True)[0]


def test_accepted_difference_must_fail_with_its_text():
    failing = dict(GOOD, test_pass=("failed", "E   AssertionError: the known one"))
    assert _check(failing, {("f.py", "test_pass"): "the known one"}) == []
    assert "other than differences.txt expects" in _check(failing, {("f.py", "test_pass"): "something else"})[0]
    assert "remove that line" in _check(GOOD, {("f.py", "test_pass"): "the known one"})[0]


def test_ranks_combine():
    per_rank = {0: {"a": ("passed", ""), "b": ("skipped", "x"), "c": ("passed", ""), "d": ("skipped", "x")},
                1: {"a": ("passed", ""), "b": ("skipped", "x"), "c": ("failed", "E boom"), "d": ("passed", "")},
                2: {"a": ("passed", ""), "b": ("skipped", "x"), "c": ("passed", "")}}
    got = hvd_suite.combine(per_rank)
    assert got["a"] == ("passed", "") and got["b"] == ("skipped", "x")
    assert got["c"][0] == "failed" and got["c"][1].startswith("rank 1: ")
    assert got["d"][0] == "failed" and "rank 2" in got["d"][1]   # no result on rank 2


def test_junit_xml(tmp_path):
    xml = tmp_path / "junit.0.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="t.T" name="test_ok"/>'
                   '<testcase classname="t.T" name="test_bad"><failure message="boom">trace</failure></testcase>'
                   '<testcase classname="t.T" name="test_err"><error message="err">trace</error></testcase>'
                   '<testcase classname="t.T" name="test_skip"><skipped message="No GPUs available"/></testcase>'
                   '</testsuite></testsuites>')
    got = hvd_suite.read_rank(xml)
    assert got["test_ok"] == ("passed", "") and got["test_skip"] == ("skipped", "No GPUs available")
    assert got["test_bad"] == ("failed", "boom\ntrace") and got["test_err"][0] == "failed"


COUNTS_AT_3 = (96, 6, 10, 3)


def test_expected_txt_lists_every_upstream_test_once():
    # each file at the rank counts make test runs it with (CMakeLists.txt): one line per test and count
    seen = {}
    for ranks, f, t, _, _ in hvd_suite.read_expected_lines():
        for r in ranks:
            assert (r, f, t) not in seen, (r, f, t)
            seen[(r, f, t)] = True
    for rel, counts in (("test/parallel/test_torch.py", (2, 3)), ("test/parallel/test_timeline.py", (2,)),
                        ("test/single/test_torch_elastic.py", (1,))):
        path = hvd_suite.UPSTREAM / rel
        names = {f.name for c in ast.parse(path.read_text()).body if isinstance(c, ast.ClassDef)
                 for f in c.body if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")}
        for n in counts:
            assert names == {t for f, t in hvd_suite.read_expected(n) if f == path.name}, (rel, n)
    # what real Horovod did (passed, failed, skipped, hangs): docs/horovod.md, "How expected.txt is recorded"
    for n, counts in ((2, (102, 3, 10, 0)), (3, COUNTS_AT_3)):
        rows = [v[0] for (f, _), v in hvd_suite.read_expected(n).items() if f == "test_torch.py"]
        assert tuple(rows.count(o) for o in ("passed", "failed", "skipped", "hangs")) == counts, n


def test_failure_text_is_the_exception_line():
    detail = ("rank 0: AssertionError: hvd.allreduce produces incorrect results\n    def test_x(self):\n"
              "E           AssertionError: hvd.allreduce produces incorrect results\nE           assert False\n"
              "E            +    where <built-in method allclose of type object at 0x7fc1> = torch.allclose")
    assert hvd_suite.failure_text(detail) == "AssertionError: hvd.allreduce produces incorrect results"
    assert hvd_suite.failure_text("rank 1: boom\nE   ValueError: Muon only") == "ValueError: Muon only"


def test_record_keeps_other_rank_counts(tmp_path, monkeypatch):
    exp = tmp_path / "expected.txt"
    exp.write_text("# header\n2,3 f.py test_a passed\n2,3 f.py test_b skipped No GPUs\n1 g.py test_c passed\n")
    monkeypatch.setattr(hvd_suite, "EXPECTED", exp)
    hvd_suite.record("f.py", 3, {"test_a": ("failed", "rank 1: boom\nE   ValueError: Muon only"),
                                 "test_b": ("skipped", "No GPUs")})
    assert exp.read_text() == ("# header\n2 f.py test_a passed\n3 f.py test_a failed ValueError: Muon only\n"
                               "2,3 f.py test_b skipped No GPUs\n1 g.py test_c passed\n")
    assert hvd_suite.read_expected(3)[("f.py", "test_a")] == ("failed", "ValueError: Muon only")
    assert hvd_suite.read_expected(2)[("f.py", "test_a")] == ("passed", "")
