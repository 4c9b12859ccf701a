#!/usr/bin/env python3
"""Checks the include rules of cmake/layers.txt over the product sources.

Every quoted #include of a file under a module folder must name a header of the
same module, or a public header of a module that the file's module may use;
the graph of modules that include each other must have no cycle, and no header
may include itself through others.  Prints one
line per violation naming the file, the line, the header and the rule, and
exits 1 when there is any (0 otherwise).

--inject FILE:HEADER (repeatable) pretends FILE also includes HEADER: how the
test shows that the check fails on a forbidden include (tests/layering).
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_EXT = (".c", ".h", ".cu", ".cuh", ".def")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def read_layers(path):
    mods = {}
    with open(path) as f:
        for line in f:
            if not re.match(r"^[a-z]", line):
                continue
            name, folder, root, public, uses = line.split()[:5]
            mods[name] = {
                "folder": folder.rstrip("/"),
                "root": root.rstrip("/"),
                "public": None if public == "*" else set() if public == "-" else set(public.split(",")),
                "uses": set() if uses == "-" else set(uses.split(",")),
            }
    for name, m in mods.items():
        for u in m["uses"]:
            if u not in mods:
                sys.exit(f"cmake/layers.txt: module {name} uses unknown module {u}")
    return mods


def module_of(rel, mods):
    best = None
    for name, m in mods.items():
        f = m["folder"]
        if os.path.dirname(rel) == f or rel.startswith(f + "/"):
            if best is None or len(f) > len(mods[best]["folder"]):
                best = name
    return best


def resolve(src_rel, header, mods):
    """The repository path the compiler would open for #include "header"."""
    here = os.path.normpath(os.path.join(os.path.dirname(src_rel), header))
    if os.path.isfile(os.path.join(ROOT, here)):
        return here
    for m in mods.values():
        cand = os.path.normpath(os.path.join(m["root"], header))
        if os.path.isfile(os.path.join(ROOT, cand)):
            return cand
    return None


def name_in_module(path, m):
    """How other modules name the header at path: relative to the module's include root."""
    return os.path.relpath(path, m["root"])


def find_cycles(graph):
    """Every cycle a depth-first search meets in graph (node -> set of nodes)."""
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for t in sorted(graph.get(n, ())):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return cycles


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inject", action="append", default=[], metavar="FILE:HEADER")
    args = ap.parse_args()
    mods = read_layers(os.path.join(ROOT, "cmake", "layers.txt"))
    injected = {}
    for spec in args.inject:
        f, h = spec.split(":", 1)
        injected.setdefault(f, []).append(h)

    errors, edges, files = [], {}, 0
    header_edges = {}   # header -> headers it includes, for cycles between single headers
    for name, m in mods.items():
        for dirpath, _, names in os.walk(os.path.join(ROOT, m["folder"])):
            for n in sorted(names):
                if not n.endswith(SOURCE_EXT):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, n), ROOT)
                if module_of(rel, mods) != name:
                    continue  # a deeper module owns it
                files += 1
                with open(os.path.join(ROOT, rel), errors="replace") as f:
                    lines = [(i + 1, mt.group(1)) for i, l in enumerate(f) if (mt := INCLUDE.match(l))]
                lines += [(0, h) for h in injected.get(rel, [])]
                for lineno, header in lines:
                    where = f"{rel}:{lineno}" if lineno else f"{rel} (injected)"
                    target = resolve(rel, header, mods)
                    if target is None:
                        errors.append(f"{where}: #include \"{header}\": no such header in any module's include root")
                        continue
                    if rel.endswith((".h", ".cuh")):
                        header_edges.setdefault(rel, set()).add(target)
                    tmod = module_of(target, mods)
                    if tmod is None:
                        errors.append(f"{where}: #include \"{header}\": {target} is in no module of cmake/layers.txt")
                        continue
                    if tmod == name:
                        continue
                    edges.setdefault(name, set()).add(tmod)
                    t = mods[tmod]
                    if tmod not in m["uses"]:
                        errors.append(f"{where}: #include \"{header}\": module {name} may not use module {tmod} "
                                      f"({target}); it may use: {', '.join(sorted(m['uses'])) or 'nothing'}")
                    elif t["public"] is not None and name_in_module(target, t) not in t["public"]:
                        errors.append(f"{where}: #include \"{header}\": {target} is private to module {tmod} "
                                      f"(its public headers: {', '.join(sorted(t['public'])) or 'none'})")

    for what, graph in (("modules", edges), ("headers", header_edges)):
        for c in find_cycles(graph):
            errors.append(f"include cycle between {what}: " + " -> ".join(c))

    for e in errors:
        print(e)
    print(f"check_layers: {files} files in {len(mods)} modules, {sum(len(v) for v in edges.values())} "
          f"module dependencies, {len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
