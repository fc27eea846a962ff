"""``embodied list``: registered tasks, algorithms and simulator backends."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("list", help="list tasks, algorithms and backends", description=__doc__)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embodied import registry

    print("tasks:")
    for name, entry in registry.TASKS.items():
        print(f"  {name:<22} [{entry.backend}] {entry.summary}")
    print(f"  {registry.GYM_PREFIX + '<EnvId>':<22} [{registry.GYM_ENTRY.backend}] {registry.GYM_ENTRY.summary}")
    print("algorithms:")
    for name, entry in registry.ALGOS.items():
        print(f"  {name:<22} {entry.summary}")
    print("backends:")
    for name, summary in registry.BACKENDS.items():
        print(f"  {name:<22} {summary}")
    return 0
