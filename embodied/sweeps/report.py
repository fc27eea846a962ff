"""A finished sweep as one table (``results.md``), one file (``results.json``), one plot (``curves.png``)."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from embodied.training.eval_schedule import target_held_by
from embodied.training.run import read_metrics
from embodied.training.sweep import mean_std


def summarize_evals(run_dir: Path) -> dict[str, Any]:
    """The evaluations in a run's ``metrics.jsonl``: env steps, training s, success, return."""
    if not (run_dir / "metrics.jsonl").is_file():
        return {"evals": []}
    evals = [
        {
            "env_steps": row.get("eval/env_steps", row.get("env_steps", row.get("step", 0))),
            "train_time_s": row.get("eval/train_time_s", float("nan")),
            "success_rate": row["eval/success_rate"],
            "mean_return": row.get("eval/mean_return", float("nan")),
        }
        for row in read_metrics(run_dir)
        if "eval/success_rate" in row
    ]
    return {"evals": evals}


def target_points(evals: Sequence[dict[str, float]], target: float, hold: str = "each") -> dict[str, Any]:
    """First evaluation at or above ``target``, and the second of the first two in a row that hold
    it under the rule ``hold`` (``each`` or ``mean``, as ``trainer.success_hold``)."""
    first = next((e for e in evals if e["success_rate"] >= target), None)
    held = next(
        (
            b
            for a, b in itertools.pairwise(evals)
            if target_held_by([a["success_rate"], b["success_rate"]], target, hold)
        ),
        None,
    )
    return {"first": first, "held": held}


def _configs(results: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["config"] for r in results))


def table(results: Sequence[dict[str, Any]], target: float, hold: str = "each") -> str:
    """Markdown: per configuration, seeds that held the target (rule ``hold``), env steps and training s to it."""
    held_by = "" if hold == "each" else f" ({hold} of two)"
    lines = [
        f"| config | seeds held ≥ {target:.0%}{held_by} | held: env steps (median) | held: training s (median) "
        "| final success (mean ± std) | per seed (held steps / s; best) |",
        "|---|---|---|---|---|---|",
    ]
    for config in _configs(results):
        rows = [r for r in results if r["config"] == config]
        held = [target_points(r["evals"], target, hold)["held"] for r in rows]
        reached = [h for h in held if h is not None]
        steps = statistics.median(h["env_steps"] for h in reached) if reached else float("nan")
        secs = statistics.median(h["train_time_s"] for h in reached) if reached else float("nan")
        finals = [r["evals"][-1]["success_rate"] for r in rows if r["evals"]]
        final = "{:.3f} ± {:.3f}".format(*mean_std(finals)) if finals else "–"
        per_seed = ", ".join(
            f"s{r['seed']}: "
            + (f"{h['env_steps']:.0f} / {h['train_time_s']:.1f}" if h else "–")
            + f"; {max((e['success_rate'] for e in r['evals']), default=float('nan')):.3f}"
            + ("" if r["returncode"] == 0 else f" (exit {r['returncode']})")
            for r, h in zip(rows, held)
        )
        lines.append(f"| {config} | {len(reached)}/{len(rows)} | {steps:.0f} | {secs:.2f} | {final} | {per_seed} |")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], path: Path) -> None:
    """Success rate against env steps, one mean ± std band per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for config in _configs(results):
        curves = [r["evals"] for r in results if r["config"] == config and r["evals"]]
        n = min((len(c) for c in curves), default=0)
        if n == 0:
            continue
        steps = [curves[0][i]["env_steps"] for i in range(n)]
        stats = [mean_std([c[i]["success_rate"] for c in curves]) for i in range(n)]
        means = [m for m, _ in stats]
        ax.plot(steps, means, marker=".", label=f"{config} ({len(curves)} seeds)")
        ax.fill_between(steps, [m - s for m, s in stats], [m + s for m, s in stats], alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel("evaluation success rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(out_dir: Path, name: str, results: Sequence[dict[str, Any]], target: float, hold: str = "each") -> str:
    """Write ``results.json``, ``results.md`` and ``curves.png`` into ``out_dir``; return the table."""
    rows = [{**r, **target_points(r["evals"], target, hold)} for r in results]
    summary = {"sweep": name, "target": target, "hold": hold, "runs": rows}
    (out_dir / "results.json").write_text(json.dumps(summary, indent=1))
    md = table(results, target, hold)
    (out_dir / "results.md").write_text(f"# sweep {name}\n\n{md}\n")
    plot(results, out_dir / "curves.png")
    return md
