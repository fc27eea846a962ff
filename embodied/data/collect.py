"""Roll a policy out on a VecEnv and cut the stream into demonstration episodes.

Shapes: ``N`` = num_envs, ``D``/``A`` = observation/action sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from embodied.data.demos import Episode
from embodied.env import ObsDict, VecEnv

ActFn = Callable[[ObsDict], torch.Tensor]


def collect_episodes(
    env: VecEnv, act: ActFn, episodes: int, noise_std: float = 0.0, seed: int = 0, record: str = "executed"
) -> list[Episode]:
    """Run ``act`` (``obs -> [N, A]``) until ``episodes`` episodes have ended; return them in end order.

    ``noise_std`` > 0 adds Gaussian noise to every action before it is clipped to [-1, 1]
    and executed. ``record="executed"`` stores the noisy action (demonstrations consistent
    with their outcomes: deliberately imperfect data); ``"intended"`` stores the policy's own
    action while the noise still perturbs the visited states (DART-style data: clean labels on
    the states a cloned policy drifts into).
    """
    if record not in ("executed", "intended"):
        raise ValueError(f"record must be 'executed' or 'intended', got {record!r}")
    gen = torch.Generator().manual_seed(seed)
    obs = env.reset(seed=seed)
    n = env.num_envs
    bufs: list[dict[str, list[np.ndarray]]] = [_empty() for _ in range(n)]
    for i in range(n):
        bufs[i]["obs"].append(obs["policy"][i].cpu().numpy())
    out: list[Episode] = []
    while len(out) < episodes:
        intended = act(obs).detach().cpu().float().clamp(-1.0, 1.0)
        action = intended
        if noise_std > 0.0:
            action = (intended + noise_std * torch.randn(intended.shape, generator=gen)).clamp(-1.0, 1.0)
        obs, reward, terminated, truncated, info = env.step(action.to(env.device))
        final = info["final_obs"]["policy"].cpu().numpy()
        nxt = obs["policy"].cpu().numpy()
        term, trunc = terminated.cpu().numpy(), truncated.cpu().numpy()
        rew = reward.cpu().numpy()
        acts = (action if record == "executed" else intended).numpy()
        for i in range(n):
            b = bufs[i]
            b["act"].append(acts[i])
            b["rew"].append(rew[i])
            b["term"].append(term[i])
            b["trunc"].append(trunc[i])
            if term[i] or trunc[i]:
                b["obs"].append(final[i])
                if len(out) < episodes:
                    out.append(_episode(b))
                bufs[i] = _empty()
                bufs[i]["obs"].append(nxt[i])
            else:
                b["obs"].append(nxt[i])
    return out


def _empty() -> dict[str, list[np.ndarray]]:
    return {"obs": [], "act": [], "rew": [], "term": [], "trunc": []}


def _episode(b: dict[str, list[np.ndarray]]) -> Episode:
    return Episode(
        observations=np.stack(b["obs"]).astype(np.float32),
        actions=np.stack(b["act"]).astype(np.float32),
        rewards=np.asarray(b["rew"], dtype=np.float64),
        terminations=np.asarray(b["term"], dtype=bool),
        truncations=np.asarray(b["trunc"], dtype=bool),
    )
