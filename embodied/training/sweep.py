"""Aggregate several seeds of one experiment: a mean ± std curve PNG and a Markdown table."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from embodied.training.run import read_metrics

log = logging.getLogger(__name__)

CURVE_KEYS = ("eval/mean_return", "eval/success_rate")


def mean_std(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return mean, math.sqrt(var)


def aggregate(run_dirs: list[Path], out_dir: Path) -> Path:
    """Write ``out_dir/curves.png`` and ``out_dir/summary.md``; return ``out_dir``.

    Curves are aligned on the evaluation index (every seed evaluates at the same env-step
    schedule); the table reports the final evaluation of each seed and their mean ± std.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    evals = [[row for row in read_metrics(d) if "eval/success_rate" in row] for d in run_dirs]
    n_points = min((len(e) for e in evals), default=0)
    fig, axes = plt.subplots(1, len(CURVE_KEYS), figsize=(5 * len(CURVE_KEYS), 3.5))
    for ax, key in zip(axes, CURVE_KEYS):
        steps = [evals[0][i]["env_steps"] for i in range(n_points)]
        stats = [mean_std([e[i][key] for e in evals]) for i in range(n_points)]
        means = [m for m, _ in stats]
        stds = [s for _, s in stats]
        ax.plot(steps, means, marker="o")
        ax.fill_between(steps, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)], alpha=0.3)
        ax.set_xlabel("env steps")
        ax.set_ylabel(key.split("/")[1])
        ax.set_title(f"{key} (mean ± std, {len(run_dirs)} seeds)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_dir / "curves.png", dpi=100)
    plt.close(fig)

    lines = ["| run | env steps | train time (s) | success rate | mean return |", "|---|---|---|---|---|"]
    finals = [e[-1] for e in evals if e]
    for d, row in zip(run_dirs, finals):
        lines.append(
            f"| {d.name} | {row['env_steps']} | {row.get('eval/train_time_s', float('nan')):.2f} | "
            f"{row['eval/success_rate']:.3f} | {row['eval/mean_return']:.2f} |"
        )
    if finals:
        sr = mean_std([r["eval/success_rate"] for r in finals])
        ret = mean_std([r["eval/mean_return"] for r in finals])
        tt = mean_std([r.get("eval/train_time_s", float("nan")) for r in finals])
        lines.append(
            f"| **mean ± std** | | {tt[0]:.2f} ± {tt[1]:.2f} | {sr[0]:.3f} ± {sr[1]:.3f} | {ret[0]:.2f} ± {ret[1]:.2f} |"
        )
    (out_dir / "summary.md").write_text("\n".join(lines) + "\n")
    log.info("sweep summary written to %s", out_dir)
    return out_dir
