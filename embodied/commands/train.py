"""``embodied train``: train a policy; prints the run directory as the last line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

from embodied.config import UNPHYSICAL, ConfigError, device_flag, int_in_range
from embodied.experiment import ExperimentCfg

log = logging.getLogger("embodied.train")

EXAMPLES = """examples:
  embodied train quad-hover                         # default task, PPO, CPU: a policy `verify` passes
                                                    # (its default preset, sweep; 1-2 minutes on 2 cores)
  embodied train quad-hover --preset nominal        # the nominal vehicle only: 15-35 s, quick experiments
  embodied train quad-hover --algo ppo --seed 3 --num-envs 512 algo.learning_rate=3e-4
  embodied train quad-hover --config my.yaml trainer.total_env_steps=2e6
  embodied train --resume runs/quad_hover/20261129-101500_ppo_s0 trainer.total_env_steps=4e6
  embodied train quad-hover --seeds 0,1,2           # a sweep with a mean +- std curve
  embodied train quad-hover --preset robust         # with the reality-gap models randomized
  embodied train quad-hover env.sim.substeps=2000 --i-know-what-im-doing env.sim.substeps
  embodied train quad-hover env.sim.params.mass_kg=80 --allow-unphysical
  embodied train halfcheetah --backend mjwarp --num-envs 1024 --device cuda
                                                    # the same task on MuJoCo-Warp (`embodied list`)
  embodied train quad-hover --nproc 2               # 2 processes, num_envs split between them
  torchrun --nproc-per-node 4 -m embodied train quad-hover --device cuda --num-envs 16384
                                                    # the same through torchrun (multi-node: docs/distributed.md)

overrides are key=value with the keys of the saved config.yaml: seed, num_envs, device,
env.<field>, algo.<field>, trainer.<field> (values parsed as YAML). Use --print-config to see
every key, its resolved value and what it means. Every number is checked for finiteness and a
sane range; a limit that only guards against hangs or huge allocations can be lifted per key
with --i-know-what-im-doing KEY. Physical and algorithmic parameters carry a plausible range
with units (shown by --print-config; e.g. env.sim.dt_s in [0.0001, 0.1] s); a value outside it
is refused naming the key, the value and the range, unless --allow-unphysical (every key) or
--i-know-what-im-doing KEY (one key) is given. Numbers are decimal literals (3, 0.5, 1e6):
0x10, 1_000, 010 and YAML 1.1's yes/no are refused. On --resume only trainer.* overrides are accepted (and
--no-progress, --print-config, --i-know-what-im-doing): other flags would change the run.
Exit codes: 0 done, 2 bad input (one line naming the key, file or flag), 130 Ctrl-C, 143
SIGTERM (both after writing a checkpoint; continue with --resume)."""

SEED_FLAG = int_in_range(0, 2**31 - 1)
"""``--seed`` and each of ``--seeds``: the config's ``seed`` range."""


def configs_root() -> Path:
    """The shipped ``configs/`` folder (the ``embodied.configs`` package)."""
    import importlib.resources

    return Path(str(importlib.resources.files("embodied.configs")))


def preset_file(task_name: str, algo_name: str, preset: str) -> Path:
    """``configs/<task>/<algo>.<preset>.yaml``; a :class:`ConfigError` lists the presets there are."""
    from embodied.experiment import config_key

    folder = configs_root() / config_key(task_name)
    path = folder / f"{algo_name}.{preset}.yaml"
    if not path.is_file():
        found = sorted(p.name for p in folder.glob(f"{algo_name}.*.yaml")) if folder.is_dir() else []
        names = ", ".join(f.removeprefix(f"{algo_name}.").removesuffix(".yaml") for f in found) or "none"
        raise ConfigError(f"no preset {preset!r} for {task_name} with {algo_name} ({path} not found); presets: {names}")
    return path


DEFAULT_PRESETS_FILE = "default_presets.yaml"
"""``configs/<task>/default_presets.yaml``: algorithm -> the preset ``embodied train`` layers when
no ``--preset`` is given (e.g. ``ppo: sweep``: the default quad-hover command trains a policy that
``verify`` passes). The Python API (:func:`embodied.experiment.resolve_experiment`) layers only
what it is handed."""


def _default_presets(folder: Path) -> dict[str, str]:
    """Algorithm -> default preset of one task's config folder (empty without :data:`DEFAULT_PRESETS_FILE`)."""
    from embodied.config import load_yaml

    path = folder / DEFAULT_PRESETS_FILE
    if not path.is_file():
        return {}
    named = load_yaml(path)
    for algo_name, name in named.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: {algo_name!r} expects a preset name (e.g. sweep), got {name!r}")
    return named


def default_preset(task_name: str, algo_name: str) -> str | None:
    """The preset ``embodied train`` uses for ``task_name`` with ``algo_name`` when ``--preset`` is
    not given, from :data:`DEFAULT_PRESETS_FILE` (None: the algorithm's YAML alone)."""
    from embodied.experiment import config_key

    return _default_presets(configs_root() / config_key(task_name)).get(algo_name)


def list_presets() -> str:
    """One line per task folder with presets, e.g. ``quad_hover: ppo.robust``; a default preset is
    marked ``(default)``."""
    lines = []
    for folder in sorted(p for p in configs_root().iterdir() if p.is_dir()):
        # a preset layers over its algorithm's YAML beside it (configs/vehicles holds no presets)
        names = sorted(
            p.name.removesuffix(".yaml")
            for p in folder.glob("*.*.yaml")
            if (folder / f"{p.name.split('.')[0]}.yaml").is_file()
        )
        defaults = {f"{algo}.{name}" for algo, name in _default_presets(folder).items()}
        if names:
            shown = [f"{n} (default)" if n in defaults else n for n in names]
            lines.append(f"  {folder.name}: {', '.join(shown)}  (<algo>.<preset>)")
    return "\n".join(lines) or "  (none shipped)"


def _merged_yaml(first: Path, second: Path, out_dir: Path) -> Path:
    """``second`` layered over ``first`` (nested keys merged), written to ``out_dir``."""
    import yaml

    from embodied.config import load_yaml

    def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    path = out_dir / f"{first.stem}+{second.stem}.yaml"
    path.write_text(yaml.safe_dump(merge(load_yaml(first), load_yaml(second))))
    return path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a policy (prints the run directory last)",
        description="Train a policy on a task with the shared trainer. Layers: dataclass defaults, "
        "configs/<task>/<algo>.yaml, --preset NAME (configs/<task>/<algo>.<NAME>.yaml), --config FILE, "
        "key=value overrides, explicit flags.",
        epilog=EXAMPLES + "\n\npresets shipped (--preset NAME):\n" + list_presets(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("task", nargs="?", help="task name (see `embodied list`), e.g. quad-hover or gym:Pendulum-v1")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. algo.learning_rate=3e-4")
    p.add_argument("--algo", default=None, help="algorithm (see `embodied list`; default: ppo)")
    p.add_argument(
        "--backend",
        default=None,
        metavar="NAME",
        help="simulator backend for the task, e.g. mujoco or mjwarp (default: the task's own; "
        "`embodied list` shows each task's backends, the default first)",
    )
    p.add_argument("--seed", type=SEED_FLAG, default=None, help="random seed (default: from config, 0)")
    p.add_argument("--seeds", default=None, help="comma-separated seeds: run each, then aggregate (e.g. 0,1,2)")
    p.add_argument("--device", type=device_flag, default=None, help="cpu or cuda[:N] (default: cpu)")
    p.add_argument(
        "--num-envs", type=int_in_range(1, 2**31), default=None, help="parallel environments (default: from config)"
    )
    p.add_argument("--config", type=Path, default=None, help="YAML file with overrides (same keys as config.yaml)")
    p.add_argument(
        "--dataset",
        default=None,
        metavar="PATH",
        help="demonstration dataset the algorithm preloads (written by `embodied collect`); sets trainer.dataset",
    )
    p.add_argument(
        "--base",
        default=None,
        metavar="RUN_DIR|lerobot:REF",
        help="pretrained base policy to fine-tune (--algo reinflow, residual, o2o-residual): a run directory, or "
        "lerobot:<hub id or folder>, a LeRobot checkpoint loaded by LeRobot (residual, o2o-residual; from the LeRobot "
        "environment); sets trainer.base_run",
    )
    p.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="shipped variant layered after the algo YAML, e.g. robust (quad-hover: reality-gap models "
        "randomized); listed below. A task may name a default one (marked (default) below: quad-hover's "
        "sweep); --preset nominal there is the algo YAML alone",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="exact run directory to create (default: runs/<task>/<stamp>_<algo>_s<seed>)",
    )
    p.add_argument("--runs-root", type=Path, default=None, help="root folder for new run directories (default: runs)")
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="RUN_DIR",
        help="continue a run exactly where its last checkpoint stopped",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print every resolved key, value and its help, then exit"
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument(
        "--nproc",
        type=int_in_range(1, 4096),
        default=None,
        metavar="N",
        help="train with N processes on this machine (starts torchrun: gloo on CPU, NCCL on CUDA); "
        "num_envs is the total, split evenly; --resume needs the N the run was trained with",
    )
    p.add_argument(
        "--i-know-what-im-doing",
        dest="allow",
        action="append",
        default=[],
        metavar="KEY",
        help="lift the upper range limit of config KEY (repeatable), e.g. for num_envs above 262144, "
        "or its plausible physical range",
    )
    p.add_argument(
        "--allow-unphysical",
        dest="allow",
        action="append_const",
        const=UNPHYSICAL,
        help="accept values outside the plausible physical ranges (e.g. env.sim.params.mass_kg=100) for a "
        "deliberate experiment; recorded in config.yaml, so --resume, eval and play accept them too. "
        "NaN, infinity, the hang guards and angles outside their interval stay refused",
    )
    p.set_defaults(func=run)


RESUME_FIXED_FLAGS: tuple[tuple[str, str], ...] = (
    ("algo", "--algo"),
    ("backend", "--backend"),
    ("seed", "--seed"),
    ("seeds", "--seeds"),
    ("device", "--device"),
    ("num_envs", "--num-envs"),
    ("config", "--config"),
    ("run_dir", "--run-dir"),
    ("runs_root", "--runs-root"),
    ("preset", "--preset"),
    ("dataset", "--dataset"),
    ("base", "--base"),
)
# --nproc is not among them: it must repeat the number of processes the run was trained with.
"""Flags that would change what a resumed run is: ``--resume`` rejects them (the saved
``config.yaml`` fixes these)."""


def run(args: argparse.Namespace) -> int:
    from embodied import distributed

    nproc = args.nproc or 1
    launched = distributed.launched_world_size()
    if nproc > 1 and launched == 1:
        from embodied.training.launch import launch_local

        return launch_local(nproc, getattr(args, "argv", None) or sys.argv[1:])
    if args.nproc is not None and launched > 1 and nproc != launched:
        raise ConfigError(f"--nproc {nproc} under torchrun, which started {launched} processes: drop --nproc")
    if distributed.init_from_environment() is None:
        return _run(args)
    if not distributed.is_main():
        logging.getLogger("embodied").setLevel(logging.WARNING)  # rank 0 reports for all
    try:
        code = _run(args)
    except BaseException:
        distributed.shutdown(together=False)
        raise
    distributed.shutdown()
    return code


def _run(args: argparse.Namespace) -> int:
    from embodied import distributed
    from embodied.experiment import check_allow_keys, config_key, resolve_experiment
    from embodied.registry import resolve_device
    from embodied.training.run import CONFIG_FILE, make_run_dir, new_run_dir

    overrides = list(args.overrides)
    if args.resume is not None:
        if args.task is not None and "=" in args.task:
            overrides.insert(0, args.task)
        elif args.task is not None:
            raise ConfigError("--resume takes the run directory; do not also give a task name")
        given = [flag for dest, flag in RESUME_FIXED_FLAGS if getattr(args, dest, None) is not None]
        if given:
            raise ConfigError(
                f"command line: --resume cannot honour {', '.join(given)}: a resumed run keeps the values in "
                f"{args.resume / CONFIG_FILE}; start a new run to change them"
            )
        return _resume(args.resume, overrides, args.no_progress, args.print_config, args.allow)
    if args.task is None:
        raise ConfigError("missing TASK (e.g. `embodied train quad-hover`); `embodied list` shows the tasks")
    task, overrides = _select_backend(args.task, args.backend, overrides)
    seeds = _parse_seeds(args.seeds) if args.seeds else [args.seed]
    # the flags are shorthands for the trainer keys, so the saved config.yaml records them
    if args.dataset is not None:
        overrides.append(f"trainer.dataset={json.dumps(args.dataset)}")  # quoted: always a string
    if args.base is not None:
        overrides.append(f"trainer.base_run={json.dumps(args.base)}")
    algo = args.algo or "ppo"
    config_file = args.config
    with tempfile.TemporaryDirectory() as tmp:
        preset_name = args.preset if args.preset is not None else default_preset(task, algo)
        if preset_name is not None:
            if args.preset is None and distributed.is_main():
                log.info(
                    "preset %s: %s's default with %s (configs/%s/%s)",
                    preset_name, task, algo, config_key(task), DEFAULT_PRESETS_FILE,
                )  # fmt: skip
            preset = preset_file(task, algo, preset_name)
            config_file = preset if args.config is None else _merged_yaml(preset, args.config, Path(tmp))
        agent = _isaaclab_agent_yaml(task, algo, args.num_envs, overrides, Path(tmp))
        if agent is not None:  # a layer under the preset, the config file and the command line
            config_file = agent if config_file is None else _merged_yaml(agent, config_file, Path(tmp))
        cfgs = [
            resolve_experiment(
                task,
                algo,
                config_file,
                overrides,
                seed=seed,
                device=args.device,
                num_envs=args.num_envs,
                allow=args.allow,
            )
            for seed in seeds
        ]
    check_allow_keys(cfgs[0], args.allow)
    if args.no_progress:
        cfgs = [_no_progress(c) for c in cfgs]
    if args.print_config:
        if distributed.is_main():
            _print_config(cfgs[0])
        return 0
    resolve_device(cfgs[0].device)  # an unusable device fails before any run directory exists
    run_dirs: list[Path] = []
    for cfg in cfgs:

        def create(cfg: ExperimentCfg = cfg) -> Path:
            if args.run_dir is not None and len(cfgs) == 1:
                # The trainer checks, under the run directory's lock, that no run is there yet.
                return make_run_dir(args.run_dir)
            root = args.run_dir if args.run_dir is not None else (args.runs_root or Path("runs"))
            return new_run_dir(root, cfg)

        run_dir = distributed.from_main(create)  # only rank 0 creates folders
        _train_one(cfg, run_dir, resume=False, allow=args.allow)
        run_dirs.append(run_dir)
    if not distributed.is_main():
        return 0
    if len(run_dirs) > 1:
        from embodied.training.sweep import aggregate

        out = aggregate(run_dirs, run_dirs[0].parent / f"sweep_{run_dirs[0].name.split('_', 1)[1].rsplit('_s', 1)[0]}")
        print(f"sweep summary: {out}")
        for d in run_dirs:
            print(d)
    else:
        print(run_dirs[0])
    return 0


def _isaaclab_agent_yaml(
    task: str, algo: str, num_envs: int | None, overrides: list[str], out_dir: Path
) -> Path | None:
    """Isaac Lab's own RSL-RL agent config of an ``isaaclab:<TaskId>`` task, translated to embodied's
    PPO keys (``embodied.sim.isaaclab_agent``) and written to ``out_dir``; None for any other task,
    algorithm, a task that registers none, or where Isaac Lab is not installed.

    Reading it imports Isaac Lab, which fixes its asset root: an ``env.asset_root=`` on the command
    line is applied first."""
    import importlib.util

    from embodied.registry import ISAACLAB_PREFIX

    if not task.startswith(ISAACLAB_PREFIX) or algo != "ppo" or importlib.util.find_spec("isaaclab_tasks") is None:
        return None
    import yaml

    from embodied.sim.isaaclab import set_asset_root
    from embodied.sim.isaaclab_agent import agent_overrides

    for word in overrides:
        if word.startswith("env.asset_root="):
            set_asset_root(word.split("=", 1)[1].strip("\"'"))
    task_id = task[len(ISAACLAB_PREFIX) :]
    translated = agent_overrides(task_id, num_envs)
    if translated is None:
        return None
    logging.getLogger("embodied").info("%s: PPO settings from Isaac Lab's RSL-RL agent config of %s", task, task_id)
    path = out_dir / "isaaclab_agent.yaml"
    path.write_text(yaml.safe_dump(translated))
    return path


def _select_backend(name: str, backend: str | None, overrides: list[str]) -> tuple[str, list[str]]:
    """``(task name, overrides)`` with ``--backend`` (or a deprecated alias's backend) applied.

    The choice becomes the config key ``env.backend.name``, saved in ``config.yaml`` like any
    other, so resume and eval rebuild the same backend. It goes first: an explicit
    ``env.backend.name=`` override on the command line wins over an alias, not over ``--backend``."""
    from embodied import registry

    task, implied = registry.canonical_task(name)
    chosen = backend or implied
    if chosen is None:
        return task, overrides
    selection = registry.backend_override(task, chosen)
    return task, (selection + overrides if backend is None else overrides + selection)


def _resume(run_dir: Path, overrides: list[str], no_progress: bool, print_config: bool, allow: list[str]) -> int:
    from embodied import distributed

    # rank 0 reads the saved config for every rank (other machines may not see the run directory)
    cfg, allow = distributed.from_main(lambda: _resume_config(run_dir, overrides, allow))
    if no_progress:
        cfg = _no_progress(cfg)
    if print_config:
        if distributed.is_main():
            _print_config(cfg)
        return 0
    _train_one(cfg, run_dir, resume=True, allow=allow)
    if distributed.is_main():
        print(run_dir)
    return 0


def _resume_config(run_dir: Path, overrides: list[str], allow: list[str]) -> tuple[ExperimentCfg, list[str]]:
    """The saved config of ``run_dir`` with ``trainer.*`` overrides, and the allowed keys."""
    from embodied.config import apply_overrides, parse_dotted
    from embodied.errors import EmbodiedError
    from embodied.experiment import check_allow_keys, load_experiment, saved_allow
    from embodied.training.run import CONFIG_FILE

    if not (run_dir / CONFIG_FILE).is_file():
        raise EmbodiedError(
            f"--resume {run_dir}: not a run directory (no {CONFIG_FILE}); pass the folder `embodied train` printed"
        )
    allow = [*saved_allow(run_dir / CONFIG_FILE), *allow]
    cfg = load_experiment(run_dir / CONFIG_FILE, allow=allow)
    check_allow_keys(cfg, allow)
    if overrides:
        # Only the training budget may change on resume; anything else would not be "the same run".
        extra = parse_dotted(overrides)
        if set(extra) - {"trainer"}:
            bad = ", ".join(sorted(str(k) for k in set(extra) - {"trainer"}))
            raise ConfigError(
                f"command line: --resume cannot honour overrides of {bad}: only trainer.* keys may change "
                "(e.g. trainer.total_env_steps=4e6)"
            )
        cfg = apply_overrides(cfg, extra, "command line", allow=allow)
    return cfg, allow


def _print_config(cfg: ExperimentCfg) -> None:
    from embodied.config import describe

    for key, value, doc in describe(cfg):
        print(f"{key} = {value}" + (f"    # {doc}" if doc else ""))


def _train_one(cfg: ExperimentCfg, run_dir: Path, resume: bool, allow: list[str]) -> None:
    from embodied import distributed
    from embodied.training.trainer import Trainer

    trainer = Trainer(cfg, run_dir, resume=resume, allow=sorted(set(allow)))
    try:
        state = trainer.train()
    finally:
        trainer.close()
    if not distributed.is_main():
        return
    print(
        f"env steps: {state.env_steps}  training time: {state.train_time_s:.2f} s  eval time: {state.eval_time_s:.2f} s"
    )
    if state.evals:
        last = state.evals[-1]
        print(
            f"eval: success_rate {last['eval/success_rate']:.3f}  mean_return {last['eval/mean_return']:.2f}  "
            f"mean_episode_length {last['eval/mean_episode_length']:.1f}"
        )
    if state.time_to_target_s is not None:
        print(
            f"success target first reached after {state.time_to_target_s:.2f} s of training ({state.env_steps_to_target} env steps)"
        )


def _no_progress(cfg: ExperimentCfg) -> ExperimentCfg:
    from embodied.experiment import replace_trainer

    return replace_trainer(cfg, progress=False)


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [SEED_FLAG(s) for s in text.split(",") if s.strip()]
    except argparse.ArgumentTypeError as err:
        raise ConfigError(f"--seeds expects comma-separated integers like 0,1,2: {err}") from None
    if not seeds:
        raise ConfigError("--seeds is empty")
    return seeds
