"""``embodied bench sim NAME`` / ``embodied bench env TASK``: env-steps per second."""

from __future__ import annotations

import argparse
import inspect
import json
from typing import Any

from embodied.commands import bench_gpu
from embodied.config import int_in_range

SIM_BENCHES: dict[str, str] = {
    "quadrotor": "embodied.sim.quadrotor_bench:bench_quadrotor",
    "mujoco-ant": "embodied.commands.bench_mujoco:bench_ant",
    "mujoco-halfcheetah": "embodied.commands.bench_mujoco:bench_halfcheetah",
    "mujoco-humanoid": "embodied.commands.bench_mujoco:bench_humanoid",
}
"""Bench name -> ``"module:function"``; the function takes ``(num_envs, device, steps)`` (plus
optional ``compile``/``repeats`` keywords) and returns a dict with at least ``steps_per_s``."""

COMPILE_MIN_ENVS = 64
"""``--compile`` default: compile from this many envs up. The ~15-90 s one-off compile is
excluded from the timed repeats, and below this size eager stepping is launch-bound either way."""

DESCRIPTION = """\
Time simulator throughput in env-steps per second (envs x steps / seconds), the median of
--repeats timed blocks of --steps steps after a warm-up.

  embodied bench sim quadrotor --num-envs 4096          bare physics step (RK4, motors)
  embodied bench sim quadrotor --num-envs 1,64,1024,4096,16384 --json
  embodied bench env quad-hover --num-envs 256 --no-compile
                                                        full task step: physics, observation,
                                                        reward, termination, auto-reset
  embodied bench sim mjwarp:halfcheetah --num-envs 64 --steps 20 --json
                                                        BACKEND:TASK: the task's full step on that
                                                        backend against its raw physics step
                                                        (ratio_vs_raw; target >= 0.9)
  embodied bench sim gym:Pendulum-v1 --num-envs 16    a gymnasium env id (gymnasium:Pendulum-v1 alike)
                                                        against the gymnasium vector env's own step
  embodied bench sim isaaclab:Isaac-Cartpole-Direct --num-envs 64
                                                        Isaac Lab (in .venv-isaaclab) against its own
                                                        env.step
  embodied bench sim maniskill:PushCube-v1 --num-envs 8 --steps 50 --json
                                                        a ManiSkill3 task (physx CPU, one scene per
                                                        env) against ManiSkill's own env.step loop

  embodied bench gpu                                    on a lent CUDA machine: every installed backend's
                                                        throughput at GPU-scale sizes (Isaac Lab from
                                                        .venv-isaaclab), short PPO and FastTD3 trainings
                                                        (go1-flat, humanoid), a 2-GPU NCCL smoke run;
                                                        JSON + markdown report, under 8 minutes
                                                        (docs/backends.md)
  embodied bench gpu --device cpu --quick               the same script at tiny sizes (a smoke check)

--compile/--no-compile: run the physics through torch.compile. Default: compile when it pays,
i.e. from {min_envs} envs up (the one-off compile, reported as warmup_s, is not timed).
With --json each size prints one JSON object (a list for several sizes), key steps_per_s.
"""


NUM_ENVS_FLAG = int_in_range(1, 262_144)
"""One ``--num-envs`` size (the config's ``num_envs`` range)."""


def _parse_sizes(text: str) -> list[int]:
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"--num-envs expects integers separated by commas, got {text!r}")
    return [NUM_ENVS_FLAG(part) for part in parts]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure simulator / task throughput (env-steps per second)",
        description=DESCRIPTION.format(min_envs=COMPILE_MIN_ENVS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "kind",
        choices=("sim", "env", "gpu"),
        help="sim: bare physics bench; env: full step of a task; gpu: every backend and two short trainings on a GPU",
    )
    p.add_argument(
        "name",
        nargs="?",
        help="sim bench name (e.g. quadrotor, or BACKEND:TASK like mjwarp:halfcheetah) or task name (not for gpu)",
    )
    p.add_argument(
        "--num-envs",
        type=_parse_sizes,
        default=[4096],
        metavar="N[,N...]",
        help="batch size(s), e.g. 4096 or 1,64,1024,4096,16384 (default: 4096)",
    )
    p.add_argument("--steps", type=int_in_range(1, 10**7), default=200, help="steps per timed repeat (default: 200)")
    p.add_argument(
        "--repeats", type=int_in_range(1, 10_000), default=5, help="timed repeats; the median is reported (default: 5)"
    )
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cpu; gpu: cuda)")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"torch.compile the physics step (default: on from {COMPILE_MIN_ENVS} envs, where it pays)",
    )
    p.add_argument(
        "--threads",
        type=int_in_range(1, 1024),
        default=None,
        help="torch CPU threads (default: torch's choice; 1 avoids thread-pool stalls on a busy machine)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bench_gpu.add_arguments(p)
    p.set_defaults(func=run)


def _bench_fn(kind: str, name: str) -> Any:
    from embodied.config import ConfigError, unknown_choice_message
    from embodied.registry import _load, task_entry

    if kind == "sim":
        if ":" in name and name not in SIM_BENCHES:
            from embodied.backend_bench import bench_backend_task, parse_target

            parse_target(name)  # a named error before anything is built
            return lambda num_envs, device, steps, **kwargs: bench_backend_task(name, num_envs, device, steps, **kwargs)
        if name not in SIM_BENCHES:
            from embodied.backend_bench import TARGET_FORMS

            raise ConfigError(f"{unknown_choice_message('sim bench', name, SIM_BENCHES)}; or a target: {TARGET_FORMS}")
        return _load(SIM_BENCHES[name])
    task_entry(name)  # validates the task name with closest-match suggestions
    return lambda num_envs, device, steps, **kw: bench_task_env(name, num_envs, device, steps, **kw)


def run(args: argparse.Namespace) -> int:
    from embodied.config import ConfigError
    from embodied.registry import resolve_device

    if args.kind == "gpu":
        if args.name is not None:
            raise ConfigError(f"bench gpu takes no name (got {args.name!r}); --backends narrows what it measures")
        return bench_gpu.run(args)
    if args.name is None:
        raise ConfigError(f"bench {args.kind} needs a name: a sim bench or BACKEND:TASK (sim), a task (env)")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    device = str(resolve_device(args.device or "cpu"))
    fn = _bench_fn(args.kind, args.name)
    try:
        accepted = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        accepted = set()
    takes_kwargs = args.kind == "env" or "kwargs" in accepted
    results: list[dict[str, Any]] = []
    for n in args.num_envs:
        options: dict[str, Any] = {}
        compile_on = args.compile if args.compile is not None else n >= COMPILE_MIN_ENVS
        if takes_kwargs or "compile" in accepted:
            options["compile"] = compile_on
        elif args.compile:
            raise ConfigError(f"bench {args.kind} {args.name} has no compile option")
        if takes_kwargs or "repeats" in accepted:
            options["repeats"] = args.repeats
        result = dict(fn(n, device, args.steps, **options))
        result.setdefault("num_envs", n)
        results.append(result)
        if not args.json:
            compiled = result.get("compile")
            mode = "" if compiled is None else (" compiled" if compiled else " eager")
            extra = f"  (warm-up {result['warmup_s']:.1f} s)" if "warmup_s" in result else ""
            if "steps_per_cpu_s" in result:
                extra += f"  {result['steps_per_cpu_s'] / 1e6:.3f} M per CPU-s"
            print(
                f"{args.kind} {args.name}{mode}  num_envs={n:<6d}  {result['steps_per_s'] / 1e6:8.3f} M steps/s{extra}",
                flush=True,
            )
    if args.json:
        print(json.dumps(results[0] if len(results) == 1 else results, indent=1))
    return 0


def bench_task_env(
    task: str, num_envs: int, device: str = "cpu", steps: int = 200, compile: bool = False, repeats: int = 5
) -> dict[str, Any]:
    """Full ``step`` of a registered task (physics, observation, reward, termination, auto-reset)
    under uniform random actions in [-1, 1]."""
    import torch

    from embodied.config import ConfigError, apply_overrides
    from embodied.registry import make_env, task_cfg
    from embodied.sim.quadrotor_bench import summarize, time_repeats

    cfg = task_cfg(task)
    if compile:
        try:
            cfg = apply_overrides(cfg, {"sim": {"compile": True}}, f"bench env {task}")
        except ConfigError as err:
            raise ConfigError(f"task {task!r} has no sim.compile option; run it with --no-compile ({err})") from err
    dev = torch.device(device)
    env = make_env(task, cfg, num_envs, dev, seed=0)
    gen = torch.Generator(dev).manual_seed(1)
    actions = [torch.rand(num_envs, env.action_dim, generator=gen, device=dev) * 2 - 1 for _ in range(16)]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step(i: int) -> None:
        env.step(actions[i % len(actions)])
        if i == steps - 1:
            sync()

    try:
        warmup_s, blocks, cpus = time_repeats(step, steps, repeats, warmup=max(20, steps // 5))
    finally:
        env.close()
    return summarize(num_envs, steps, warmup_s, blocks, cpus, bench=f"env {task}", device=str(dev), compile=compile)
