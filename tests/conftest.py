"""Test-suite wiring: GPU tests are skipped without CUDA; ``--skipslow`` skips tests marked slow;
``trained_run`` trains a fixture policy once and caches it across test runs.

CI runs the fast suite first (``-m "not slow"``) and the slow tests after it (``-m slow``,
cold ``torch.compile`` equivalence checks); see ``scripts/test.sh``.

Trained fixture runs live under pytest's cache directory (``.pytest_cache/d/trained_runs``),
keyed by a hash of every source and config file that can change what training produces
(``embodied``, ``sim``, ``tasks``, ``policies``, ``configs``), the torch version and the
run's own settings. Editing any of those retrains on the next test run; a stale entry is
deleted when it is replaced. ``pytest --cache-clear`` forces a retrain.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

import embodied.sim  # noqa: F401  (picks MuJoCo's headless GL before any test module imports mujoco)

TRAINING_PACKAGES = ("embodied", "embodied.sim", "embodied.tasks", "embodied.policies", "embodied.configs")
"""Import names whose files decide what a training run produces (the trainer, algorithms, tasks,
simulators, networks and shipped configs)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skipslow", action="store_true", help="skip tests marked slow (cold torch.compile)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs CUDA (none visible)")
    skip_slow = pytest.mark.skip(reason="slow: skipped by --skipslow")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        if "slow" in item.keywords and config.getoption("--skipslow"):
            item.add_marker(skip_slow)


def training_sources_digest() -> str:
    """sha256 over the path and bytes of every ``.py``/``.yaml`` file of :data:`TRAINING_PACKAGES`."""
    digest = hashlib.sha256(torch.__version__.encode())
    for name in TRAINING_PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"{name} is not an installed package"
        for root in map(Path, spec.submodule_search_locations):
            for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml") and p.is_file()):
                digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def trained_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: a run directory trained with ``task``/``algo``/``seed`` and dotted ``overrides``
    (shipped config first, as ``embodied train`` does), built at most once per source state.

    Only settings that change the trained weights belong in ``overrides``; evaluation, logging,
    checkpoint cadence and threads are fixed here (no periodic evals, final checkpoint only,
    one torch thread).
    """
    cache = getattr(request.config, "cache", None)
    root = Path(cache.mkdir("trained_runs")) if cache is not None else tmp_path_factory.mktemp("trained_runs")
    sources = training_sources_digest()
    built: dict[str, Path] = {}

    def build(task: str, algo: str, seed: int, overrides: Sequence[str] = ()) -> Path:
        from embodied.experiment import replace_trainer, resolve_experiment
        from embodied.training.run import CHECKPOINT_FILE
        from embodied.training.trainer import Trainer

        spec = "\0".join([task, algo, str(seed), *overrides])
        name = f"{sources}-{hashlib.sha256(spec.encode()).hexdigest()[:16]}"
        run_dir = root / name
        if name in built or (run_dir / CHECKPOINT_FILE).is_file():
            built[name] = run_dir
            return run_dir
        for stale in root.glob(f"*-{name.split('-')[1]}"):
            shutil.rmtree(stale, ignore_errors=True)  # same run, older sources: never used again
        cfg = resolve_experiment(task, algo, overrides=list(overrides), seed=seed)
        cfg = replace_trainer(
            cfg,
            eval_every_env_steps=0,
            eval_episodes=0,
            checkpoint_every_updates=10**9,
            progress=False,
            tensorboard=False,
            # One intra-op thread: OpenMP threads that share busy cores stall each other (the
            # 400k-step hover run took 760 s with 2 threads on a loaded 2-core machine, 41 s
            # with 1 on the same machine).
            torch_threads=1,
        )
        partial = root / f"{name}.partial-{os.getpid()}"  # one per process: two test runs may race
        shutil.rmtree(partial, ignore_errors=True)
        threads = torch.get_num_threads()
        try:
            Trainer(cfg, partial).train()
        finally:
            torch.set_num_threads(threads)  # the trainer applies trainer.torch_threads globally
        try:
            partial.rename(run_dir)  # a run interrupted mid-training is never mistaken for a finished one
        except OSError:
            if not (run_dir / CHECKPOINT_FILE).is_file():
                raise
            shutil.rmtree(partial, ignore_errors=True)  # another test run finished the same one first
        built[name] = run_dir
        return run_dir

    return build


HOVER_PPO_ENV_STEPS = 1_000_000
"""A short PPO run: enough to hover for a good part of an episode, not to be a finished policy."""


@pytest.fixture(scope="session")
def hover_ppo_run(trained_run: Callable[..., Path]) -> Path:
    """quad-hover with the shipped PPO config, seed 0, :data:`HOVER_PPO_ENV_STEPS` env steps.

    Shared by the learning check (``test_ppo.py``) and the closed loop over DDS
    (``test_real_closed_loop.py``): one training per source state.
    """
    return trained_run("quad-hover", "ppo", 0, [f"trainer.total_env_steps={HOVER_PPO_ENV_STEPS}"])
