"""Roll a policy out on a VecEnv and cut the stream into demonstration episodes.

Shapes: ``N`` = num_envs, ``D``/``A`` = observation/action sizes, ``H``/``W`` = image size.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from embodied.data.demos import Episode
from embodied.env import IMAGE_GROUP, ObsDict, VecEnv

ActFn = Callable[[ObsDict], torch.Tensor]


def collect_episodes(
    env: VecEnv,
    act: ActFn,
    episodes: int,
    noise_std: float = 0.0,
    seed: int = 0,
    record: str = "executed",
    images: bool = False,
) -> list[Episode]:
    """Run ``act`` (``obs -> [N, A]``) until ``episodes`` episodes have ended; return them in end order.

    ``noise_std`` > 0 adds Gaussian noise to every action before it is clipped to [-1, 1]
    and executed. ``record="executed"`` stores the noisy action (demonstrations consistent
    with their outcomes: deliberately imperfect data); ``"intended"`` stores the policy's own
    action while the noise still perturbs the visited states (DART-style data: clean labels on
    the states a cloned policy drifts into). ``images``: also keep the env's camera images
    (``obs["image"]``, ``[H, W, 3]`` uint8 per step) in :attr:`Episode.images`.
    """
    if record not in ("executed", "intended"):
        raise ValueError(f"record must be 'executed' or 'intended', got {record!r}")
    groups = ["policy"]
    if images:
        if IMAGE_GROUP not in env.obs_spec:
            raise ValueError(
                f"this env renders no camera images (observation groups: {', '.join(sorted(env.obs_spec))}); "
                "turn its camera on, e.g. env.backend.camera=NAME"
            )
        groups.append(IMAGE_GROUP)
    gen = torch.Generator().manual_seed(seed)
    obs = env.reset(seed=seed)
    n = env.num_envs
    bufs: list[dict[str, list[np.ndarray]]] = [_empty() for _ in range(n)]
    start = {g: obs[g].cpu().numpy() for g in groups}
    for i in range(n):
        for g in groups:
            bufs[i][g].append(start[g][i])
    out: list[Episode] = []
    while len(out) < episodes:
        intended = act(obs).detach().cpu().float().clamp(-1.0, 1.0)
        action = intended
        if noise_std > 0.0:
            action = (intended + noise_std * torch.randn(intended.shape, generator=gen)).clamp(-1.0, 1.0)
        obs, reward, terminated, truncated, info = env.step(action.to(env.device))
        final = {g: info["final_obs"][g].cpu().numpy() for g in groups}
        nxt = {g: obs[g].cpu().numpy() for g in groups}
        term, trunc = terminated.cpu().numpy(), truncated.cpu().numpy()
        rew = reward.cpu().numpy()
        acts = (action if record == "executed" else intended).numpy()
        for i in range(n):
            b = bufs[i]
            b["act"].append(acts[i])
            b["rew"].append(rew[i])
            b["term"].append(term[i])
            b["trunc"].append(trunc[i])
            ended = bool(term[i] or trunc[i])
            for g in groups:
                b[g].append((final if ended else nxt)[g][i])
            if ended:
                if len(out) < episodes:
                    out.append(_episode(b))
                bufs[i] = _empty()
                for g in groups:
                    bufs[i][g].append(nxt[g][i])
    return out


def _empty() -> dict[str, list[np.ndarray]]:
    return {"policy": [], IMAGE_GROUP: [], "act": [], "rew": [], "term": [], "trunc": []}


def _episode(b: dict[str, list[np.ndarray]]) -> Episode:
    return Episode(
        observations=np.stack(b["policy"]).astype(np.float32),
        images=np.stack(b[IMAGE_GROUP]).astype(np.uint8) if b[IMAGE_GROUP] else None,
        actions=np.stack(b["act"]).astype(np.float32),
        rewards=np.asarray(b["rew"], dtype=np.float64),
        terminations=np.asarray(b["term"], dtype=bool),
        truncations=np.asarray(b["trunc"], dtype=bool),
    )
