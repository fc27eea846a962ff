"""The single-process side of multi-process training: the --nproc launcher's command line, how
the work is split, and that one process joins no world (fast; the 2-rank runs are in
test_distributed.py)."""

from __future__ import annotations

import sys

import pytest

from embodied import distributed
from embodied.config import ConfigError
from embodied.training.launch import torchrun_command, without_nproc
from embodied.training.run import WORLD_KEY, CheckpointError, checkpoint_world_size


def test_the_launcher_runs_the_same_command_line_without_nproc_in_every_process() -> None:
    argv = ["-v", "train", "quad-hover", "--nproc", "2", "--seed", "3", "--nproc=2", "algo.gamma=0.99"]
    assert without_nproc(argv) == ["-v", "train", "quad-hover", "--seed", "3", "algo.gamma=0.99"]
    command = torchrun_command(4, argv)
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in command and "--standalone" in command
    assert command[command.index("-m", 3) + 1] == "embodied", "each process runs python -m embodied"
    assert command[-6:] == without_nproc(argv)


def test_one_process_joins_no_world_and_keeps_its_seed_and_envs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.init_from_environment() is None
    assert distributed.current() is None and distributed.is_main() and distributed.size() == 1
    assert distributed.rank_seed(7) == 7
    assert distributed.split_evenly(129, "num_envs") == 129
    assert distributed.from_main(lambda: 5) == 5
    assert checkpoint_world_size({}) == 1 and checkpoint_world_size({WORLD_KEY: {"size": 3, "ranks": [{}, {}]}}) == 3
    with pytest.raises(CheckpointError, match="'world'"):  # a world entry without the other ranks' states
        checkpoint_world_size({WORLD_KEY: {"size": 3, "ranks": []}})


def test_envs_that_do_not_split_evenly_name_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "_WORLD", distributed.World(rank=1, size=2, local_rank=1))
    with pytest.raises(ConfigError, match=r"num_envs=129 does not split evenly over 2 .* num_envs=128"):
        distributed.split_evenly(129, "num_envs")
    assert distributed.split_evenly(128, "num_envs") == 64
    assert distributed.rank_seed(7) == 7 + distributed.RANK_SEED_STRIDE


def test_nproc_under_torchrun_must_match_its_process_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from embodied.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "quad-hover", "--nproc", "3"]) == 2  # a one-line error, before joining
