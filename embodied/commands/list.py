"""``embodied list``: registered tasks (with the backends each runs on), algorithms and simulator backends.

Each backend's line says whether it works here: ``installed``, ``not installed: run ...`` or
``installed but unusable here: ...``, from a real import of its packages and its device checks
(Vulkan, EGL/OSMesa) in a subprocess (``embodied.sim.capabilities``).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from embodied.sim.capabilities import BackendStatus


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("list", help="list tasks, algorithms and backends", description=__doc__)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embodied import registry

    print("tasks (backends, the default first; choose one with `embodied train TASK --backend NAME`):")
    for name, entry in registry.TASKS.items():
        print(f"  {name:<22} [{', '.join(entry.implementations())}] {entry.summary}")
    for prefix, (entry, _) in registry.PREFIXED.items():
        print(f"  {prefix + '<EnvId>':<22} [{entry.backend}] {entry.summary}")
    for alias, (task, backend) in registry.TASK_ALIASES.items():
        print(f"  {alias:<22} deprecated: {task} --backend {backend}")
    print("algorithms:")
    for name, entry in registry.ALGOS.items():
        print(f"  {name:<22} {entry.summary}")
    print("backends:")
    for name, status in backend_statuses().items():
        row = registry.BACKENDS[name]
        print(f"  {name:<22} {row.summary}; devices: {', '.join(row.devices)}; {status.line()}")
    return 0


def backend_statuses() -> dict[str, BackendStatus]:
    """Every registered backend's state on this machine (probed in subprocesses)."""
    from embodied import registry
    from embodied.sim.capabilities import ProbeSpec
    from embodied.sim.capabilities import backend_statuses as probe_all

    specs = {
        name: ProbeSpec(row.modules + row.status_modules, row.checks, row.install)
        for name, row in registry.BACKENDS.items()
    }
    return probe_all(specs)
