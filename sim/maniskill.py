"""ManiSkill3 backend (``maniskill:<EnvId>``): not available yet; building it raises a named error.

ManiSkill3 (``mani-skill`` 3.0.1 with ``sapien`` 3.0.3) needs a Vulkan device even on its physx
CPU backend with state observations. Debian 12's lavapipe (Mesa 22.3) is too old for SAPIEN;
Mesa >= 23 lavapipe (Debian bookworm-backports) works. Where neither a GPU nor that driver is
present the backend cannot run, so this module only checks and explains: it imports without
ManiSkill, and :class:`ManiSkillVecEnv` raises
:class:`~embodied.errors.MissingDependencyError` saying what is missing (the package, or the
Vulkan driver) and what the adapter still lacks. docs/backends.md has the CI set-up.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass

import torch

from embodied.config import ConfigError
from embodied.errors import MissingDependencyError, import_optional

INSTALL = 'pip install "mani-skill==3.0.1" and a Vulkan driver (Mesa >= 23 lavapipe on CPU; docs/backends.md)'

VULKAN_ICD_GLOBS = ("/usr/share/vulkan/icd.d/*.json", "/etc/vulkan/icd.d/*.json")
"""Where Vulkan loaders look for installable client drivers (any one is a Vulkan device to try)."""


@dataclass(frozen=True)
class ManiSkillCfg:
    """A ManiSkill3 task (the task name ``maniskill:<EnvId>`` sets ``env_id``)."""

    env_id: str = ""
    """ManiSkill3 env id, e.g. ``PickCube-v1``."""

    def __post_init__(self) -> None:
        if not self.env_id:
            raise ConfigError(
                "maniskill: env_id is empty; use the task name maniskill:<EnvId>, e.g. maniskill:PickCube-v1"
            )


def vulkan_drivers() -> list[str]:
    """Vulkan ICD manifest files present on this machine (empty: no Vulkan device)."""
    return sorted(path for pattern in VULKAN_ICD_GLOBS for path in glob.glob(pattern))


class ManiSkillVecEnv:
    """Placeholder: explains what is missing for ``maniskill:<EnvId>`` to run here."""

    def __init__(self, cfg: ManiSkillCfg, num_envs: int, device: torch.device | str, seed: int) -> None:
        import_optional("mani_skill", "the maniskill backend", INSTALL)
        if not vulkan_drivers():
            raise MissingDependencyError(
                "the maniskill backend needs a Vulkan device, also on its CPU physics backend: none is installed "
                f"(no driver manifest in {', '.join(VULKAN_ICD_GLOBS)}); on Debian 12 install Mesa >= 23 "
                "lavapipe from bookworm-backports (docs/backends.md)"
            )
        raise MissingDependencyError(
            f"maniskill:{cfg.env_id}: the ManiSkill3 adapter is not written yet (ManiSkill and a Vulkan driver are "
            "present); docs/backends.md says what it will do"
        )
