"""Multi-process training on the CPU: 2 ranks over gloo, started with torch.multiprocessing.

One spawn (module fixture) runs every 2-rank check and leaves its results in files; the tests
compare them with single-process references computed here. The ranks are real processes joined
through ``embodied.distributed.init_from_environment`` as under torchrun.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from embodied import distributed
from embodied.experiment import ExperimentCfg, replace_trainer, resolve_experiment
from embodied.normalizer import RunningNormalizer
from embodied.training.run import WORLD_KEY, load_checkpoint, load_run, read_metrics
from embodied.training.trainer import Trainer, WorldSizeError

WORLD_SIZE = 2
OBS_DIM = 5


def _batches(rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s observation batches ``[B_r, OBS_DIM]`` (ranks hold different data and sizes)."""
    gen = torch.Generator().manual_seed(100 + rank)
    return [torch.randn(3 + rank, OBS_DIM, generator=gen) * (1 + rank) + rank for _ in range(4)]


def _cfg(algo: str, total_env_steps: int) -> ExperimentCfg:
    """A tiny quad-hover run: 8 envs in total (4 per rank), small networks."""
    overrides = {
        # lr_cooldown=0: the split run first trains to a smaller budget, and a schedule set in
        # fractions of the budget (the shipped cooldown) would then differ from the straight run's.
        "ppo": [
            "algo.num_steps_per_env=8",
            "algo.actor_hidden=[16,16]",
            "algo.critic_hidden=[16,16]",
            "algo.lr_cooldown=0",
        ],
        "sac": ["algo.batch_size=32", "algo.learning_starts=32", "algo.buffer_size_per_env=64"],
        "fasttd3": ["algo.batch_size=32", "algo.learning_starts=32", "algo.buffer_size_per_env=64"],
    }[algo]
    if algo != "ppo":
        overrides += ["algo.actor_hidden=[16,16]", "algo.critic_hidden=[16,16]"]
    cfg = resolve_experiment("quad-hover", algo, overrides=overrides, num_envs=8, seed=5)
    schedule = {"total_env_steps": total_env_steps, "eval_every_env_steps": 0, "checkpoint_every_updates": 1}
    quiet = {"progress": False, "success_target": None, "torch_threads": 1}
    return replace_trainer(cfg, eval_episodes=8, tensorboard=True, **schedule, **quiet)


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    """Every network tensor of the algorithm (parameters and normalizer statistics)."""
    out: dict[str, torch.Tensor] = {}
    for name, module in vars(trainer.algo).items():
        if isinstance(module, torch.nn.Module):
            out |= {f"{name}.{k}": v.detach().clone() for k, v in module.state_dict().items()}
    return out


def _rank_main(rank: int, out: Path) -> None:
    """What each rank does (also writes its results to ``out/<what>_rank<r>.pt``)."""
    norm = RunningNormalizer(OBS_DIM)
    for batch in _batches(rank):
        norm.update(batch)
    torch.save(norm.state_dict(), out / f"normalizer_rank{rank}.pt")

    for algo in ("ppo", "sac", "fasttd3"):
        trainer = Trainer(_cfg(algo, 8 * 12), out / f"{algo}_rank{rank}")
        trainer.train()
        torch.save(_params(trainer), out / f"{algo}_params_rank{rank}.pt")

    # exact resume: 2 updates, then on to 4, against 4 straight
    half = Trainer(replace_trainer(_cfg("ppo", 8 * 8 * 2), eval_episodes=0), out / f"split_rank{rank}")
    half.train()
    resumed = Trainer(replace_trainer(_cfg("ppo", 8 * 8 * 4), eval_episodes=0), out / f"split_rank{rank}", resume=True)
    resumed.train()
    torch.save(_params(resumed), out / f"resumed_params_rank{rank}.pt")
    straight = Trainer(replace_trainer(_cfg("ppo", 8 * 8 * 4), eval_episodes=0), out / f"straight_rank{rank}")
    straight.train()
    torch.save(_params(straight), out / f"straight_params_rank{rank}.pt")


def _join(rank: int, port: int) -> None:
    """Join the 2-rank world as torchrun's environment variables describe it."""
    os.environ |= {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(WORLD_SIZE),
    }
    torch.set_num_threads(1)
    assert distributed.init_from_environment(timeout_s=300) is not None


def _entry(rank: int, port: int, out: Path) -> None:
    _join(rank, port)
    try:
        _rank_main(rank, out)
    except BaseException:
        distributed.shutdown(together=False)
        raise
    distributed.shutdown()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    torch.multiprocessing.spawn(_entry, args=(_free_port(), out), nprocs=WORLD_SIZE, join=True)
    return out


def _load(path: Path) -> Any:
    return torch.load(path, weights_only=True)


pytestmark = pytest.mark.slow  # one spawn of 2 ranks that each train 7 tiny runs: ~30-60 s here


def test_normalizer_statistics_are_those_of_the_union_of_the_data(two_ranks: Path) -> None:
    reference = RunningNormalizer(OBS_DIM)
    for step_batches in zip(*(_batches(r) for r in range(WORLD_SIZE))):
        reference.update(torch.cat(step_batches))
    for rank in range(WORLD_SIZE):
        got = _load(two_ranks / f"normalizer_rank{rank}.pt")
        assert got["count"].item() == reference.count.item()
        torch.testing.assert_close(got["mean"], reference.mean, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got["var"], reference.var, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("algo", ["ppo", "sac", "fasttd3"])
def test_parameters_are_identical_on_every_rank_after_updates(two_ranks: Path, algo: str) -> None:
    ranks = [_load(two_ranks / f"{algo}_params_rank{r}.pt") for r in range(WORLD_SIZE)]
    initial = Trainer(_cfg(algo, 8), two_ranks / f"{algo}_initial")  # rank 0's seed, never trained
    initial._release()
    for key, value in ranks[0].items():
        assert torch.equal(value, ranks[1][key]), f"{algo}: {key} differs between the ranks"
    changed = [k for k, v in _params(initial).items() if k in ranks[0] and not torch.equal(v, ranks[0][k])]
    assert any(".weight" in k for k in changed), f"{algo}: no weight moved, the check proves nothing"


def test_only_rank_0_writes_and_its_checkpoint_holds_every_rank(two_ranks: Path) -> None:
    run = two_ranks / "ppo_rank0"
    assert not (two_ranks / "ppo_rank1").exists(), "rank 1 wrote files"
    for name in ("config.yaml", "git.txt", "metrics.jsonl", "ckpt/latest.pt", "ckpt/policy.pt"):
        assert (run / name).is_file(), name
    assert any((run / "tb").iterdir()), "no TensorBoard events"
    ckpt = load_checkpoint(run)
    assert ckpt[WORLD_KEY]["size"] == WORLD_SIZE and len(ckpt[WORLD_KEY]["ranks"]) == WORLD_SIZE - 1
    rows = read_metrics(run)
    assert rows[-1]["env_steps"] == 8 * 12, "env steps count the envs of both ranks"
    assert any("eval/success_rate" in row for row in rows), "rank 0 evaluated"
    # what reads a policy (eval, export, play) reads a 2-rank run as any other
    policy = load_run(run).policy
    assert policy.export_module()(torch.zeros(3, policy.actor_obs_dim)).shape == (3, policy.action_dim)


def test_resume_with_the_same_world_size_continues_exactly(two_ranks: Path) -> None:
    for rank in range(WORLD_SIZE):
        resumed = _load(two_ranks / f"resumed_params_rank{rank}.pt")
        straight = _load(two_ranks / f"straight_params_rank{rank}.pt")
        assert resumed.keys() == straight.keys()
        for key in resumed:
            assert torch.equal(resumed[key], straight[key]), f"rank {rank}: {key}"


def test_resume_with_another_world_size_is_a_named_error(two_ranks: Path) -> None:
    cfg = replace_trainer(_cfg("ppo", 8 * 8 * 6), eval_episodes=0)
    with pytest.raises(WorldSizeError, match="written by 2 training process"):
        Trainer(cfg, two_ranks / "split_rank0", resume=True)


# --------------------------------------------------------------------------- learning check

LEARN_STEPS = 5000
"""Env steps (2 envs in total) of the Pendulum-v1 SAC runs; the shipped config solves it in ~2k
steps with 1 env."""


def _pendulum_cfg() -> ExperimentCfg:
    cfg = resolve_experiment("gym:Pendulum-v1", "sac", num_envs=2, seed=0)
    return replace_trainer(cfg, total_env_steps=LEARN_STEPS, progress=False, tensorboard=False, success_target=None)


def _learn_entry(rank: int, port: int, out: Path) -> None:
    _join(rank, port)
    try:
        Trainer(_pendulum_cfg(), out / f"pendulum_rank{rank}").train()
    except BaseException:
        distributed.shutdown(together=False)
        raise
    distributed.shutdown()


def _best_return(run: Path) -> float:
    return max(row["eval/mean_return"] for row in read_metrics(run) if "eval/mean_return" in row)


def test_two_processes_learn_as_well_as_one_with_the_same_total_envs(tmp_path: Path) -> None:
    pytest.importorskip("gymnasium")
    torch.multiprocessing.spawn(_learn_entry, args=(_free_port(), tmp_path), nprocs=WORLD_SIZE, join=True)
    Trainer(_pendulum_cfg(), tmp_path / "pendulum_one").train()
    one, two = _best_return(tmp_path / "pendulum_one"), _best_return(tmp_path / "pendulum_rank0")
    # a random policy returns about -1200; solved is >= -200
    assert one >= -250 and two >= -250, f"best eval return: 1 process {one:.0f}, 2 processes {two:.0f}"
