"""Lines per folder and the folder-level import graph of embodied as a wheel installs it.

A folder is a top-level package directory of the installed layout (``embodied/`` top-level
files, ``embodied/export``, ``embodied/sim``, ...; a deeper subpackage such as
``embodied/real/transports`` counts with its top-level folder). Lines are
non-blank lines of ``.py`` files. The graph collapses every first-party import (as grimp, the
engine of import-linter, finds them, string imports excluded) onto folders and reports the
cycles between folders.

Usage: ``python scripts/folder_graph.py [--max-share 0.25]``; exits 1 when a folder holds more
than ``--max-share`` of the lines or the folder graph has a cycle.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent


def folder_of(module: str, packages: set[str]) -> str:
    """The top-level folder holding ``module``: ``embodied.<name>`` for a module inside a
    subpackage, ``embodied`` for the top-level files."""
    parts = module.split(".")
    top = ".".join(parts[:2])
    return top if len(parts) >= 2 and top in packages else parts[0]


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one member (the cycles), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-share", type=float, default=0.25, help="largest allowed share of lines per folder")
    args = parser.parse_args()
    layout = Path(
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "installed_layout.py"), "--out", str(ROOT / "build" / "layout")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    sys.path.insert(0, str(layout))
    graph = grimp.build_graph("embodied", cache_dir=None)
    packages = {m for m in graph.modules if (layout / m.replace(".", "/") / "__init__.py").exists()}
    lines: dict[str, int] = defaultdict(int)
    for module in graph.modules:
        path = layout / (module.replace(".", "/") + ("/__init__.py" if module in packages else ".py"))
        if path.is_file():
            lines[folder_of(module, packages)] += sum(1 for line in path.read_text().splitlines() if line.strip())
    total = sum(lines.values())
    edges: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = folder_of(module, packages), folder_of(imported, packages)
            if a != b:
                edges[a].add(b)
    failed = False
    print(f"{'folder':<28}{'lines':>8}{'share':>8}")
    for folder, count in sorted(lines.items(), key=lambda kv: -kv[1]):
        share = count / total
        mark = "  > max" if share > args.max_share else ""
        failed |= share > args.max_share
        print(f"{folder:<28}{count:>8}{share:>8.1%}{mark}")
    print(f"{'total':<28}{total:>8}")
    cycles = strongly_connected(edges)
    print(f"folder-level cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " <-> ".join(cycle))
        for a in cycle:
            for b in sorted(edges[a] & set(cycle)):
                print(f"    {a} -> {b}")
    return 1 if failed or cycles else 0


if __name__ == "__main__":
    raise SystemExit(main())
