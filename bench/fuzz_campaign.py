"""Run the command-line fuzzer of ``tests/fuzz_support.py`` for many cases and report the tally.

Example (the figure in docs/benchmarks/faults.md)::

    .venv/bin/python bench/fuzz_campaign.py --cases 10000 --seed 14 --out bench_out/fuzz

Trains and exports one tiny run (a few seconds), then runs ``--cases`` seeded cases in-process:
malformed ``key=value`` overrides, ``--config`` files, flag values and damaged run-directory
files. Writes ``summary.json`` (counts by verdict and family, slowest case, failures) and
``failures.txt`` into ``--out`` (the summary also every 250 cases, so a campaign cut short still
reports its tally) and prints the summary; exits 1 when any case failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_support import FAILURES, Fuzzer, Outcome, make_base_run, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000, help="number of cases (default: 10000)")
    parser.add_argument("--seed", type=int, default=14, help="fuzzer seed (default: 14)")
    parser.add_argument("--out", type=Path, default=Path("bench_out/fuzz"), help="output folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # The commands' own log lines go to a file, not the terminal.
    logging.basicConfig(level=logging.INFO, filename=args.out / "commands.log", filemode="w")
    base = make_base_run(args.out)
    fuzzer = Fuzzer(base, args.out / "work", seed=args.seed)
    start = time.perf_counter()

    def progress(index: int, outcome: Outcome) -> None:
        if outcome.verdict in FAILURES:
            print(f"case {index}: {outcome.verdict}: {outcome.detail}", flush=True)
        if (index + 1) % 250 == 0:  # a tally so far, in case the campaign is cut short
            print(f"{index + 1} cases, {time.perf_counter() - start:.0f} s", flush=True)
            partial = summary(fuzzer.outcomes) | {"seed": args.seed, "wall_s": round(time.perf_counter() - start, 1)}
            (args.out / "summary.json").write_text(json.dumps(partial, indent=2))

    fuzzer.run(args.cases, progress)
    report = summary(fuzzer.outcomes) | {"seed": args.seed, "wall_s": round(time.perf_counter() - start, 1)}
    (args.out / "summary.json").write_text(json.dumps(report, indent=2))
    (args.out / "failures.txt").write_text(
        "\n".join(f"{o.verdict}: {o.detail}" for o in fuzzer.outcomes if o.verdict in FAILURES)
    )
    print(json.dumps(report, indent=2))
    return 1 if any(report["verdicts"].get(f) for f in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
