"""Every quadrotor observation term against its second implementations, term by term.

The single definition of a term is its entry in ``tasks/quadrotor/terms.py`` (name, size, units,
frame, noise group) and the eager observation the tasks compute from it. Four other places
assemble the same terms, kept for speed or for a runtime without torch:

=============  ==========================================  ===================================
counterpart    where                                       checked here
=============  ==========================================  ===================================
fused rows     ``tasks/quadrotor/hover_fused.py`` observe_rows   values, hover terms (the tracking
                                                           task has no fused step)
numpy          ``embodied/verify/observation.py``          values, every term
C              ``firmware/common/quad_ctrl.c``             the term's ``POLICY_OBS_*`` slot;
                                                           values in tests/test_firmware.py and
                                                           tests/test_quad_track_firmware.py
ROS 2          ``real/robots/crazyflie_*.yaml``            the config declares the term; values
                                                           in tests/test_real_observation.py
=============  ==========================================  ===================================

A new term added to a task without one of its counterparts fails here with the term's name and
the file to edit (``test_a_term_without_counterparts_is_named`` shows it on a made-up term).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from embodied.io_spec import ObsTerm
from embodied.sim.quadrotor import quat_to_rot
from embodied.tasks.quadrotor.hover import QuadHover, QuadHoverCfg
from embodied.tasks.quadrotor.hover_fused import observe_rows, rows_of
from embodied.tasks.quadrotor.terms import ALL_TERMS
from embodied.tasks.quadrotor.track import QuadTrack, QuadTrackCfg
from embodied.verify.observation import ObservationLayout, state_terms

ROOT = Path(__file__).resolve().parents[1]
QUAD_CTRL_C = ROOT / "firmware" / "common" / "quad_ctrl.c"
ROBOT_CONFIGS = {
    "hover": ROOT / "real" / "robots" / "crazyflie_sim.yaml",
    "track": ROOT / "real" / "robots" / "crazyflie_track.yaml",
}
NUM_ENVS = 16
ATOL = 2e-6
"""float32 against numpy's float64 rotations of the same state: a few ulp of the largest entry."""

Values = dict[str, np.ndarray]


def _env(kind: str) -> QuadHover:
    """A task of ``kind`` with every optional term on, at a random state away from reset."""
    env: QuadHover
    if kind == "hover":
        cfg = QuadHoverCfg(pos_err_integral=True, action_history=2, yaw_symmetry=False)
        env = QuadHover(cfg, NUM_ENVS, torch.device("cpu"), seed=3)
    else:
        track_cfg = QuadTrackCfg(pos_err_integral=True, action_history=2, yaw_symmetry=False)
        env = QuadTrack(track_cfg, NUM_ENVS, torch.device("cpu"), seed=3)
    env.reset()
    gen = torch.Generator().manual_seed(7)
    quat = torch.randn(NUM_ENVS, 4, generator=gen)
    env.set_physical_state(
        position_w=torch.rand(NUM_ENVS, 3, generator=gen) * 0.6 + torch.tensor(env.cfg.setpoint_w) - 0.3,
        quat_wb=quat / quat.norm(dim=1, keepdim=True),
        lin_vel_w=torch.randn(NUM_ENVS, 3, generator=gen),
        ang_vel_b=torch.randn(NUM_ENVS, 3, generator=gen) * 3.0,
        episode_step=17,
        action_hist=torch.rand(NUM_ENVS, env.action_hist.shape[1], generator=gen) * 2.0 - 1.0,
        pos_err_int_h=torch.randn(NUM_ENVS, 3, generator=gen) * 0.1,
        yaw_sp_rad=torch.rand(NUM_ENVS, generator=gen) * 6.0 - 3.0,
    )
    return env


def _split(terms: tuple[ObsTerm, ...], obs: np.ndarray) -> Values:
    """``obs [N, D]`` -> each term's ``[N, size]`` slice, in ``terms`` order."""
    out: Values = {}
    start = 0
    for term in terms:
        out[term.name] = obs[:, start : start + term.size]
        start += term.size
    return out


def eager(env: QuadHover) -> Values:
    """The definition: the task's own (eager, noise-free) observation."""
    return _split(env.cfg.policy_terms, env.observe(noise=False)["policy"].numpy())


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def numpy_verify(env: QuadHover) -> Values:
    """``embodied verify``'s numpy assembly from the raw state and ``policy_io.json``."""
    state = env.physical_state()
    setpoint_w, vel_sp_w, acc_sp_w = env._setpoint_at(env.episode_step)
    terms = state_terms(
        pos_err_w=_f64(state["position_w"] - setpoint_w),
        rot_wb=_f64(quat_to_rot(state["quat_wb"])).reshape(-1, 3, 3),
        lin_vel_w=_f64(state["lin_vel_w"]),
        ang_vel_b=_f64(state["ang_vel_b"]),
        yaw_sp_rad=_f64(state["yaw_sp_rad"]),
        vel_sp_w=None if vel_sp_w is None else _f64(vel_sp_w),
        acc_sp_w=None if acc_sp_w is None else _f64(acc_sp_w),
    )
    layout = ObservationLayout(env.io_spec(), "policy_io.json of the test task")
    obs = layout.assemble(terms, _f64(state["pos_err_int_h"]), _f64(env.action_hist), rng=None)
    return _split(env.cfg.policy_terms, obs)


def fused_rows(env: QuadHover) -> Values:
    """The compiled step's row form, run eagerly on the same state."""
    consts = env._make_fused_consts(flip_actions=False)
    setpoint_w, _, _ = env._setpoint_at(env.episode_step)
    observed = observe_rows(
        rows_of(env.sim.state),
        rows_of(env.heading),
        rows_of(env.action_hist),
        rows_of(env.pos_err_int_h),
        rows_of(env._critic_static),
        None,
        setpoint_w,
        consts,
    )
    return _split(env.cfg.policy_terms, torch.stack(observed.policy, dim=1).numpy())


COMPUTED: dict[str, tuple[Callable[[QuadHover], Values], str, tuple[str, ...]]] = {
    "numpy": (numpy_verify, "embodied/verify/observation.py (state_terms, TERM_SIZES)", ("hover", "track")),
    "fused": (fused_rows, "tasks/quadrotor/hover_fused.py (observe_rows)", ("hover",)),
}
"""Counterparts compared by value: (builder, file to edit, task kinds it serves)."""


def declared_in_c(term: ObsTerm) -> str | None:
    """None when quad_ctrl.c fills ``term``'s slot, else what is missing."""
    macro = f"POLICY_OBS_{term.name.upper()}_START"
    if macro in QUAD_CTRL_C.read_text():
        return None
    return f"term {term.name!r} has no C counterpart: firmware/common/quad_ctrl.c never writes {macro}"


def declared_in_robot_config(term: ObsTerm, kind: str) -> str | None:
    """None when the ROS 2 robot config of ``kind`` builds ``term``, else what is missing."""
    path = ROBOT_CONFIGS[kind]
    observation = yaml.safe_load(path.read_text())["observation"]
    if term.name in observation:
        return None
    return f"term {term.name!r} has no ROS 2 counterpart: {path.relative_to(ROOT)} has no observation entry for it"


def value_mismatches(
    kind: str, terms: tuple[ObsTerm, ...], computed: dict[str, Values], reference: Values
) -> list[str]:
    """One line per term a counterpart lacks or computes differently from ``reference``."""
    problems: list[str] = []
    for name, (_, where, kinds) in COMPUTED.items():
        if kind not in kinds:
            continue
        values = computed[name]
        for term in terms:
            if term.name not in values:
                problems.append(f"term {term.name!r} has no {name} counterpart: add it in {where}")
                continue
            err = float(np.max(np.abs(values[term.name] - reference[term.name])))
            if not err <= ATOL:
                problems.append(f"term {term.name!r}: the {name} counterpart ({where}) differs by {err:.3g}")
    return problems


def _compute_all(env: QuadHover, kind: str) -> dict[str, Values]:
    out: dict[str, Values] = {}
    for name, (build, _, kinds) in COMPUTED.items():
        if kind in kinds:
            out[name] = build(env)
    return out


@pytest.mark.parametrize("kind", ["hover", "track"])
def test_every_counterpart_computes_every_term_like_the_definition(kind: str) -> None:
    env = _env(kind)
    terms = env.cfg.policy_terms
    assert {t.name for t in terms} <= {t.name for t in ALL_TERMS}, "a task emits a term missing from ALL_TERMS"
    problems = value_mismatches(kind, terms, _compute_all(env, kind), eager(env))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("term", ALL_TERMS, ids=lambda t: t.name)
def test_every_term_is_declared_by_the_firmware_and_the_robot_configs(term: ObsTerm) -> None:
    kinds = [k for k in ("hover", "track") if term.name in {t.name for t in _terms_of(k)}]
    problems = [declared_in_c(term)] + [declared_in_robot_config(term, k) for k in kinds]
    missing = [p for p in problems if p is not None]
    assert not missing, "\n".join(missing)


def _terms_of(kind: str) -> tuple[ObsTerm, ...]:
    cfg = (
        QuadHoverCfg(pos_err_integral=True, action_history=1)
        if kind == "hover"
        else QuadTrackCfg(pos_err_integral=True, action_history=1)
    )
    return cfg.policy_terms


def test_a_term_without_counterparts_is_named() -> None:
    """A made-up term that only the eager observation has: every counterpart reports it by name."""
    env = _env("hover")
    wind = ObsTerm("wind_h", 3, "m/s", "heading", "made up for this test")
    terms = (*env.cfg.policy_terms, wind)
    reference = eager(env) | {"wind_h": np.zeros((NUM_ENVS, 3), dtype=np.float32)}
    problems = value_mismatches("hover", terms, _compute_all(env, "hover"), reference)
    assert any("'wind_h' has no numpy counterpart" in p for p in problems), problems
    assert any("'wind_h' has no fused counterpart" in p for p in problems), problems
    assert not [p for p in problems if "wind_h" not in p], problems  # the real terms all agree
    assert declared_in_c(wind) is not None and "POLICY_OBS_WIND_H_START" in str(declared_in_c(wind))
    assert "crazyflie_sim.yaml" in str(declared_in_robot_config(wind, "hover"))


def test_a_counterpart_that_computes_a_term_wrongly_is_named() -> None:
    """One counterpart off in one term: the message names that term and that counterpart only."""
    env = _env("hover")
    computed = _compute_all(env, "hover")
    computed["fused"]["lin_vel_h"] = computed["fused"]["lin_vel_h"] * -1.0
    problems = value_mismatches("hover", env.cfg.policy_terms, computed, eager(env))
    assert len(problems) == 1 and "'lin_vel_h': the fused counterpart" in problems[0], problems
