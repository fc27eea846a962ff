"""The whole quad-hover step as one pure function, so ``torch.compile`` fuses all of it.

The compiled :func:`~embodied.tasks.quadrotor.hover_core.step_core` covers physics, observation,
reward and termination; around it the eager step spent most of its time: the observation
noise draw, the yaw-symmetry relabelling, the parameter-derived physics inputs, and the reset
of ended episodes (index ops per state component). :func:`fused_step` does all of them in
the same graph:

* noise from :func:`embodied.sim.counter_normal.counter_normal` (a counter-based generator;
  the eager step keeps ``torch.randn`` on the env's generator, faster there);
* resets without data-dependent shapes: env ``i`` that ended takes row
  ``cursor + (number of ended envs up to i) - 1`` of the pre-drawn initial-condition pool, the
  same row the eager step's ``nonzero`` order gives it, and every per-env tensor is selected
  with ``torch.where``;
* physics inputs computed from the parameter scales and disturbances in the graph
  (``sim.quadrotor.derived_params``, as the simulator computes them).

It is written on ``[N]`` rows (one tensor per component, struct of arrays) where the eager
step works on ``[N, K]`` tensors: inductor then fuses the step into loops over envs that it
vectorizes. The same step built from ``step_core`` and ``observation`` on ``[N, K]`` tensors
inside the graph ran at less than half the speed, and so did the yaw relabelling and critic
inputs alone on ``[N, K]`` tensors (docs/benchmarks/fused-step.md). So what does not depend on
the layout comes from the functions the eager step calls
(physics inputs, heading, reward terms, episode ends, success, the non-finite guard), and the
rest has a row form here (:func:`observe_rows`, :func:`static_rows`, :func:`flip_rows`, the
action relabelling), held to the eager step's results by ``tests/test_quad_hover_fused.py``.

``QuadHover`` uses it when its simulator compiles (``sim.compile``). The reality-gap models
(``tasks/quadrotor/gaps.py``) run inside it too, all but body drag and ground effect: their
per-episode draws come from the same pool rows as the start (columns ``gaps.DRAW``), their
delay buffers are inputs and outputs, and their noise is rows 18-26 of the step's counter
stream. With the same pool and zero observation and gap noise it gives the eager step's
results (``tests/test_quad_hover_fused.py``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

import embodied.sim as sim_package
from embodied.sim.counter_normal import counter_normal
from embodied.sim.quadrotor import (
    ANG_VEL,
    LIN_VEL,
    QUAT,
    RPM,
    Tables,
    action_to_rpm_cmd,
    bilinear_rows,
    derived_params,
    rk4_inputs,
    rk4_rows,
)
from embodied.tasks import compiled_step_cache
from embodied.tasks.quadrotor.gaps import DRAW
from embodied.tasks.quadrotor.hover_core import (
    POOL,
    CoreConsts,
    ends_in_success,
    episode_ends,
    finite,
    sum_terms,
    terms_of_reward,
)
from embodied.tasks.quadrotor.terms import MOTOR_FLIP
from embodied.tasks.quadrotor.terms import STATE_DIM as POLICY_STATE_DIM

log = logging.getLogger(__name__)


class FusedConsts(NamedTuple):
    """Python constants of :func:`fused_step` (compile specializes on them)."""

    core: CoreConsts
    terms: tuple[Any, ...]
    """The policy observation's terms (``QuadHoverCfg.policy_terms``)."""
    rot_tables: Tables
    dynamics_tables: Tables
    noise_std: tuple[float, ...]
    """σ of each of the 18 noised policy entries; empty when the observation is noise-free."""
    flip_source: tuple[int, ...] | None
    """Yaw-symmetry relabelling of the policy observation (``quadrotor.terms.yaw_symmetry_tables``),
    None without the symmetry."""
    flip_sign: tuple[float, ...]
    flip_select: int
    flip_actions: bool
    """Relabel incoming actions where the last observation was relabelled."""
    disturb_norm: tuple[float, ...]
    """Critic scaling of force (3) and torque (3) disturbances."""
    success_radius_m: float
    cos_success_tilt: float
    gaps: bool = False
    """Reality-gap models on (``tasks/quadrotor/gaps.py``): the step reads and returns their state."""
    gap_noise_std: tuple[float, ...] = ()
    """σ of the gap models' position, velocity and gyro noise; empty when all are zero."""


Rows = list[torch.Tensor]
"""One ``[N]`` tensor per component (struct of arrays), as ``sim.quadrotor.rk4_rows`` uses."""


def rows_of(x: torch.Tensor) -> Rows:
    """``[N, K]`` -> its K columns as ``[N]`` tensors (views)."""
    return list(x.t().unbind(0))


def stacked(rows: Rows) -> torch.Tensor:
    """K ``[N]`` rows -> ``[N, K]`` column-major (each row contiguous: no transpose in the kernel)."""
    return torch.stack(rows, dim=0).t()


class Observed(NamedTuple):
    """What one state gives: the observation rows and the quantities rewards and success read."""

    policy: Rows
    critic: Rows
    pos_err_h: Rows
    rot_hb: Rows


def to_heading_rows(vec_w: Rows, heading: Rows) -> Rows:
    """``quadrotor.terms.vec_w_to_h`` on rows: three world rows -> heading frame (``heading``: cos, sin)."""
    c, sn = heading
    return [c * vec_w[0] + sn * vec_w[1], c * vec_w[1] - sn * vec_w[0], vec_w[2]]


def observe_rows(
    s: Rows,
    heading: Rows,
    hist: Rows,
    integral: Rows,
    static: Rows,
    noise: Rows | None,
    setpoint_w: torch.Tensor,
    k: FusedConsts,
) -> Observed:
    """``quadrotor.hover_core.observation`` on rows (the module docstring says why a second
    form): state ``s`` (17), ``heading`` (cos, sin), action history (4H), position-error
    integral (3), critic static inputs (12) and noise (18); ``tests/test_quad_hover_fused.py``
    holds the two to the same observations."""
    c, sn = heading
    pos_err_h = to_heading_rows([s[i] - setpoint_w[i] for i in range(3)], heading)
    q = s[QUAT.start : QUAT.stop]
    rot_wb = bilinear_rows(q, q, *k.rot_tables)
    rot_hb = [c * rot_wb[j] + sn * rot_wb[3 + j] for j in range(3)]
    rot_hb += [c * rot_wb[3 + j] - sn * rot_wb[j] for j in range(3)] + rot_wb[6:9]
    clean = {
        "pos_err_h": pos_err_h,
        "rot_hb": rot_hb,
        "lin_vel_h": to_heading_rows(s[LIN_VEL.start : LIN_VEL.stop], heading),
        "ang_vel_b": s[ANG_VEL.start : ANG_VEL.stop],
        "pos_err_int_h": integral,
        "prev_actions": hist,
    }
    noised = [row for t in k.terms if t.noise_group is not None for row in clean[t.name]]
    if noise is not None:
        noised = [row + eps for row, eps in zip(noised, noise)]
    policy = noised + [row for t in k.terms if t.noise_group is None for row in clean[t.name]]
    clean_state = [row for t in k.terms if t.noise_group is not None for row in clean[t.name]]
    extra = [row for t in k.terms if t.name == "pos_err_int_h" for row in integral]
    rpm_norm = [row * (1.0 / k.core.rpm_per_action) - 1.0 for row in s[RPM.start : RPM.stop]]
    return Observed(policy, clean_state + extra + rpm_norm + static, pos_err_h, rot_hb)


def static_rows(scales: Rows, force_w: Rows, torque_b: Rows, k: FusedConsts) -> Rows:
    """``quadrotor.hover_core.critic_static_inputs`` on rows: parameter scales - 1, normalized
    disturbances (12 rows)."""
    return [x - 1.0 for x in scales] + [x * norm for x, norm in zip(force_w + torque_b, k.disturb_norm)]


def flip_rows(policy: Rows, k: FusedConsts) -> tuple[Rows, torch.Tensor]:
    """``quadrotor.terms.yaw_flip_obs`` on rows: (canonical rows, flip ``[N]`` bool)."""
    assert k.flip_source is not None
    flip = policy[k.flip_select] < 0.0
    canonical = [
        torch.where(flip, policy[src] * sign if sign != 1.0 else policy[src], row)
        for row, src, sign in zip(policy, k.flip_source, k.flip_sign)
    ]
    return canonical, flip


def delayed_rows(buffer: list[Rows], delay: torch.Tensor) -> Rows:
    """Each env's entry ``delay [N]`` (long) steps back in ``buffer`` (newest first): a chain of
    selects, as the buffers are a few entries deep."""
    picked = buffer[0]
    for steps_back in range(1, len(buffer)):
        picked = [torch.where(delay == steps_back, old, new) for old, new in zip(buffer[steps_back], picked)]
    return picked


def seen_rows(state: Rows, pos_bias: Rows, gyro_bias: Rows, eps: Rows | None, k: FusedConsts) -> Rows:
    """``QuadGaps.view``'s estimator errors on the 18 state rows: position bias (and noise),
    velocity noise, gyro bias (and noise); ``eps`` 9 standard normal rows or None."""
    seen = list(state)
    for i in range(3):
        seen[i] = seen[i] + pos_bias[i]
        seen[15 + i] = seen[15 + i] + gyro_bias[i]
    if eps is not None:
        pos_std, vel_std, gyro_std = k.gap_noise_std
        for i in range(3):
            seen[i] = seen[i] + eps[i] * pos_std
            seen[12 + i] = seen[12 + i] + eps[3 + i] * vel_std
            seen[15 + i] = seen[15 + i] + eps[6 + i] * gyro_std
    return seen


def fused_step(
    action: torch.Tensor,
    yaw_flip: torch.Tensor,
    state: torch.Tensor,
    param_scales: torch.Tensor,
    force_w: torch.Tensor,
    torque_b: torch.Tensor,
    action_hist: torch.Tensor,
    episode_step: torch.Tensor,
    pos_err_int_h: torch.Tensor,
    yaw_sp_rad: torch.Tensor,
    heading: torch.Tensor,
    setpoint_w: torch.Tensor,
    nominal: torch.Tensor,
    gravity_w: torch.Tensor,
    pool: torch.Tensor,
    cursor: torch.Tensor,
    noise_counter: torch.Tensor,
    noise_key: torch.Tensor,
    obs_delay: torch.Tensor,
    motor_delay: torch.Tensor,
    rpm_scale: torch.Tensor,
    sag_per_step: torch.Tensor,
    pos_bias: torch.Tensor,
    gyro_bias: torch.Tensor,
    state_buf: torch.Tensor,
    action_buf: torch.Tensor,
    k: FusedConsts,
) -> dict[str, Any]:
    """One full quad-hover step for ``N`` envs, auto-reset included; pure.

    Every per-env quantity is an ``[N]`` row (struct of arrays): inductor then fuses the step
    into loops over envs that it vectorizes, where ``[N, 3]``-shaped intermediates gave it short
    inner loops it could not (the same reason ``sim.quadrotor.rk4_rows`` exists).

    Args:
        action: ``[N, 4]`` policy actions (relabelled labels where ``yaw_flip [N, 1]``).
        state, param_scales, force_w, torque_b: the simulator's ``[N, 17]``, ``[N, 6]``, ``[N, 3]``, ``[N, 3]``.
        action_hist ``[N, 4H]``, episode_step ``[N]`` long, pos_err_int_h ``[N, 3]``,
        yaw_sp_rad ``[N]``, heading ``[N, 2]``: the task's per-env state; setpoint_w ``[3]``.
        nominal ``[6]``, gravity_w ``[3]``: the simulator's (``Quadrotor``).
        pool: ``[P, POOL.width]`` initial-condition rows (columns ``quadrotor.hover_core.POOL``);
            ``cursor`` (0-dim long) the next unused one.
            The caller keeps at least ``N`` rows after the cursor.
        noise_counter, noise_key: 0-dim int64 state of the observation noise stream.
        obs_delay ... action_buf: ``QuadGaps``' state under its names (``[N]`` long delays,
            ``[N, 4]``, ``[N, 1]``, ``[N, 3]``, ``[N, 3]``, ``[D + 1, N, 18]``, ``[M + 1, N, 4]``);
            read only with ``k.gaps`` (empty tensors otherwise). The pool then carries each
            row's gap draws after its ``POOL.width`` columns (``gaps.DRAW``).
    Returns:
        The new per-env state under the same names (``[N, K]`` column-major), ``cursor`` and
        ``noise_counter`` advanced, ``policy`` / ``critic`` (observation after the resets),
        ``final_policy`` / ``final_critic`` (before them, non-finite entries zeroed), ``terms``
        (dict of ``[N]``), ``reward``, ``terminated``, ``truncated``, ``success`` (``[N]``) and
        ``yaw_flip`` (``[N, 1]``), and ``gaps``: the gap models' new state under the input names
        (empty without them).
    """
    c = k.core
    n = state.shape[0]
    sent = [row.clamp(-1.0, 1.0) for row in rows_of(action)]  # rows: [N, 4] ops would not vectorize
    if k.flip_source is not None and k.flip_actions:
        # ``quadrotor.terms.yaw_flip_action`` on rows; history and action cost see the motors' labels.
        sent = [torch.where(yaw_flip[:, 0], sent[src], row) for row, src in zip(sent, MOTOR_FLIP)]
    motor, action_rows = sent, []
    if k.gaps:  # the motors get the command motor_delay steps old (QuadGaps.motor_action)
        action_rows = [sent] + [rows_of(a) for a in action_buf[:-1].unbind(0)]
        motor = delayed_rows(action_rows, motor_delay)
    rpm_cmd = action_to_rpm_cmd(stacked(motor), c.max_thrust_n, c.min_thrust_n, c.inv_thrust_coef, c.max_rpm)
    if k.gaps:  # thrust mismatch (scale) and battery sag (cap), as QuadGaps.rpm_limits
        available = (1.0 - sag_per_step[:, 0] * episode_step.to(torch.float32)).clamp(min=0.0)
        rpm_cmd = torch.minimum(rpm_cmd * rpm_scale, (torch.sqrt(available) * c.max_rpm).unsqueeze(1))
    per_env = rk4_inputs(derived_params(param_scales, nominal), gravity_w, force_w, torque_b)
    s = rk4_rows(
        rows_of(state), rows_of(rpm_cmd), tuple(rows_of(x) for x in per_env), *k.dynamics_tables, c.dt_s, c.substeps
    )
    steps = episode_step + 1
    hist = rows_of(action_hist)
    if c.history > 0:
        hist = sent + hist[: 4 * (c.history - 1)]
    heading_r = rows_of(heading)
    err_h = to_heading_rows([s[i] - setpoint_w[i] for i in range(3)], heading_r)
    integral = rows_of(pos_err_int_h)
    if c.integral:  # decay * I + dt * e, then the clamp: the order the firmware repeats
        integral = [
            (i * c.integral_decay + e * c.dt_s).clamp(-c.integral_limit_ms, c.integral_limit_ms)
            for i, e in zip(integral, err_h)
        ]
    noise, gap_eps = None, None
    if k.noise_std or k.gap_noise_std:  # rows 0-17 the observation noise, 18-26 the gap models'
        eps = counter_normal(noise_counter, noise_key, POLICY_STATE_DIM + (9 if k.gap_noise_std else 0), n)
        if k.noise_std:
            noise = [eps[i] * std for i, std in enumerate(k.noise_std)]
        if k.gap_noise_std:
            gap_eps = list(eps[POLICY_STATE_DIM:].unbind(0))
    scales, force, torque = rows_of(param_scales), rows_of(force_w), rows_of(torque_b)
    final = observe_rows(s, heading_r, hist, integral, static_rows(scales, force, torque, k), noise, setpoint_w, k)
    final_seen = final.policy
    state_rows: list[Rows] = []
    if k.gaps:  # push the new state terms, then the policy sees its env's delayed ones (QuadGaps.view)
        state_rows = [final.policy[:POLICY_STATE_DIM]] + [rows_of(x) for x in state_buf[:-1].unbind(0)]
        seen = seen_rows(delayed_rows(state_rows, obs_delay), rows_of(pos_bias), rows_of(gyro_bias), gap_eps, k)
        final_seen = seen + final.policy[POLICY_STATE_DIM:]
    rot = final.rot_hb
    dist_sq = err_h[0] * err_h[0] + err_h[1] * err_h[1] + err_h[2] * err_h[2]
    inside = functools.reduce(torch.logical_and, [e.abs() <= c.position_bound_m for e in err_h])
    terminated, truncated = episode_ends(inside, steps, c)
    vel = s[LIN_VEL.start : LIN_VEL.stop]
    terms = terms_of_reward(
        dist_sq,
        rot,
        vel[0] * vel[0] + vel[1] * vel[1] + vel[2] * vel[2],
        functools.reduce(torch.add, [(a - c.hover_action) ** 2 for a in sent]),
        terminated,
        c,
    )
    success = ends_in_success(truncated, dist_sq, rot[8], k.success_radius_m, k.cos_success_tilt)
    # A diverged env must not poison the learner's batch (finite values pass unchanged).
    terms = {name: finite(value) for name, value in terms.items()}
    reward = sum_terms(terms)
    final_policy, final_critic = [finite(r) for r in final_seen], [finite(r) for r in final.critic]

    done = terminated | truncated
    rank = torch.cumsum(done.to(torch.long), dim=0) - 1
    picked = pool[(cursor + rank).clamp(0, pool.shape[0] - 1)]
    init = rows_of(picked)

    def restart(fresh: Rows, old: Rows) -> Rows:
        return [torch.where(done, f, o) for f, o in zip(fresh, old)]

    new_s = restart(init[POOL.state], s)
    new_scales = restart(init[POOL.scales], scales)
    new_force, new_torque = restart(init[POOL.force_w], force), restart(init[POOL.torque_b], torque)
    new_hist = [torch.where(done, c.hover_action, row) for row in hist]
    new_integral = [torch.where(done, 0.0, row) for row in integral]
    new_yaw = torch.where(done, init[POOL.yaw_sp], yaw_sp_rad)
    new_heading = restart(init[POOL.heading], heading_r)
    # The step's noise is reused: rows of envs that did not end equal the final observation.
    after = observe_rows(
        new_s,
        new_heading,
        new_hist,
        new_integral,
        static_rows(new_scales, new_force, new_torque, k),
        noise,
        setpoint_w,
        k,
    )
    policy, new_flip = after.policy, yaw_flip[:, 0]
    new_gaps: dict[str, torch.Tensor] = {}
    if k.gaps:
        draws = init[POOL.width :]
        new_pos_bias = restart(draws[DRAW.pos_bias], rows_of(pos_bias))
        new_gyro_bias = restart(draws[DRAW.gyro_bias], rows_of(gyro_bias))
        # A restarted env's buffers hold its fresh noise-free state and the hover command
        # (QuadGaps.refill), so it sees that state with its new biases, whatever its delay.
        fresh = after.critic[:POLICY_STATE_DIM]
        fresh_seen = seen_rows(fresh, new_pos_bias, new_gyro_bias, gap_eps, k)
        policy = restart(fresh_seen, final_seen[:POLICY_STATE_DIM]) + after.policy[POLICY_STATE_DIM:]
        # Row-major, as QuadGaps holds them: the next call then has this call's signature.
        new_gaps = {
            "obs_delay": torch.where(done, draws[DRAW.obs_delay].to(torch.long), obs_delay),
            "motor_delay": torch.where(done, draws[DRAW.motor_delay].to(torch.long), motor_delay),
            "rpm_scale": torch.stack(restart(draws[DRAW.rpm_scale], rows_of(rpm_scale)), dim=1),
            "sag_per_step": torch.where(done, draws[DRAW.sag_per_step.start], sag_per_step[:, 0]).unsqueeze(1),
            "pos_bias": torch.stack(new_pos_bias, dim=1),
            "gyro_bias": torch.stack(new_gyro_bias, dim=1),
            "state_buf": torch.stack([torch.stack(restart(fresh, rows), dim=1) for rows in state_rows]),
            "action_buf": torch.stack(
                [torch.stack([torch.where(done, c.hover_action, a) for a in rows], dim=1) for rows in action_rows]
            ),
        }
    if k.flip_source is not None:
        final_policy, _ = flip_rows(final_policy, k)
        policy, new_flip = flip_rows(policy, k)
    return {
        "state": stacked(new_s),
        "param_scales": stacked(new_scales),
        "force_w": stacked(new_force),
        "torque_b": stacked(new_torque),
        "action_hist": stacked(new_hist) if new_hist else action_hist,
        "episode_step": torch.where(done, 0, steps),
        "pos_err_int_h": stacked(new_integral),
        "yaw_sp_rad": new_yaw,
        "heading": stacked(new_heading),
        "yaw_flip": new_flip.unsqueeze(1),
        "cursor": cursor + done.sum(),
        "noise_counter": noise_counter + 1,
        "policy": stacked(policy),
        "critic": stacked(after.critic),
        "final_policy": stacked(final_policy),
        "final_critic": stacked(final_critic),
        "terms": terms,
        "reward": reward,
        "terminated": terminated,
        "truncated": truncated,
        "success": success,
        "gaps": new_gaps,
    }


CPU_OPTIONS: dict[str, Any] = {"aggressive_fusion": True, "max_fusion_size": 1024, "cpp_wrapper": True}
"""Inductor options for the CPU step. Fusing aggressively and into larger groups puts the step's
few hundred row computations into fewer parallel loops (each loop ends at a thread barrier),
and the C++ wrapper removes the Python call sequence of the generated module; the cold compile
stays about half a minute (docs/benchmarks/fused-step.md)."""


SOURCE_FOLDERS = (Path(__file__).parent, Path(sim_package.__file__).parent)
"""Package folders whose sources the compiled step is built from (``tasks``, ``sim``): an edit to
any of their modules keys a new cache entry."""


Signature = tuple[tuple[torch.dtype, torch.Size, tuple[int, ...]], ...]
"""dtype, shape and strides of each tensor argument of :func:`fused_step`."""


def signature(args: tuple[Any, ...]) -> Signature:
    """The :data:`Signature` of ``args`` (the tensors among them)."""
    return tuple((a.dtype, a.shape, a.stride()) for a in args if isinstance(a, torch.Tensor))


def no_guards(entries: Sequence[Any]) -> list[bool]:
    """Dynamo guard filter that keeps none (:class:`CompiledFusedStep` matches its inputs itself)."""
    return [False] * len(entries)


class CompiledFusedStep:
    """:func:`fused_step` compiled for one device type, called without Dynamo's per-call work
    where that is possible (CPU).

    A ``torch.compile``d function evaluates Dynamo's guards on every call (~570 here, most on
    the constants ``k``) and enters through Dynamo's frame hooks, a fixed cost per call
    (docs/benchmarks/fused-step.md, "Compiled ahead"). On CPU the step is instead compiled
    ahead (``aot_compile`` of the same ``torch.compile``: same graph, same inductor options) once
    per constants object and tensor :data:`Signature`, and a call only looks that pair up (the
    caller passes the same ``k`` object every step; a new object, dtype, shape or stride compiles
    again, or reuses an entry compiled for equal ones) before calling the compiled code, which
    itself asserts every input's shape and strides.

    An ahead-compiled graph carries a fresh name, so torch's on-disk caches never hit: the
    compiled step is saved in ``cache_dir`` instead (:mod:`embodied.tasks.compiled_step_cache`,
    keyed on the constants, signature, sources, torch and the host ISA) and a later process
    loads it (~3 s) instead of compiling cold (~25-35 s at 4,096 envs). ``cache_dir`` None (or
    torch's caches turned off) compiles every process. Where ahead-of-time compilation is not
    available (another torch, accelerators) it calls the ``torch.compile``d function.
    """

    def __init__(self, device_type: str, cache_dir: Path | None = None) -> None:
        """``cache_dir``: where compiled steps are saved and loaded; default beside torch's
        inductor cache (:func:`embodied.tasks.compiled_step_cache.default_cache_dir`)."""
        self.device_type = device_type
        self.cache_dir = cache_dir if cache_dir is not None else compiled_step_cache.default_cache_dir()
        self.loaded = 0
        """How many compiled steps came from ``cache_dir`` (the rest were compiled here)."""
        self.options = CPU_OPTIONS if device_type == "cpu" else None
        self.compiled = torch.compile(fused_step, fullgraph=True, dynamic=False, options=self.options)
        self.ahead = device_type == "cpu" and hasattr(self.compiled, "aot_compile")
        self._by_id: dict[int, tuple[FusedConsts, dict[Signature, Callable[..., dict[str, Any]]]]] = {}
        """``id(k)`` -> (``k``, kept so the id stays its own; signature -> compiled step)."""
        self._by_value: dict[tuple[FusedConsts, Signature], Callable[..., dict[str, Any]]] = {}

    def __call__(self, *args: Any) -> dict[str, Any]:
        """:func:`fused_step` on the same arguments (``k`` last)."""
        if not self.ahead:
            return self.compiled(*args)
        k, tensors = args[-1], args[:-1]
        entry = self._by_id.get(id(k))
        sig = signature(tensors)
        step = None if entry is None or entry[0] is not k else entry[1].get(sig)
        if step is None:
            step = self._prepare(k, sig, tensors)
        return step(*tensors, k=k)

    def _prepare(self, k: FusedConsts, sig: Signature, tensors: tuple[Any, ...]) -> Callable[..., dict[str, Any]]:
        """The step compiled ahead for ``k`` and ``sig`` (an equal earlier entry, or a new one)."""
        step = self._by_value.get((k, sig))
        if step is None:
            try:
                step = self._compile_ahead(k, sig, tensors)
            except Exception as err:  # an API of torch's that may move: keep stepping, through Dynamo
                log.warning("fused step: ahead-of-time compile failed (%s); using torch.compile", err)
                self.ahead = False
                return self.compiled
            self._by_value[(k, sig)] = step
        entry = self._by_id.get(id(k))
        if entry is None or entry[0] is not k:
            entry = self._by_id[id(k)] = (k, {})
        entry[1][sig] = step
        return step

    def _compile_ahead(self, k: FusedConsts, sig: Signature, tensors: tuple[Any, ...]) -> Callable[..., dict[str, Any]]:
        """``aot_compile`` of :func:`fused_step` for these inputs, or the same loaded from
        ``cache_dir``; its guards are dropped (this class matches ``k`` and the signature
        itself), so the call is the compiled code alone."""
        path = None
        if self.cache_dir is not None:
            key = compiled_step_cache.cache_key(("fused_step", self.device_type, self.options, k, sig), SOURCE_FOLDERS)
            path = self.cache_dir / f"quad_hover_fused_{key}.bin"
            loaded = compiled_step_cache.load(path, fused_step.__globals__)
            if loaded is not None:
                self.loaded += 1
                return loaded
        log.info("compiling the fused quad-hover step (cold: about a minute on 2 cores; saved for later runs)")
        options = {**(self.options or {}), "guard_filter_fn": no_guards}
        compiled: Any = torch.compile(fused_step, fullgraph=True, dynamic=False, options=options)
        ahead = compiled.aot_compile((tensors, {"k": k}))
        ahead.disable_guard_check()
        if path is not None:
            compiled_step_cache.save(ahead, path)
        step: Callable[..., dict[str, Any]] = ahead
        return step


@functools.cache
def compiled_fused_step(device_type: str) -> Callable[..., dict[str, Any]]:
    """:func:`fused_step` compiled for one device type (:class:`CompiledFusedStep`), once per
    process (static shapes); CPU with :data:`CPU_OPTIONS`, accelerators with inductor's defaults."""
    return CompiledFusedStep(device_type)
