"""The table of export formats: each entry writes files from a policy artifact and can load
what it wrote back as an ``obs -> action`` policy for ``embodied eval --policy NAME``.

:data:`EXPORTERS` drives ``embodied export --format`` (choices and help),
:func:`embodied.export.bundle.export_artifact` and ``embodied eval --policy``. Adding a format
is one class here and one table entry.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from embodied.env import ObsDict
from embodied.errors import EmbodiedError
from embodied.export.artifact import PolicyArtifact
from embodied.export.c_build import HOST_LIBRARY, build_policy_library
from embodied.export.c_header import generate_c
from embodied.export.flow_arrays import FlowArrays
from embodied.export.host_lib import HostPolicyLib
from embodied.export.image_arrays import ImageArrays
from embodied.export.image_onnx import image_input_of, load_image_onnx_policy
from embodied.export.lerobot_checkpoint import LeRobotExporter
from embodied.export.onnx import PARITY_TOL, export_onnx, load_onnx_policy
from embodied.export.policy_io import ONNX_FILENAME, POLICY_IO_FILENAME, read_policy_io

log = logging.getLogger(__name__)

EXPORT_SUBDIR = "export"
"""``RUN_DIR/export/``: where every format writes, beside ``policy_io.json``."""
C_SUBDIR = "c"
HOST_SUBDIR = "host"

PolicyFn = Callable[[ObsDict], torch.Tensor]
"""``obs -> action [N, A]`` in [-1, 1], deterministic."""


@dataclass
class FormatResult:
    """What one exporter wrote and how closely it matches torch (max ``|error|``)."""

    written: list[Path] = field(default_factory=list)
    max_abs_err: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    """Format-specific facts worth printing (e.g. which tanh the C code uses)."""


class Exporter(Protocol):
    """One export format: its name, what it writes and how to load it back."""

    name: str
    description: str
    files: tuple[str, ...]
    """Paths it writes, relative to the export folder."""
    vehicle: str | None
    """``policy_io.json``'s ``extra.vehicle`` it needs (None: any policy)."""
    kinds: tuple[str, ...]
    """Policy artifact kinds it can write (``--format all`` skips the others)."""
    in_all: bool
    """Whether ``--format all`` includes it (False: only when named, e.g. it needs another environment)."""

    def export(self, artifact: PolicyArtifact, out_dir: Path, observations: np.ndarray) -> FormatResult:
        """Write the format into ``out_dir`` (beside ``policy_io.json``) and check its parity
        against the artifact's torch module on ``observations`` [N, obs_dim]."""
        ...

    def load_policy(self, run_dir: Path, env: Any) -> PolicyFn:
        """Fly ``env`` with what :meth:`export` wrote into ``RUN_DIR/export/``."""
        ...


class OnnxExporter:
    name: str = "onnx"
    description: str = (
        "policy.onnx (opset 17, input `obs`, output `action`, batch dynamic), checked against onnxruntime"
    )
    files: tuple[str, ...] = (ONNX_FILENAME,)
    vehicle: str | None = None
    kinds: tuple[str, ...] = ("mlp", "flow")
    in_all: bool = True

    def export(self, artifact: PolicyArtifact, out_dir: Path, observations: np.ndarray) -> FormatResult:
        report = export_onnx(artifact.module(), artifact.io_spec, out_dir, observations)
        return FormatResult([report.path], report.max_abs_err)

    def load_policy(self, run_dir: Path, env: Any) -> PolicyFn:
        export = Path(run_dir) / EXPORT_SUBDIR
        if image_input_of(export) is not None:
            return load_image_onnx_policy(export, env)
        return load_onnx_policy(run_dir, env)


def check_host_parity(module: nn.Module, c_out: Path, build_dir: Path, observations: np.ndarray) -> float:
    """Build the host library from ``c_out`` and return max ``|C - torch|`` over ``observations``."""
    lib = HostPolicyLib(build_policy_library(c_out, build_dir))
    ok, err = lib.selftest()
    if not ok:
        raise EmbodiedError(f"{c_out}: policy_selftest failed on the host (max err {err:.3g})")
    obs = np.ascontiguousarray(observations, dtype=np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(obs)).numpy()
    got = lib.policy_step(obs, want.shape[1])
    return float(np.max(np.abs(got - want)))


def unsupported_kind_reason(fmt: str, artifact: PolicyArtifact) -> str:
    """Why format ``fmt`` cannot hold ``artifact``: the layer or structure that does not fit."""
    description = artifact.description
    if isinstance(description, FlowArrays):
        c_acts = {"tanh", "elu", "relu", "none"}
        odd = next(((i, layer) for i, layer in enumerate(description.layers) if layer.activation not in c_acts), None)
        what = (
            f"velocity layer {odd[0]} uses {odd[1].activation}, which the C exporter has no code for (tanh, elu, relu)"
            if odd is not None
            else "the C exporter writes one MLP with an [A] output"
        )
        return (
            f"format {fmt!r} cannot hold a flow policy: its sampler is {description.steps} unrolled calls of a "
            f"{len(description.layers)}-layer velocity network returning a [{description.chunk}, "
            f"{description.action_dim}] action chunk, and {what}; export it with --format onnx"
        )
    if isinstance(description, ImageArrays):
        return (
            f"format {fmt!r} cannot hold an image policy: its first layer, encoder.convs[0] "
            f"({description.convs[0].text()}), is a convolution, and the C exporter writes Linear layers and "
            "activations only; export it with --format onnx"
        )
    return f"format {fmt!r} cannot hold a policy of kind {artifact.kind!r}; export it with --format onnx"


class CExporter:
    name: str = "c"
    description: str = (
        "c/policy.h + c/policy.c (C99, static weights, no malloc), built on the host and checked against torch"
    )
    files: tuple[str, ...] = (f"{C_SUBDIR}/policy.h", f"{C_SUBDIR}/policy.c")
    vehicle: str | None = None
    kinds: tuple[str, ...] = ("mlp",)
    in_all: bool = True

    def export(self, artifact: PolicyArtifact, out_dir: Path, observations: np.ndarray) -> FormatResult:
        if artifact.kind not in self.kinds:
            raise EmbodiedError(unsupported_kind_reason(self.name, artifact))
        module = artifact.module()
        io_path = Path(out_dir) / POLICY_IO_FILENAME
        c_out, build = Path(out_dir) / C_SUBDIR, Path(out_dir) / HOST_SUBDIR
        # The self-test example: the middle of the checked set (inside the recorded rollout when there is one).
        example = observations[len(observations) // 2] if len(observations) else None
        result = FormatResult([c_out / "policy.h", c_out / "policy.c"])
        if shutil.which("gcc") is None:
            generate_c(module, io_path, c_out, example, fast_tanh=True)
            log.warning("gcc not found: the C export was written but its parity was not checked")
            return result
        for fast in (True, False):
            if build.exists():
                shutil.rmtree(build)
            generate_c(module, io_path, c_out, example, fast_tanh=fast)
            # A fresh folder per attempt: ctypes cannot reload a library path it already opened.
            err = check_host_parity(module, c_out, build / ("fast" if fast else "libm"), observations)
            result.max_abs_err, result.details["fast_tanh"] = err, fast
            if err <= PARITY_TOL:
                return result
            log.warning("fast tanh misses parity (%.2e); regenerating with tanhf", err)
        raise EmbodiedError(f"{c_out}: C policy differs from torch by {result.max_abs_err:.3g} (> {PARITY_TOL:g})")

    def load_policy(self, run_dir: Path, env: Any) -> PolicyFn:
        """The generated C network on the env's own observation (host build, any policy)."""
        export = Path(run_dir) / EXPORT_SUBDIR
        policy_io = read_policy_io(export)
        spec = policy_io.io_spec
        obs_dim = int(env.obs_spec["policy"][0])
        if obs_dim != spec.obs_dim or int(env.action_dim) != spec.action_dim:
            raise EmbodiedError(
                f"{policy_io.path} maps {spec.obs_dim} -> {spec.action_dim} but the env has {obs_dim} -> {env.action_dim}"
            )
        header = export / C_SUBDIR / "policy.h"
        if not header.is_file():
            raise EmbodiedError(f"{header} not found; run `embodied export {run_dir} --format c` first")
        if f'POLICY_MODEL_SHA256 "{policy_io.model_sha256}"' not in header.read_text():
            raise EmbodiedError(f"{header} was generated for another model than {policy_io.path}; re-export")
        # One folder per model hash: ctypes cannot reload a path it already opened in this process.
        build = export / HOST_SUBDIR / f"eval-{policy_io.model_sha256[:12]}"
        path = build / HOST_LIBRARY
        lib = HostPolicyLib(path if path.is_file() else build_policy_library(export / C_SUBDIR, build))
        device, action_dim = env.device, spec.action_dim

        def act(obs: ObsDict) -> torch.Tensor:
            x = np.ascontiguousarray(obs["policy"].detach().to("cpu", torch.float32).numpy())
            return torch.from_numpy(lib.policy_step(x, action_dim)).to(device)

        return act


_EXPORTERS: tuple[Exporter, ...] = (OnnxExporter(), CExporter(), LeRobotExporter())
EXPORTERS: dict[str, Exporter] = {e.name: e for e in _EXPORTERS}
"""Export formats by ``--format`` name (``all`` means every entry)."""
ALL = "all"


def format_choices() -> tuple[str, ...]:
    """``--format`` choices: every exporter, then ``all``."""
    return (*EXPORTERS, ALL)


def selected(fmt: str) -> list[Exporter]:
    """The exporters ``--format fmt`` names; raises naming the choices."""
    if fmt == ALL:
        return [e for e in EXPORTERS.values() if e.in_all]
    if fmt not in EXPORTERS:
        raise EmbodiedError(f"unknown export format {fmt!r}; choose one of {', '.join(format_choices())}")
    return [EXPORTERS[fmt]]
