"""``embodied sweep``: run a grid of configurations x seeds here or on a Ray cluster, then tabulate."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

from embodied.config import ConfigError, int_in_range

log = logging.getLogger("embodied.sweep")

EXAMPLES = """sweep file (YAML):
  task: quad-hover
  algo: ppo
  seeds: [0, 1, 2]
  overrides: ["trainer.total_env_steps=1000000"]
  grid:
    algo.init_std: [0.2, 0.3]
    env.pos_weight: [10, 15]

examples:
  embodied sweep hover.yaml                           # here: one run per core, pinned
  embodied sweep hover.yaml --workers 4 --cores-per-run 2
  embodied sweep hover.yaml --engine ray              # a local Ray instance
  embodied sweep hover.yaml --engine ray --ray-address auto   # the cluster of `ray start`
  embodied sweep hover.yaml --dry-run                 # print the runs, start nothing
  embodied sweep mass.yaml --allow-unphysical         # every run: embodied train --allow-unphysical

Writes OUT/runs/<config>_s<seed>/ (ordinary run directories), OUT/status/, and the report:
OUT/results.md (one row per configuration: seeds that held the target, by the sweep file's `hold` rule, env steps and training
seconds to it, final success), OUT/results.json and OUT/curves.png. Running the same command
again skips finished runs and resumes interrupted ones from their checkpoints.
Cluster: start Ray on every machine (`ray start --head` on one, `ray start --address HEAD:6379`
on the others), put OUT on a file system they all see, run with --ray-address auto."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="run a grid of configurations x seeds (locally or on Ray) and tabulate them",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("spec", type=Path, metavar="SPEC.yaml", help="the sweep file (format below)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default runs/sweeps/<name>)")
    p.add_argument("--engine", choices=("local", "ray"), default="local", help="where the runs execute (default local)")
    p.add_argument(
        "--workers",
        type=int_in_range(1, 4096),
        default=None,
        help="local engine: runs at once (default: usable cores // --cores-per-run)",
    )
    p.add_argument(
        "--cores-per-run",
        type=int_in_range(1, 1024),
        default=1,
        help="cores and torch threads per run (default 1: one run per core trains fastest on shared machines)",
    )
    p.add_argument(
        "--ray-address", default=None, help="Ray engine: cluster address ('auto' for `ray start`); default a local Ray"
    )
    p.add_argument("--dry-run", action="store_true", help="print the runs and their commands, start nothing")
    p.add_argument(
        "--allow-unphysical",
        action="store_true",
        help="start every run with `embodied train --allow-unphysical`: values outside the plausible physical "
        "ranges are accepted for a deliberate experiment and recorded in each run's config.yaml",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from embodied.sweeps.engines import job_argv, run_local, run_ray
    from embodied.sweeps.report import write_report
    from embodied.sweeps.spec import load_spec

    spec = load_spec(args.spec)
    if args.allow_unphysical:
        spec = dataclasses.replace(
            spec, jobs=tuple(dataclasses.replace(job, allow_unphysical=True) for job in spec.jobs)
        )
    out_dir: Path = args.out if args.out is not None else Path("runs") / "sweeps" / spec.name
    if args.engine == "ray" and args.workers is not None:
        raise ConfigError("--workers is for --engine local; Ray places runs by --cores-per-run on its own")
    if args.dry_run:
        for job in spec.jobs:
            print(f"{job.run_name}: {' '.join(job_argv(out_dir, job, args.cores_per_run)[2:])}")
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info("sweep %s: %d runs, engine %s, output %s", spec.name, len(spec.jobs), args.engine, out_dir)
    if args.engine == "ray":
        results = run_ray(out_dir, spec.jobs, args.ray_address, args.cores_per_run)
    else:
        usable = len(os.sched_getaffinity(0))
        workers = args.workers if args.workers is not None else max(1, usable // args.cores_per_run)
        results = run_local(out_dir, spec.jobs, workers, args.cores_per_run)
    print(write_report(out_dir, spec.name, results, spec.target, spec.hold))
    print(out_dir / "results.md")
    failed = [r for r in results if r["returncode"] != 0]
    for r in failed:
        log.warning("%s_s%s exited with %s: see %s.log", r["config"], r["seed"], r["returncode"], r["run_dir"])
    return 1 if failed else 0
