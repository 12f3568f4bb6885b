#!/usr/bin/env python3
"""Module dependency cycles of the leasefs crate.

Reads every `use` item and every inline `crate::`/`super::`/`self::` path
under src/, resolves each to the longest module prefix that exists, and
prints each strongly connected component of more than one module (a
cycle). A submodule's use of its own ancestors does not count (a parent
holds its children). Exit 0 when there is no cycle, 1 otherwise.

    tools/modcycles.py [SRC_DIR]
"""
import os
import re
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
mods = {}
for dirpath, _, files in os.walk(src):
    for f in files:
        if f.endswith(".rs"):
            p = os.path.join(dirpath, f)
            parts = os.path.relpath(p, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            if parts and parts[0] == "bin":
                continue
            mods["::".join(parts)] = p


def expand(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)  # a renamed import names the same item
    tree = tree.replace(" ", "").replace("\n", "")
    depth, start = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                head, inner, tail = tree[:start], tree[start + 1 : i], tree[i + 1 :]
                out, d, last = [], 0, 0
                for j, c in enumerate(inner + ","):
                    if c in "{":
                        d += 1
                    elif c == "}":
                        d -= 1
                    elif c == "," and d == 0:
                        item = inner[last:j]
                        last = j + 1
                        if item:
                            out += expand(head + item + tail)
                return out
    return [tree]


def resolve(module, path):
    segs = path.split("::")
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] in ("super", "self"):
        base = module.split("::") if module else []
        # A file's `super` is its parent module's.
        while segs and segs[0] in ("super", "self"):
            if segs[0] == "super":
                base = base[:-1]
            segs = segs[1:]
    else:
        return None
    full = base + segs
    for k in range(len(full), 0, -1):
        t = "::".join(full[:k])
        if t in mods:
            return t
    return None


deps = {m: set() for m in mods}
path_re = re.compile(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+")
for m, p in mods.items():
    text = re.sub(r"//[^\n]*", "", open(p, encoding="utf-8").read())
    paths = []
    for item in re.findall(r"\buse\s+([^;]+);", text):
        paths += expand(item)
    paths += path_re.findall(text)
    for u in paths:
        t = resolve(m, u)
        if t and t != m and not m.startswith(t + "::"):
            deps[m].add(t)

index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(100000)


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(deps[v]):
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            comps.append(sorted(comp))


for v in sorted(mods):
    if v not in index:
        strong(v)
for comp in comps:
    inner = sorted(f"{a} -> {b}" for a in comp for b in deps[a] if b in comp)
    print(f"cycle of {len(comp)} modules: {', '.join(comp)}")
    for e in inner:
        print(f"    {e}")
print(f"modcycles: {len(mods)} modules, {len(comps)} cycle(s)")
sys.exit(1 if comps else 0)
