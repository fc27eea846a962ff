"""LeRobot policy type ``embodied``: embodied's policy artifact behind LeRobot's policy interface.

The checkpoint folder holds ``config.json`` (:class:`EmbodiedConfig`) and the artifact file
(embodied's own format: the network as plain arrays, read with ``weights_only=True`` and its seal
verified); :meth:`EmbodiedPolicy.from_pretrained` reads both, from a folder or a Hub repo.
``select_action`` keeps LeRobot's action queue: a plan of ``chunk_size`` actions, of which
``n_action_steps`` are executed before the next plan, as embodied executes it.

Shapes: ``B`` = batch, ``D`` = state size, ``H`` = chunk, ``A`` = action size.
"""

from __future__ import annotations

import builtins
from collections import deque
from pathlib import Path
from typing import Any, TypeVar

import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.pretrained import PreTrainedPolicy
from torch import Tensor

from embodied.export.artifact import PolicyArtifact
from lerobot_policy_embodied.configuration_embodied import EmbodiedConfig

T = TypeVar("T", bound="EmbodiedPolicy")
C = TypeVar("C", bound=PreTrainedConfig)


def checkpoint_folder(
    name_or_path: str | Path, revision: str | None, cache_dir: str | Path | None, local_files_only: bool
) -> Path:
    """The local folder of a checkpoint: ``name_or_path`` itself, or a Hub repo's snapshot."""
    folder = Path(name_or_path)
    if folder.is_dir():
        return folder
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(str(name_or_path), revision=revision, cache_dir=cache_dir, local_files_only=local_files_only)
    )


def checkpoint_config(folder: Path, config_class: builtins.type[C]) -> C:
    """``folder/config.json``, read through the base class (its ``type`` chooses the subclass);
    an error unless it is a ``config_class``."""
    loaded = PreTrainedConfig.from_pretrained(folder)
    if not isinstance(loaded, config_class):
        raise ValueError(f"{folder}: config.json is of policy type {loaded.type!r}, not {config_class.__name__}'s")
    return loaded


class EmbodiedPolicy(PreTrainedPolicy):
    config_class = EmbodiedConfig
    name = "embodied"

    def __init__(self, config: EmbodiedConfig, artifact: PolicyArtifact | None = None, **kwargs: Any) -> None:
        super().__init__(config)
        config.validate_features()
        self.config: EmbodiedConfig = config
        self.artifact = artifact
        self.network = artifact.module().eval() if artifact is not None else None
        self._queue: deque[Tensor] = deque(maxlen=config.n_action_steps)

    @classmethod
    def from_pretrained(  # type: ignore[override]
        cls: builtins.type[T],
        pretrained_name_or_path: str | Path,
        *,
        config: EmbodiedConfig | None = None,
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ) -> T:
        folder = checkpoint_folder(pretrained_name_or_path, revision, cache_dir, local_files_only)
        if config is None:
            config = checkpoint_config(folder, EmbodiedConfig)
        artifact_path = folder / config.artifact_file
        artifact = PolicyArtifact.from_bytes(artifact_path.read_bytes(), str(artifact_path))
        policy = cls(config, artifact)
        policy.to(config.device or "cpu")
        policy.eval()
        return policy

    def _save_pretrained(self, save_directory: Path) -> None:
        if self.artifact is None:
            raise ValueError("this EmbodiedPolicy holds no artifact to save")
        self.config._save_pretrained(save_directory)
        (Path(save_directory) / self.config.artifact_file).write_bytes(self.artifact.to_bytes())

    def get_optim_params(self) -> Any:
        return self.parameters()

    def reset(self) -> None:
        self._queue.clear()

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict | None]:
        raise NotImplementedError("an exported embodied policy runs inference only; fine-tune it with embodied")

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        """``[B, H, A]`` for ``batch["observation.state"] [B, D]``."""
        if self.network is None:
            raise ValueError("this EmbodiedPolicy holds no network (load it with from_pretrained)")
        out = self.network(batch["observation.state"].float())
        return out if out.dim() == 3 else out.unsqueeze(1)

    @torch.no_grad()
    def select_action(self, batch: dict[str, Tensor], **kwargs: Any) -> Tensor:
        """``[B, A]``: the next action of the current plan (a new plan every ``n_action_steps``)."""
        if not self._queue:
            chunk = self.predict_action_chunk(batch)[:, : self.config.n_action_steps]
            self._queue.extend(chunk.transpose(0, 1))
        return self._queue.popleft()
