"""``embodied list``: registered tasks (with the backends each runs on), algorithms and simulator backends."""

from __future__ import annotations

import argparse


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
    for name, row in registry.BACKENDS.items():
        missing = row.missing()
        state = "installed" if not missing else f"not installed ({row.install})"
        print(f"  {name:<22} {row.summary}; devices: {', '.join(row.devices)}; {state}")
    return 0
