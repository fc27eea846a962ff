"""ReinFlow and residual RL on a full-size SmolVLA configuration: seconds per update, env steps/s
and peak memory (a smoke run with random weights, not a learning run).

The policy is LeRobot 0.4.4's ``SmolVLAPolicy`` at its published size: SmolVLA's defaults (16 of
the backbone's text layers, an action expert at 0.75 of its width with as many layers, chunks of
50 actions, 10 denoising steps, 512 x 512 images, 48 instruction tokens) on a SmolVLM2-500M
backbone configuration written locally (:data:`SMOLVLM2_500M`: the SmolLM2-360M text model and
the SigLIP base-patch16-512 vision tower with a 4x pixel shuffle, 64 tokens per image). The
weights are random (``load_vlm_weights=False``) and the tokenizer is the tests' word-level one
(:mod:`tests.lerobot_support`; the ids it emits are valid for the 49,280-entry embedding). The
task is arm-push with its top camera (64 x 64, resized to 512 by SmolVLA).

Run from the LeRobot environment, one thread, beside nothing heavy::

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 .venv-lerobot/bin/python bench/smolvla_finetune.py \\
        --algo reinflow --num-envs 2 --chains 2 --updates 2 --out bench_out/smolvla_reinflow.json

``--dataset DEMOS`` (arm-push demonstrations with the top camera) adds ReinFlow's demonstration
term (``algo.demo_batch`` = ``--demo-batch`` rows per update, in ``--micro-batch`` parts).

``--train expert,last_layers,lora`` measures ReinFlow with each of those ``algo.vla.train``
settings in one run (a fresh build of the same policy each; trainable parameters, median seconds
per update and its ratio to the first setting's, under ``per_train``).

It stops (exit 3) once the process's resident memory passes ``--max-rss-gib`` (12 by default).
Prints one JSON line: build time, parameter counts, env steps/s while acting, seconds per update,
peak RSS (and peak CUDA memory on a GPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SMOLVLM2_500M: dict[str, Any] = {
    "text_config": {
        "model_type": "llama",
        "hidden_size": 960,
        "intermediate_size": 2560,
        "num_hidden_layers": 32,
        "num_attention_heads": 15,
        "num_key_value_heads": 5,
        "head_dim": 64,
        "vocab_size": 49280,
        "max_position_embeddings": 8192,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
    },
    "vision_config": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "image_size": 512,
        "patch_size": 16,
    },
    "scale_factor": 4,
    "vocab_size": 49280,
}
"""The SmolVLM2-500M backbone's published architecture (SmolLM2-360M text model, SigLIP
base-patch16-512 vision tower, 4x pixel shuffle: (512/16)^2 / 16 = 64 tokens per image)."""

GIB = 1024**3


def rss_gib() -> float:
    """Peak resident set size of this process so far, GiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def current_rss_gib() -> float:
    """Resident set size now, GiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / GIB


TINY: dict[str, Any] = {
    "chunk_size": 4,
    "n_action_steps": 2,
    "num_steps": 2,
    "resize_imgs_with_padding": (32, 32),
    "tokenizer_max_length": 16,
}
"""SmolVLA settings of ``--size tiny`` (with the tests' tiny backbone): a check of the script."""


def write_backbone(out: Path, size: str) -> Path:
    """The processor and tokenizer of the tests' backbone, with the full-size configuration
    (``size="full"``) or the tests' tiny one."""
    from lerobot_support import write_tiny_vlm
    from transformers import SmolVLMConfig

    write_tiny_vlm(out)
    if size == "full":
        config = SmolVLMConfig(**SMOLVLM2_500M, image_token_id=5)  # lerobot_support's <image> id
        config.save_pretrained(out)
    return out


def build_policy(backbone: Path, env: Any, device: str, size: str) -> Any:
    """A SmolVLA (random weights; published size or ``TINY``) wrapped for arm-push's top camera."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import make_pre_post_processors
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    from embodied.data.lerobot_format import task_map
    from embodied.policies.vla import LeRobotPolicy
    from embodied.training.lerobot_base import chunk_spec_of

    state, (h, w, c) = int(env.obs_spec["policy"][0]), env.obs_spec["image"]
    config = SmolVLAConfig(
        input_features={
            "observation.state": PolicyFeature(FeatureType.STATE, (state,)),
            "observation.images.top": PolicyFeature(FeatureType.VISUAL, (c, h, w)),
        },
        output_features={"action": PolicyFeature(FeatureType.ACTION, (int(env.action_dim),))},
        vlm_model_name=str(backbone),
        load_vlm_weights=False,
        device=device,
        **(TINY if size == "tiny" else {}),
    )
    policy = SmolVLAPolicy(config).to(device).eval()
    stats = {
        "observation.state": {"mean": torch.zeros(state), "std": torch.ones(state)},
        "action": {"mean": torch.zeros(env.action_dim), "std": torch.ones(env.action_dim)},
    }
    pre, post = make_pre_post_processors(
        config, dataset_stats=stats, preprocessor_overrides={"device_processor": {"device": device}}
    )
    mapping = task_map("arm-push")
    return LeRobotPolicy(
        policy,
        mapping.instruction,
        mapping.camera_groups("top", env.obs_spec),
        chunk_spec_of(config),
        preprocessor=pre,
        postprocessor=post,
        lerobot_queue=True,
        state_group=mapping.state_group,
    )


def time_reinflow(args: argparse.Namespace, train: str, base: Any, env: Any, bf16: Any, guard: Any) -> dict[str, Any]:
    """ReinFlow with ``algo.vla.train=train`` on ``base``: trainable parameters, env steps/s while
    acting and seconds per update (each of ``--updates``, and their median)."""
    from embodied.algo import PreloadSource, Transition
    from embodied.algos.reinflow import ReinFlow, ReinFlowCfg, VLAFineTuneCfg

    torch.manual_seed(0)
    vla = VLAFineTuneCfg(
        train=train, lora_rank=args.lora_rank, backbone_micro_batch=args.backbone_micro_batch, bf16=bf16
    )
    cfg = ReinFlowCfg(
        vla=vla,
        demo_batch=args.demo_batch,
        num_steps_per_env=args.chains,
        num_epochs=1,
        num_minibatches=1,
        micro_batch=args.micro_batch,
        critic_warmup_updates=0,
    )
    algo: Any = ReinFlow(cfg, env)
    algo.preload(PreloadSource(base_policy=base, dataset=args.dataset))
    trainable = sum(p.numel() for p in algo.chain.trainable_parameters())
    out: dict[str, Any] = {"train": train, "trainable": trainable, "trainable_m": round(trainable / 1e6, 3)}
    if train == "lora":
        out["lora_rank"] = args.lora_rank
    out["chunk"], out["exec_steps"] = algo.chain.chunk, algo.exec_steps
    out["denoise_steps"] = algo.chain.denoise_steps
    if args.dataset is not None:
        out["demo_batch"] = args.demo_batch
    obs = env.reset(seed=0)
    act_s, update_s, env_steps = [], [], 0
    for _ in range(args.updates):
        t0 = time.perf_counter()
        while not algo.ready_to_update():
            action = algo.act(obs)
            nxt, reward, term, trunc, info = env.step(action)
            algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
            obs, env_steps = nxt, env_steps + args.num_envs
            guard()
        t1 = time.perf_counter()
        algo.update()
        guard()
        act_s.append(t1 - t0)
        update_s.append(time.perf_counter() - t1)
    out["env_steps"] = env_steps
    out["env_steps_per_s_acting"] = round(env_steps / sum(act_s), 2)
    out["s_per_update"] = [round(s, 3) for s in update_s]
    out["median_s_per_update"] = round(statistics.median(update_s), 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--algo",
        choices=["reinflow", "residual", "forward"],
        default="reinflow",
        help="forward: only the base's chunk predictions (--updates of them), no training",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=["full", "tiny"], default="full", help="tiny: a check of the script")
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--chains", type=int, default=2, help="reinflow: chains per env per update")
    parser.add_argument("--updates", type=int, default=2, help="reinflow updates / residual env steps x 10")
    parser.add_argument("--micro-batch", type=int, default=2, help="reinflow: gradient micro-batch rows")
    parser.add_argument("--backbone-micro-batch", type=int, default=2)
    parser.add_argument(
        "--train",
        default="expert",
        help="reinflow: algo.vla.train (expert, last_layers, lora), or several comma-separated "
        "(expert,last_layers,lora): each measured in this run on a fresh build of the same policy",
    )
    parser.add_argument(
        "--dataset",
        type=Path,
        default=None,
        help="reinflow: demonstrations with the top camera (`embodied collect scripted:arm-push --images "
        "--camera top`); every update then also takes the flow-matching loss on --demo-batch of them",
    )
    parser.add_argument("--demo-batch", type=int, default=8, help="reinflow --dataset: algo.demo_batch")
    parser.add_argument("--lora-rank", type=int, default=8, help="reinflow --train lora: algo.vla.lora_rank")
    parser.add_argument("--bf16", default="auto", help="backbone bf16 autocast: auto, true or false")
    parser.add_argument("--max-rss-gib", type=float, default=12.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    trains = args.train.split(",")
    if not set(trains) <= {"expert", "last_layers", "lora"} or len(set(trains)) != len(trains):
        parser.error(f"--train takes expert, last_layers and/or lora, comma-separated, each once; got {args.train!r}")
    torch.manual_seed(0)

    from embodied import registry
    from embodied.algo import PreloadSource, Transition
    from embodied.config import apply_overrides

    env_cfg = apply_overrides(registry.task_cfg("arm-push"), {"backend": {"camera": "top"}}, "bench")
    env = registry.make_env("arm-push", env_cfg, args.num_envs, args.device, 0)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        base = build_policy(write_backbone(Path(tmp) / "smolvlm2", args.size), env, args.device, args.size)
    build_s = time.perf_counter() - start
    params = sum(p.numel() for p in base.parameters())
    result: dict[str, Any] = {
        "algo": args.algo,
        "size": args.size,
        "device": args.device,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "num_envs": args.num_envs,
        "build_s": round(build_s, 1),
        "params_m": round(params / 1e6, 1),
        "rss_after_build_gib": round(current_rss_gib(), 2),
    }
    bf16: Any = {"true": True, "false": False}.get(args.bf16, args.bf16)

    def guard() -> None:
        if current_rss_gib() > args.max_rss_gib:
            result["stopped"] = f"resident memory passed {args.max_rss_gib} GiB"
            print(json.dumps(result))
            sys.exit(3)

    obs = env.reset(seed=0)
    if args.algo == "forward":
        # one chunk prediction per call: the backbone on the camera image and instruction, then
        # the action expert's denoising steps (no gradient)
        plan_s = []
        with torch.no_grad():
            for _ in range(args.updates):
                base.reset_plan()
                t0 = time.perf_counter()
                base.plan(obs)
                plan_s.append(time.perf_counter() - t0)
                guard()
        result["s_per_chunk_prediction"] = [round(s, 2) for s in plan_s]
        result["median_s_per_chunk_prediction"] = round(statistics.median(plan_s), 2)
    elif args.algo == "reinflow":
        if len(trains) == 1:
            result |= time_reinflow(args, trains[0], base, env, bf16, guard)
        else:  # each setting on a fresh build of the same policy (LoRA wraps the expert in place)
            result["per_train"] = {}
            for i, train in enumerate(trains):
                if i > 0:
                    del base
                    torch.manual_seed(0)
                    with tempfile.TemporaryDirectory() as tmp:
                        base = build_policy(
                            write_backbone(Path(tmp) / "smolvlm2", args.size), env, args.device, args.size
                        )
                result["per_train"][train] = time_reinflow(args, train, base, env, bf16, guard)
            first = result["per_train"][trains[0]]["median_s_per_update"]
            for row in result["per_train"].values():
                row["update_time_vs_" + trains[0]] = round(row["median_s_per_update"] / first, 2)
    else:
        from embodied.algos.residual import Residual, ResidualCfg

        steps = 10 * args.updates
        algo = Residual(ResidualCfg(learning_starts=steps // 2, batch_size=32, critic_warmup_updates=0), env)
        algo.preload(PreloadSource(base_policy=base))
        t0 = time.perf_counter()
        updates = 0
        for _ in range(steps):
            action = algo.act(obs)
            nxt, reward, term, trunc, info = env.step(action)
            algo.observe(Transition(obs, action, reward, term, trunc, nxt, info["final_obs"]))
            obs = nxt
            if algo.ready_to_update():
                algo.update()
                updates += 1
            guard()
        wall = time.perf_counter() - t0
        result["env_steps"] = steps * args.num_envs
        result["env_steps_per_s"] = round(steps * args.num_envs / wall, 2)
        result["updates"] = updates
    result["peak_rss_gib"] = round(rss_gib(), 2)
    if args.device.startswith("cuda"):
        result["peak_cuda_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
    env.close()
    line = json.dumps(result)
    print(line)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
