"""docs/architecture.md against the code: the facts in it that drift are checked here.

The folder table's total lines (non-blank lines of the ``.py`` files of the installed layout, as
``scripts/folder_graph.py`` counts them) must be within :data:`LINES_TOLERANCE` of today's, the
table must name every folder, and the algorithm list must be the registry's ``ALGOS``. Each
failure says what to write into the doc.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from test_packaging import _layout_module

from embodied.registry import ALGOS

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
LINES_TOLERANCE = 0.15
"""Relative drift of the package's total line count that the doc's table may show."""

pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml with tomllib")

FOLDER_ROW = re.compile(r"^\| `(embodied[\w.]*)`[^|]*\| (\d+) \|", re.MULTILINE)
TOTAL_ROW = re.compile(r"^\| total \| (\d+) \|", re.MULTILINE)
ALGO_LIST = re.compile(r"Algorithms \(`ALGOS` in `embodied/registry\.py`[^)]*\):((?:\s*`[\w-]+`,?)+)\.")


def lines_per_folder() -> Counter[str]:
    """Non-blank lines of the importable ``.py`` files per top-level folder of the installed
    layout: ``embodied`` for the top-level files, ``embodied.<name>`` for a subpackage, a deeper
    subpackage counted with its folder (``scripts/folder_graph.py``'s folders, without grimp)."""
    layout = _layout_module()
    dirs: dict[str, Path] = layout.package_dirs(REPO / "pyproject.toml")
    lines: Counter[str] = Counter()

    def walk(folder: Path, dotted: str, counted_as: str) -> None:
        for entry in sorted(folder.iterdir()):
            if entry.is_dir():
                sub = f"{dotted}.{entry.name}"
                skipped = entry.name in layout.SKIP_DIRS or entry.name.endswith(".egg-info")
                if skipped or sub in dirs or not (entry / "__init__.py").is_file():
                    continue  # not a package, or mapped (and counted) on its own
                walk(entry, sub, sub if dotted == "embodied" else counted_as)
            elif entry.suffix == ".py":
                lines[counted_as] += sum(1 for line in entry.read_text().splitlines() if line.strip())

    for name, root in dirs.items():
        if (root / "__init__.py").is_file():
            walk(root, name, name)
    return lines


def test_folder_table_names_every_folder_and_its_total_is_current() -> None:
    text = DOC.read_text()
    documented = {name: int(count) for name, count in FOLDER_ROW.findall(text)}
    total_match = TOTAL_ROW.search(text)
    assert documented and total_match, f"{DOC}: no folder table with a '| total | N |' row"
    measured = lines_per_folder()
    total = sum(measured.values())
    table = "\n".join(f"| `{name}` | {count} | {100 * count / total:.1f} % |" for name, count in measured.most_common())
    fix = f"update the folder table of {DOC.name} (python scripts/folder_graph.py prints it):\n{table}\n| total | {total} | |"
    assert set(documented) == set(measured), (
        f"folders missing from the doc: {sorted(set(measured) - set(documented))}, "
        f"gone from the code: {sorted(set(documented) - set(measured))}; {fix}"
    )
    written = int(total_match.group(1))
    assert abs(written - total) <= LINES_TOLERANCE * total, (
        f"the doc says {written} lines, the package has {total} ({written / total - 1:+.0%}); {fix}"
    )


def test_algorithm_list_is_the_registrys() -> None:
    match = ALGO_LIST.search(DOC.read_text())
    assert match, f"{DOC}: no line 'Algorithms (`ALGOS` in `embodied/registry.py` ...): `a`, `b`.'"
    written = re.findall(r"`([\w-]+)`", match.group(1))
    expected = list(ALGOS)
    assert written == expected, f"{DOC.name} lists {written}; the registry has {expected}: write " + ", ".join(
        f"`{name}`" for name in expected
    )
