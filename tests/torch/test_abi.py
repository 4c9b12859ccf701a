"""The Python package's copy of the C API against include/dshim.h: fails on any drift.

python/dshim/_lib.py and _dtypes.py restate by hand what ctypes cannot read from a header: the
enum values (status codes, dtypes, reduction ops), the structs Python builds or reads
(dshim_comm_args_t, dshim_stats_t) and a signature for every function the package calls.  A
mistake there is no compile error: ctypes passes whatever it is told.  This test checks each item:

- every upper-case integer of _lib/_dtypes is the header's DSHIM_<NAME> (an enumerator or an
  integer #define) with the same value (an alias, BYTES, is checked against what it stands for; a
  constant of Python's own gets a lower-case or _private name); every dtype and reduction op of the
  header is restated (the torch mapping must decide about a new one);
- every ctypes.Structure of _lib (named by its docstring) has the C struct's fields, in order, with
  the same offsets, sizes and kinds, and the same total size;
- every function of _lib._PROTOS is declared in the header with as many parameters, each of a
  compatible kind (pointer / integer of the same width and signedness / floating point of the same
  width / void result), matches a `global:` pattern of shim/libdshim.map, and is exported by the
  built library.

The C side's numbers come from the compiler: the test writes a C++ program that includes
include/dshim.h and prints the values of the enumerators, offsetof/sizeof of the fields, and
each function's parameter types (template deduction over decltype(function): no linking), then
compiles it with the build's C++ compiler (DSHIM_CXX, default c++) and runs it.  Only the names
to ask about are read from the header's text (enumerators, struct fields, exported functions).

Env: DSHIM_BUILD_DIR (the build whose libdshim.so is checked for the exports), DSHIM_CXX.
"""
import ctypes
import fnmatch
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
HEADER = REPO / "include" / "dshim.h"
LINKER_MAP = REPO / "shim" / "libdshim.map"
BUILD_DIR = pathlib.Path(os.environ.get("DSHIM_BUILD_DIR", str(REPO / "build")))
LIB = BUILD_DIR / "lib" / "libdshim.so"

pytest.importorskip("torch")   # _dtypes maps torch's dtypes
sys.path.insert(0, str(REPO / "python"))
from dshim import _dtypes, _lib  # noqa: E402

# Python names that stand for another enumerator rather than being one
ALIASES = {"BYTES": "UINT8"}
# enums Python must restate in full (the torch mapping decides about every one)
FULL_ENUMS = ("dshim_dtype_t", "dshim_redop_t")


# ---- names from the header's text ------------------------------------------------------------

def _header_text():
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def header_enums():
    """{typedef name: [enumerator, ...]} in declaration order."""
    enums = {}
    for body, name in re.findall(r"typedef\s+enum\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", _header_text(), re.S):
        enums[name] = [m.group(1) for m in (re.match(r"\s*(\w+)", e) for e in body.split(",")) if m]
    return enums


def header_int_macros():
    """Names of the header's integer #defines (DSHIM_ANY_SOURCE, the version numbers)."""
    return re.findall(r"^\s*#\s*define\s+(DSHIM_\w+)\s+\(?-?\d", _header_text(), re.M)


def header_structs():
    """{typedef name: [field, ...]} in declaration order."""
    structs = {}
    for body, name in re.findall(r"typedef\s+struct\s+\w*\s*\{(.*?)\}\s*(\w+)\s*;", _header_text(), re.S):
        structs[name] = [re.findall(r"\w+", decl)[-1] for decl in body.split(";") if decl.strip()]
    return structs


def header_functions():
    return set(re.findall(r"DSHIM_EXPORT\b[^;(]*?\b(dshim_\w+)\s*\(", _header_text()))


# ---- the Python side -------------------------------------------------------------------------

def python_constants():
    """{name: (module name, value)} of the enumerators _lib and _dtypes restate."""
    out = {}
    for mod in (_lib, _dtypes):
        for name, value in vars(mod).items():
            if re.fullmatch(r"[A-Z][A-Z0-9_]*", name) and type(value) is int:
                out[name] = (mod.__name__, value)
    return out


def python_structs():
    """{C typedef name (the docstring's first word): ctypes.Structure subclass}."""
    return {cls.__doc__.split()[0]: cls for cls in vars(_lib).values()
            if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and cls.__doc__}


def _scalar(t):
    """What the C++ probe prints for a pointee or a field of ctypes type t."""
    if t is None:
        return "void"
    if t in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(t, ctypes._Pointer):
        return "ptr"
    if issubclass(t, ctypes.Structure):
        return f"struct{ctypes.sizeof(t)}"
    code = t._type_
    if code in "fdg":
        return f"float{ctypes.sizeof(t)}"
    if code == "c":
        return "int1"
    return f"{'int' if code.islower() else 'uint'}{ctypes.sizeof(t)}"


def kind(t):
    """A parameter's or result's kind: the probe's spelling, "ptr(*)" for c_void_p (any pointer)."""
    if t is ctypes.c_void_p:
        return "ptr(*)"
    if t is ctypes.c_char_p:
        return "ptr(int1)"
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):
        return f"ptr({_scalar(t._type_)})"
    return _scalar(t)


def compatible(py, c):
    """Whether ctypes kind py passes a C value of kind c correctly (an enum as an int of its width)."""
    if py == "ptr(*)":
        return c.startswith("ptr(")
    if "enum" in c:
        return re.sub(r"\buint", "int", py) == c.replace("enum", "int")
    return py == c


# ---- the C side, from the compiler -------------------------------------------------------------

PROBE_HEAD = r"""
#include <cstddef>
#include <cstdio>
#include <string>
#include <type_traits>
#include "dshim.h"

template <class T, class = void> struct complete : std::false_type {};
template <class T> struct complete<T, decltype(void(sizeof(T)))> : std::true_type {};

template <class T> std::string scalar() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_void_v<U>) return "void";
    else if constexpr (std::is_pointer_v<U>) return "ptr";
    else if constexpr (std::is_enum_v<U>) return "enum" + std::to_string(sizeof(U));
    else if constexpr (std::is_floating_point_v<U>) return "float" + std::to_string(sizeof(U));
    else if constexpr (std::is_integral_v<U>)
        return (std::is_signed_v<U> ? "int" : "uint") + std::to_string(sizeof(U));
    else if constexpr (complete<U>::value) return "struct" + std::to_string(sizeof(U));
    else return "opaque";
}
template <class T> std::string kind() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) return "ptr(" + scalar<std::remove_pointer_t<U>>() + ")";
    else return scalar<U>();
}
template <class F> struct sig;
template <class R, class... A> struct sig<R(A...)> {
    static void print(const char *name) {
        std::string line = std::string("func ") + name + " " + kind<R>();
        ((line += " " + kind<A>()), ...);
        std::printf("%s\n", line.c_str());
    }
};
#define FIELD(T, f) std::printf("field %s %s %zu %zu %s\n", #T, #f, offsetof(T, f), sizeof(((T *)nullptr)->f), \
                                kind<decltype(((T *)nullptr)->f)>().c_str())

int main() {
"""


def probe(enumerators, structs, functions, tmp_path):
    """Runs the compiled probe; {("enum", name): value, ("struct", T): (size, align),
    ("field", T, f): (offset, size, kind), ("func", name): [result, params...]}."""
    lines = [PROBE_HEAD]
    lines += [f'    std::printf("enum {e} %lld\\n", (long long){e});' for e in enumerators]
    for t, fields in structs.items():
        lines.append(f'    std::printf("struct {t} %zu %zu\\n", sizeof({t}), alignof({t}));')
        lines += [f"    FIELD({t}, {f});" for f in fields]
    lines += [f'    sig<decltype({f})>::print("{f}");' for f in functions]
    lines.append("    return 0;\n}\n")
    src = tmp_path / "abi_probe.cpp"
    exe = tmp_path / "abi_probe"
    src.write_text("\n".join(lines))
    cxx = shlex.split(os.environ.get("DSHIM_CXX") or "c++")
    built = subprocess.run(cxx + ["-std=c++17", "-I", str(HEADER.parent), "-o", str(exe), str(src)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, f"the probe of {HEADER} does not compile:\n{built.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, check=True).stdout
    facts = {}
    for line in out.splitlines():
        w = line.split()
        if w[0] == "enum":
            facts[("enum", w[1])] = int(w[2])
        elif w[0] == "struct":
            facts[("struct", w[1])] = (int(w[2]), int(w[3]))
        elif w[0] == "field":
            facts[("field", w[1], w[2])] = (int(w[3]), int(w[4]), w[5])
        elif w[0] == "func":
            facts[("func", w[1])] = w[2:]
    return facts


def c_truth(tmp_path):
    """(enums, structs, functions) named by the header, and the probe's facts about them."""
    enums = header_enums()
    structs = header_structs()
    functions = header_functions()
    enumerators = [e for names in enums.values() for e in names] + header_int_macros()
    mirrored = {t: structs[t] for t in python_structs() if t in structs}
    return enums, structs, functions, probe(enumerators, mirrored, sorted(functions), tmp_path)


@pytest.fixture(scope="module")
def c_side(tmp_path_factory):
    return c_truth(tmp_path_factory.mktemp("abi"))


# ---- the checks --------------------------------------------------------------------------------

def test_enum_values(c_side):
    enums, _, _, facts = c_side
    wrong = []
    for name, (mod, value) in sorted(python_constants().items()):
        c_name = "DSHIM_" + ALIASES.get(name, name)
        if ("enum", c_name) not in facts:
            wrong.append(f"{mod}.{name} = {value}: {HEADER.name} has no enumerator or #define {c_name}")
        elif facts[("enum", c_name)] != value:
            wrong.append(f"{mod}.{name} = {value}, but {c_name} = {facts[('enum', c_name)]} in {HEADER.name}")
    restated = {"DSHIM_" + n for n in python_constants()}
    for enum in FULL_ENUMS:
        for e in enums.get(enum, []):
            if not e.endswith("_COUNT") and e not in restated:
                wrong.append(f"{enum} has {e} = {facts[('enum', e)]}, which _dtypes does not restate")
    assert not wrong, "Python's enum values differ from include/dshim.h:\n" + "\n".join(wrong)


def test_struct_layouts(c_side):
    _, structs, _, facts = c_side
    wrong = []
    mirrored = python_structs()
    assert mirrored, "no ctypes.Structure in _lib: the struct check checks nothing"
    for t, cls in sorted(mirrored.items()):
        if t not in structs:
            wrong.append(f"_lib.{cls.__name__} mirrors {t}, which {HEADER.name} does not define")
            continue
        py_fields = [f[0] for f in cls._fields_]
        if py_fields != structs[t]:
            wrong.append(f"_lib.{cls.__name__} fields {py_fields} != {t} fields {structs[t]}")
        for name, ctype in cls._fields_:
            if ("field", t, name) not in facts:
                continue
            off, size, c_kind = facts[("field", t, name)]
            py = getattr(cls, name)
            if (py.offset, py.size) != (off, size) or not compatible(kind(ctype), c_kind):
                wrong.append(f"{t}.{name}: Python offset {py.offset} size {py.size} kind {kind(ctype)}, "
                             f"C offset {off} size {size} kind {c_kind}")
        size, align = facts[("struct", t)]
        if (ctypes.sizeof(cls), ctypes.alignment(cls)) != (size, align):
            wrong.append(f"sizeof/alignof {t}: Python {ctypes.sizeof(cls)}/{ctypes.alignment(cls)}, "
                         f"C {size}/{align}")
    assert not wrong, "Python's structs differ from include/dshim.h:\n" + "\n".join(wrong)


def test_function_signatures(c_side):
    _, _, functions, facts = c_side
    wrong = []
    for name, (res, args) in sorted(_lib._PROTOS.items()):
        if name not in functions:
            wrong.append(f"{name}: declared in _lib._PROTOS, not exported by {HEADER.name}")
            continue
        c_res, *c_args = facts[("func", name)]
        py_args = [kind(a) for a in args]
        if len(py_args) != len(c_args):
            wrong.append(f"{name}: Python declares {len(py_args)} parameters, C {len(c_args)} ({' '.join(c_args)})")
            continue
        if not compatible(kind(res), c_res):
            wrong.append(f"{name}: result: Python {kind(res)}, C {c_res}")
        for i, (py, c) in enumerate(zip(py_args, c_args)):
            if not compatible(py, c):
                wrong.append(f"{name}: parameter {i + 1}: Python {py}, C {c}")
    assert not wrong, "_lib._PROTOS differs from include/dshim.h:\n" + "\n".join(wrong)


def test_exported(c_side):
    """Every function Python calls is in the version script's global list and in the built library."""
    text = re.sub(r"/\*.*?\*/", " ", LINKER_MAP.read_text(), flags=re.S)
    glob = re.search(r"global:(.*?)(local:|\})", text, re.S).group(1)
    patterns = [p.strip() for p in glob.split(";") if p.strip()]
    wrong = [f"{name}: matches no global pattern of {LINKER_MAP.name} {patterns}"
             for name in sorted(_lib._PROTOS) if not any(fnmatch.fnmatchcase(name, p) for p in patterns)]
    if LIB.exists():
        lib = ctypes.CDLL(str(LIB))
        wrong += [f"{name}: not exported by {LIB}" for name in sorted(_lib._PROTOS) if not hasattr(lib, name)]
    assert not wrong, "\n".join(wrong)
