"""The timeline and the summary, end to end through dshim-run.

A 2-rank DDP job (examples/ddp_train.py) under `dshim-run --timeline FILE`
with DSHIM_SUMMARY=1: FILE loads with json.load, has a track per rank, and
exactly one span per operation each rank's summary counted, kind by kind;
its times fall inside the job (clocks aligned to the controller's).  Also:
DSHIM_TIMELINE alone (one file per rank, %r/%p expanded), a rank that ends
without running its exit handlers, and the option's plumbing (--dry-run,
usage error).  Fixtures: conftest.py.  The writer's JSON (escapes) and the
clock alignment are unit-tested in tests/unit/launcher/check_timeline.c.
"""
import collections
import json
import re

import pytest

import conftest

DDP = conftest.REPO / "examples" / "ddp_train.py"

SUMMARY_ROW = re.compile(r"^\[rank (\d+)\] dshim summary rank (\d+):\s+([a-z_]+)\s+(\d+)\s", re.M)
TIMELINE_LINE = re.compile(r"timeline: (\d+) ranks? on (\d+) hosts?, clock skew \u2264 (\d+) \u00b5s, written to (.+)$",
                           re.M)


def describe(res):
    return f"rc={res.rc} elapsed={res.elapsed:.1f}s\nstdout:\n{res.out}\nstderr:\n{res.err}"


def summary_counts(text):
    """{(rank, op): count} from the DSHIM_SUMMARY tables dshim-run relayed."""
    counts = {}
    for m in SUMMARY_ROW.finditer(text):
        assert m.group(1) == m.group(2), m.group(0)
        counts[(int(m.group(1)), m.group(3))] = int(m.group(4))
    return counts


def spans(doc):
    """The communication spans (the framework's own, e.g. the optimizer step, aside)."""
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") != "framework"]


def framework_spans(doc):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "framework"]


def process_names(doc):
    return {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


@pytest.mark.timeout(240)
def test_ddp_timeline_has_one_span_per_summarized_op(run, workdir, no_leftovers):
    out = workdir / "timeline.json"
    res = run(["--nproc-per-node", "2", "--master-port", "0", "--timeline", out, DDP, "--steps", "8"],
              env={"DSHIM_SUMMARY": "1"}, timeout=200)
    assert res.rc == 0, describe(res)
    m = TIMELINE_LINE.search(res.err)
    assert m, describe(res)
    assert (m.group(1), m.group(2), m.group(4)) == ("2", "1", str(out)), m.group(0)
    assert int(m.group(3)) < 5000, m.group(0)  # one host: a ping's round trip over a pipe

    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["otherData"]["dshim"]["format"] == "dshim-timeline-merged"
    names = process_names(doc)
    assert sorted(names) == [0, 1], names
    assert all(n.startswith(f"rank {pid} on ") for pid, n in names.items()), names
    tracks = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {pid for pid, _ in tracks} == {0, 1}, tracks

    got = collections.Counter((e["pid"], e["cat"]) for e in spans(doc))
    want = summary_counts(res.out + res.err)
    assert want and {r for r, _ in want} == {0, 1}, describe(res)
    assert dict(got) == want, f"timeline {dict(got)} != summary {want}\n{describe(res)}"

    elapsed_us = res.elapsed * 1e6
    for e in spans(doc):
        a = e["args"]
        assert e["tid"] >= 1 and e["dur"] >= 0, e
        assert 0 < e["ts"] and e["ts"] + e["dur"] < elapsed_us, (e, elapsed_us)
        assert a["op"] == e["cat"] and a["bytes"] >= 0 and a["wait_ms"] >= 0 and a["seq"] >= 0, e
        assert a["transport"] == "shm" and a["algo"], e
        assert e["name"] == (a["label"] or a["op"]), e
    # the backend labels DDP's gradient buckets (python/dshim): they name the spans
    assert any(e["name"].startswith("DDP bucket") for e in spans(doc)), collections.Counter(
        e["name"] for e in spans(doc))
    # torch's optimizer steps, seen through torch.optim's global hooks, on their own track per rank
    steps = collections.Counter(e["pid"] for e in framework_spans(doc) if e["name"] == "optimizer step (SGD)")
    assert set(steps) == {0, 1} and min(steps.values()) >= 1, collections.Counter(
        (e["pid"], e["name"]) for e in framework_spans(doc))
    # on every rank, the same op numbers in the same order (seq per communicator)
    for pid in (0, 1):
        seqs = [e["args"]["seq"] for e in sorted(spans(doc), key=lambda e: e["ts"]) if e["pid"] == pid]
        assert sorted(seqs) == list(range(len(seqs))), seqs
    no_leftovers()


RANKS_SCRIPT = """
    import os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1000)
    for _ in range(5):
        dist.all_reduce(t)
    dist.broadcast(t, 0)
    print("DONE", rank, flush=True)
    if rank == 1 and os.environ.get("SKIP_EXIT_HANDLERS"):
        os._exit(0)      # no atexit: the timeline's buffer is never written out
    dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_dshim_timeline_alone_writes_a_file_per_rank(run, write_script, workdir, no_leftovers):
    script = write_script("ranks.py", RANKS_SCRIPT)
    pattern = workdir / "tl" / "r%r.p%p.json"
    res = run(["--nproc-per-node", "2", "--master-port", "0", script], env={"DSHIM_TIMELINE": pattern}, timeout=100)
    assert res.rc == 0, describe(res)
    files = sorted((workdir / "tl").glob("r*.p*.json"))
    assert [f.name.split(".")[0] for f in files] == ["r0", "r1"], files
    for f in files:
        rank = int(f.name[1])
        doc = json.loads(f.read_text(encoding="utf-8"))
        head = doc["otherData"]["dshim"]
        assert (head["format"], head["version"], head["rank"]) == ("dshim-timeline", 1, rank), head
        assert f.name == f"r{rank}.p{head['pid']}.json"
        assert doc["dshim_end"]["events"] == len(spans(doc))
        kinds = collections.Counter(e["cat"] for e in spans(doc))
        assert kinds["allreduce"] >= 5 and kinds["broadcast"] >= 1, kinds
        assert {e["pid"] for e in doc["traceEvents"]} == {rank}
        labels = {e["args"]["label"] for e in spans(doc)}
        assert "torch all_reduce" in labels, labels
    no_leftovers()


@pytest.mark.timeout(120)
def test_timeline_of_a_rank_that_skips_exit_handlers(run, write_script, workdir, no_leftovers):
    # os._exit: rank 1's buffered spans are lost, but its file (written at
    # its first communicator) still gives it a track, and the merge of a file
    # without its end stays valid JSON.
    script = write_script("ranks.py", RANKS_SCRIPT)
    out = workdir / "t.json"
    res = run(["--nproc-per-node", "2", "--master-port", "0", "--timeline", out, script],
              env={"SKIP_EXIT_HANDLERS": "1"}, timeout=100)
    assert res.rc == 0, describe(res)
    assert TIMELINE_LINE.search(res.err), describe(res)
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert sorted(process_names(doc)) == [0, 1]
    kinds = collections.Counter(e["cat"] for e in spans(doc) if e["pid"] == 0)
    assert kinds["allreduce"] >= 5, kinds
    no_leftovers()


def test_timeline_option_plumbing(run, write_script, workdir):
    script = write_script("train.py", "print('hi')\n")
    res = run(["--nproc-per-node", "2", "--timeline", workdir / "x.json", "--dry-run", script, "--timeline"])
    assert res.rc == 0, describe(res)
    per_rank = re.findall(r"DSHIM_TIMELINE=/\S*/dshim-run\.XXXXXX/attempt_0/(\d)/timeline\.%p\.json", res.out)
    assert per_rank == ["0", "1"], describe(res)
    res = run(["--timeline"])
    assert res.rc == 2 and "option --timeline needs a value" in res.err, describe(res)
