"""Which package answers `import horovod` (python/_dshim_horovod_finder.py, docs/horovod.md).

Each case is a fresh `.venv/bin/python` (the finder is installed there by make setup's
dshim-horovod.pth) with a fake "real" Horovod on PYTHONPATH or without one, and DSHIM_HOROVOD
auto, 1 or 0:
    fake present:  auto -> the fake, 1 -> dshim's, 0 -> the fake
    fake absent:   auto -> dshim's, 1 -> dshim's, 0 -> ModuleNotFoundError
dshim's layer is told by horovod.__dshim__ and by where its file lies; its submodules come from
the same package as the top level.  Interpreter start imports the finder and nothing of dshim
or torch.
"""
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PY = REPO / ".venv" / "bin" / "python"
LAYER = REPO / "python" / "dshim" / "_horovod" / "horovod"

PROBE = r"""
import json, sys
try:
    import horovod
except ModuleNotFoundError as e:
    print(json.dumps({"error": "ModuleNotFoundError", "message": str(e)}))
    sys.exit(0)
import horovod.runner.util.threads as threads
print(json.dumps({"dshim": getattr(horovod, "__dshim__", False), "fake": getattr(horovod, "FAKE", False),
                  "file": horovod.__file__, "sub": threads.__file__}))
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DSHIM_", "HOROVOD_")) and k not in ("PYTHONPATH", "LD_PRELOAD")}
    env.update(extra)
    return env


def _probe(tmp_path, setting, fake):
    import json
    env = _env(DSHIM_HOROVOD=setting)
    if fake:
        pkg = tmp_path / "site" / "horovod"
        (pkg / "runner" / "util").mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("FAKE = True\n")
        (pkg / "runner" / "__init__.py").write_text("")
        (pkg / "runner" / "util" / "__init__.py").write_text("")
        (pkg / "runner" / "util" / "threads.py").write_text("FAKE = True\n")
        env["PYTHONPATH"] = str(tmp_path / "site")
    out = subprocess.run([str(PY), "-c", PROBE], env=env, capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def _need_venv():
    if not PY.exists():
        pytest.skip("no .venv: run make setup")


@pytest.mark.parametrize("setting,fake,want", [
    ("auto", True, "fake"), ("1", True, "dshim"), ("0", True, "fake"),
    ("auto", False, "dshim"), ("1", False, "dshim"), ("0", False, "none"),
    ("AUTO", True, "fake"),   # the table's words, any case
])
def test_which_horovod_answers(tmp_path, setting, fake, want):
    got = _probe(tmp_path, setting, fake)
    if want == "none":
        assert got == {"error": "ModuleNotFoundError", "message": "No module named 'horovod'"}, got
    elif want == "fake":
        assert got["fake"] and not got["dshim"], got
        assert got["file"].startswith(str(tmp_path)) and got["sub"].startswith(str(tmp_path)), got
    else:
        assert got["dshim"] is True and not got["fake"], got
        # the top level and its submodules from dshim's package, never a mix with the fake one
        assert pathlib.Path(got["file"]).resolve() == (LAYER / "__init__.py").resolve(), got
        assert pathlib.Path(got["sub"]).resolve() == (LAYER / "runner" / "util" / "threads.py").resolve(), got


def test_bad_setting_warns_and_means_auto(tmp_path):
    """A value outside auto|0|1: dshim's configuration warns once naming it and uses the default."""
    env = _env(DSHIM_HOROVOD="sometimes")
    out = subprocess.run([str(PY), "-c", "import horovod; print(horovod.__dshim__)"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "True", out
    assert "DSHIM_HOROVOD=sometimes" in out.stderr, out.stderr


def test_interpreter_start_registers_only_the_finder(tmp_path):
    """dshim-horovod.pth runs at every start of the environment's Python: it must import the finder and
    nothing heavy (not dshim, not torch, no libdshim.so)."""
    code = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('dshim', 'torch', 'horovod', '_dshim_horovod_finder'))); "
            "print(any(type(f).__name__ == 'HorovodFinder' for f in sys.meta_path)); "
            "print('libdshim' in open('/proc/self/maps').read())")
    out = subprocess.run([str(PY), "-c", code], env=_env(), capture_output=True, text=True, timeout=120,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    modules, registered, mapped = out.stdout.split("\n")[:3]
    assert modules == "['_dshim_horovod_finder']", \
        f"{modules}: dshim-horovod.pth is not installed in .venv (run make setup) or imports too much"
    assert registered == "True" and mapped == "False", out.stdout


def test_horovodrun_uses_dshims_layer_even_where_a_real_one_answers(tmp_path):
    """horovodrun launches through dshim-run, so it runs on dshim's layer whatever DSHIM_HOROVOD says."""
    pkg = tmp_path / "site" / "horovod"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("FAKE = True\n")
    env = _env(PYTHONPATH=str(tmp_path / "site"), DSHIM_HOROVOD="0")
    out = subprocess.run([str(PY.parent / "horovodrun"), "--version"], env=env, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "+dshim." in out.stdout, out.stdout
