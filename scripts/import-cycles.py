#!/usr/bin/env python3
"""Lists the import circles between the modules (files) of a crate's src/ folder.

    scripts/import-cycles.py app/engine/src [app/gui/src ...]

A module is a file; `crate::a::b::c` names the file a/b.rs (or a/b/mod.rs) when it exists,
else a.rs. Tests (after `#[cfg(test)]`) do not count. Prints each strongly connected group of
more than one module and exits 1 when there is one.
"""
import os
import re
import sys


def modules(src):
    found = {}
    for root, _, files in os.walk(src):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, src)[:-3].split(os.sep)
                if rel[-1] == "mod":
                    rel = rel[:-1]
                if rel in (["lib"], ["main"]):
                    rel = []
                found[tuple(rel)] = path
    return found


def resolve(mods, parts):
    for n in range(len(parts), 0, -1):
        if tuple(parts[:n]) in mods:
            return tuple(parts[:n])
    return None


def edges(mods):
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        text = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
        text = re.sub(r"//[^\n]*", "", text)  # comments and doc links are not imports
        names = []
        for use in re.findall(r"use\s+(crate::[^;]+);", text):
            head, _, tail = use.partition("{")
            base = head.rstrip(":").split("::")[1:]
            items = [t.strip().split("::") for t in tail.rstrip("}").split(",") if t.strip()] if tail else [[]]
            names += [base + [p for p in i if p not in ("self",)] for i in items]
        names += [p.split("::")[1:] for p in re.findall(r"crate(?:::\w+)+", text)]
        for p in re.findall(r"super(?:::\w+)+", text):
            names.append(list(m[:-1]) + p.split("::")[1:])
        for n in names:
            target = resolve(mods, n)
            if target is not None and target != m and not (len(target) < len(m) and m[: len(target)] == target):
                graph[m].add(target)
    return graph


def cycles(graph):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(group)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


found = False
for src in sys.argv[1:]:
    groups = cycles(edges(modules(src)))
    for g in groups:
        found = True
        print(f"{src}: " + " <-> ".join("::".join(m) or "crate" for m in sorted(g)))
    if not groups:
        print(f"{src}: no import circles")
sys.exit(1 if found else 0)
