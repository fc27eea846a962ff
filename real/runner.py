"""Runs an exported ``policy.onnx``, batch 1, float32: in numpy when the graph is MLP-class
(:mod:`embodied.real.numpy_policy`, no onnxruntime needed), else on onnxruntime.

The runner trusts nothing it did not check: ``policy_io.json`` is validated by
:func:`embodied.policy_io.read_policy_io`, the ONNX file must carry the same
``model_sha256`` in its metadata (written by :mod:`embodied.export.onnx`), and the graph's
input/output widths must equal the interface's observation and action sizes. An image policy
(``policy_io.json`` ``image_input``) takes the camera picture as its second input
(``runner(obs, image)``); the node feeds it from the robot config's ``camera`` input
(:mod:`embodied.real.camera_image`). An image-instruction policy also reads an instruction embedding,
set once (:meth:`PolicyRunner.set_instruction`, by default the export's training instruction;
:mod:`embodied.real.instruction`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from embodied.action_chunks import CHUNK_EXTRA_KEY, ChunkExecutor
from embodied.errors import EmbodiedError
from embodied.io_spec import IOSpec
from embodied.onnx_wire import read_model
from embodied.policy_io import (
    IMAGE_INPUT_KEY,
    INSTRUCTION_INPUT_KEY,
    ONNX_FILENAME,
    PolicyIO,
    check_session_hash,
    read_policy_io,
)
from embodied.real.instruction import robot_instruction_embedding
from embodied.real.numpy_policy import NumpySession, unsupported_ops
from embodied.real.robot_config import IMAGE_TYPES, RobotConfig
from embodied.residual_graph import ResidualGraph

log = logging.getLogger(__name__)


def resolve_export_dir(path: Path) -> Path:
    """Accept a run directory (``RUN/export``), an export directory, or ``policy.onnx`` itself."""
    path = Path(path)
    if path.is_file():
        path = path.parent
    if (path / "export" / ONNX_FILENAME).is_file():
        return path / "export"
    if (path / ONNX_FILENAME).is_file():
        return path
    raise EmbodiedError(f"{path}: no {ONNX_FILENAME} here or in {path / 'export'}; run `embodied export {path}` first")


class DeployUnsupportedError(EmbodiedError):
    """The export holds a policy the deploy node cannot feed on this robot config (camera images
    without a camera input, an instruction embedding without an instruction)."""


def refuse_unsupported(policy_io: PolicyIO, robot: RobotConfig | None = None) -> None:
    """Raise :class:`DeployUnsupportedError` naming the export and why, for a policy the node
    cannot feed on ``robot`` (``None``: judge what the policy needs without a robot config)."""
    run = policy_io.source_run or str(policy_io.path.parent)
    text = policy_io.instruction_input
    if text is not None and robot is not None and not robot.instruction and not text.get("embedding"):
        raise DeployUnsupportedError(
            f"{policy_io.path}: the policy of {run} reads an instruction embedding ({INSTRUCTION_INPUT_KEY} "
            f"{text.get('name', '')!r} [{text.get('size', '?')}]) and the export carries none of its training "
            f"instruction; set `instruction: TEXT` in robot config {robot.path} or re-export the run"
        )
    entry = policy_io.image_input
    if entry is None or robot is None or robot.camera is not None:
        return
    shape = "x".join(str(v) for v in list(entry.get("shape", []))[1:]) or "?"
    raise DeployUnsupportedError(
        f"{policy_io.path}: the policy of {run} reads camera images ({IMAGE_INPUT_KEY} {shape} "
        f"{entry.get('dtype', 'uint8')} from camera {entry.get('camera', '')!r}) besides the observation vector, "
        f"and robot config {robot.path} has no camera: add `camera: {{input: NAME}}` naming an input of type "
        f'{" or ".join(IMAGE_TYPES)} (real/ros2/README.md, "Camera input")'
    )


def check_deployable(path: Path, robot: RobotConfig | None = None) -> Path:
    """The export folder of ``path`` (see :func:`resolve_export_dir`) once its ``policy_io.json``
    is valid and describes a policy the node can run on ``robot`` (:func:`refuse_unsupported`)."""
    export_dir = resolve_export_dir(path)
    refuse_unsupported(read_policy_io(export_dir), robot)
    return export_dir


class DeployRunner(Protocol):
    """What the deploy node (:class:`~embodied.real.node.PolicyNode`) asks of a policy runner:
    :class:`PolicyRunner` (an ONNX export, numpy/onnxruntime) or
    :class:`~embodied.real.torch_runner.TorchPolicyRunner` (a LeRobot policy, torch)."""

    engine: str
    """What runs the policy (``numpy``, ``onnxruntime``, ``torch``), for the logs."""
    image_shape: tuple[int, int, int] | None
    """``(H, W, C)`` of the camera picture the policy reads with each observation (None: none)."""

    @property
    def io_spec(self) -> IOSpec: ...

    def prepare(self, robot: RobotConfig) -> None:
        """Refuse (naming the robot config) what ``robot`` cannot feed; apply its ``instruction``."""
        ...

    def __call__(self, obs: np.ndarray, image: np.ndarray | None = None) -> np.ndarray: ...

    def reset(self) -> None:
        """Drop the plan being executed: the next call plans from its observation."""
        ...


ENGINES = ("auto", "numpy", "onnxruntime")


def _onnxruntime_session(onnx_path: Path, threads: int, missing: list[str]) -> Any:
    """An onnxruntime ``InferenceSession`` of ``onnx_path`` (``missing``: the operators numpy
    lacks, named in the error when onnxruntime is not installed)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise EmbodiedError(
            f"{onnx_path}: this graph ({', '.join(missing) or 'as requested'}) runs on onnxruntime, which is not "
            "installed: pip install onnxruntime (MLP policies run in numpy without it)"
        ) from None
    options = ort.SessionOptions()
    # One thread: a batch-1 MLP finishes in microseconds, and thread hand-offs would cost more.
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Never spin-wait: in a SCHED_FIFO process a spinning worker would starve the machine.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own types for corrupt or foreign files
        raise EmbodiedError(
            f"{onnx_path}: onnxruntime cannot load it ({' '.join(str(err).split())[:160]}); re-export"
        ) from None


def open_session(onnx_path: Path, threads: int, engine: str) -> tuple[Any, str]:
    """``(session, engine name)`` for one graph: numpy when ``engine`` is ``numpy``, or ``auto``
    and numpy runs every operator of the graph; else onnxruntime."""
    model = read_model(onnx_path)
    missing = unsupported_ops(model)
    if engine == "numpy" or (engine == "auto" and not missing):
        return NumpySession(model, onnx_path), "numpy"  # names the operators it lacks
    return _onnxruntime_session(onnx_path, threads, missing), "onnxruntime"


class PolicyRunner:
    """``runner(obs [obs_dim]) -> action [action_dim]`` (float32, each in [-1, 1])."""

    def __init__(self, export_dir: Path, threads: int = 1, engine: str = "auto") -> None:
        """``engine``: ``numpy`` (MLP-class graphs), ``onnxruntime``, or ``auto`` (numpy when it
        runs the graph, else onnxruntime)."""
        self.export_dir = resolve_export_dir(export_dir)
        self.policy_io: PolicyIO = read_policy_io(self.export_dir)
        refuse_unsupported(self.policy_io)
        onnx_path = self.export_dir / ONNX_FILENAME
        if engine not in ENGINES:
            raise EmbodiedError(f"policy engine {engine!r}: expected one of {', '.join(ENGINES)}")
        self._session: Any
        self._session, self.engine = open_session(onnx_path, threads, engine)
        log.info("%s runs on %s", onnx_path, self.engine)
        check_session_hash(self._session, self.policy_io, onnx_path)
        inputs = {i.name: i for i in self._session.get_inputs()}
        self.image_shape: tuple[int, int, int] | None = None
        """``(H, W, C)`` of the camera picture an image policy reads (None: the vector alone)."""
        self._image_batch: np.ndarray | None = None
        entry = self.policy_io.image_input
        if entry is not None:
            self.image_shape = self._check_image_input(entry, inputs, onnx_path)
            self._image_name = str(entry["name"])
            self._image_batch = np.zeros((1, *self.image_shape), dtype=np.uint8)
            inputs.pop(self._image_name)
        self._instruction_batch: np.ndarray | None = None
        text = self.policy_io.instruction_input
        if text is not None:
            self._instruction_name = str(text.get("name"))
            size = int(text.get("size", 0))
            if self._instruction_name not in inputs or list(inputs[self._instruction_name].shape[1:]) != [size]:
                raise EmbodiedError(
                    f"{self.policy_io.path}: {INSTRUCTION_INPUT_KEY} names input {self._instruction_name!r} [{size}], "
                    f"but {onnx_path} takes {sorted(inputs)}; re-export"
                )
            # NaN until an instruction is set: the export's own when it carries one
            self._instruction_batch = np.full((1, size), np.nan, dtype=np.float32)
            default = text.get("embedding")
            if isinstance(default, list) and len(default) == size:
                self._instruction_batch[0] = default
            inputs.pop(self._instruction_name)
        if len(inputs) != 1:
            raise EmbodiedError(
                f"{onnx_path} takes inputs {sorted(inputs)} but {self.policy_io.path} describes "
                f"{'one more (the observation vector)' if self.image_shape else 'one (the observation vector)'}"
            )
        (inp,) = inputs.values()
        (out,) = self._session.get_outputs()
        self._input_name, self._output_name = inp.name, out.name
        spec = self.io_spec
        if inp.shape[-1] != spec.obs_dim or out.shape[-1] != spec.action_dim:
            raise EmbodiedError(
                f"{onnx_path} maps {inp.shape[-1]} -> {out.shape[-1]} but {self.policy_io.path} "
                f"describes {spec.obs_dim} -> {spec.action_dim}"
            )
        self._batch = np.zeros((1, spec.obs_dim), dtype=np.float32)
        self.chunk = self.policy_io.chunk
        """Plan length and executed steps (``extra.action_chunk``; 1 and 1 for a one-action policy)."""
        chunked = CHUNK_EXTRA_KEY in spec.extra
        want = [self.chunk.length, spec.action_dim] if chunked else [spec.action_dim]
        if list(out.shape[1:]) != want:
            raise EmbodiedError(
                f"{onnx_path} returns [batch, {', '.join(map(str, out.shape[1:]))}] but {self.policy_io.path} "
                f"describes [batch, {', '.join(map(str, want))}] ({'an action chunk' if chunked else 'one action'})"
            )
        self._executor = ChunkExecutor(self._plan, self.chunk)
        self._residual: ResidualGraph | None = None
        """A residual policy on a base with state between calls: its step on each executed base
        action (``policy.onnx`` is then the base's planner; :mod:`embodied.residual_graph`)."""
        if self.policy_io.residual_step is not None:
            self._residual = ResidualGraph(
                self.export_dir,
                self.policy_io,
                lambda path: open_session(path, threads, engine)[0],
            )

    def _check_image_input(
        self, entry: dict[str, Any], inputs: dict[str, Any], onnx_path: Path
    ) -> tuple[int, int, int]:
        name, shape = entry.get("name"), list(entry.get("shape", []))[1:]
        if name not in inputs or len(shape) != 3 or not all(isinstance(v, int) and v > 0 for v in shape):
            raise EmbodiedError(
                f"{self.policy_io.path}: {IMAGE_INPUT_KEY} names input {name!r} of shape {entry.get('shape')}, "
                f"but {onnx_path} takes {sorted(inputs)}; re-export"
            )
        if list(inputs[name].shape[1:]) != shape or entry.get("dtype", "uint8") != "uint8":
            raise EmbodiedError(
                f"{onnx_path} reads {name} as {inputs[name].shape[1:]} but {self.policy_io.path} describes "
                f"{shape} {entry.get('dtype')}; re-export"
            )
        return shape[0], shape[1], shape[2]

    @property
    def io_spec(self) -> IOSpec:
        return self.policy_io.io_spec

    def prepare(self, robot: RobotConfig) -> None:
        """Refuse an export ``robot`` cannot feed (:func:`refuse_unsupported`); embed the robot
        config's ``instruction`` for an image-instruction policy."""
        refuse_unsupported(self.policy_io, robot)  # a camera / an instruction the policy needs
        if self.policy_io.instruction_input is not None:
            vector = robot_instruction_embedding(self.policy_io.instruction_input, robot.instruction)
            if vector is not None:
                self.set_instruction(vector)  # checks its size against the graph

    def __call__(self, obs: np.ndarray, image: np.ndarray | None = None) -> np.ndarray:
        """``obs [obs_dim]`` (and for an image policy ``image [H, W, C]`` uint8) -> ``action
        [action_dim]`` float32 (a fresh array), one per control period: a chunked policy plans
        ``H`` actions and runs ``exec_steps`` of them before it plans again from the observation
        of that period (receding horizon)."""
        self._batch[0] = obs
        if self._image_batch is not None:
            if image is None:
                raise EmbodiedError(f"{self.policy_io.path}: this policy reads a camera image with each observation")
            self._image_batch[0] = image
        if self._instruction_batch is not None and np.isnan(self._instruction_batch[0, 0]):
            raise EmbodiedError(
                f"{self.policy_io.path}: this policy reads an instruction embedding; set_instruction() first"
            )
        action = self._executor(self._batch)
        if self._residual is not None:
            action = self._residual(self._batch, np.ascontiguousarray(action, dtype=np.float32))
        return np.array(action[0], dtype=np.float32)

    @property
    def reads_instruction(self) -> bool:
        """Whether the policy takes an instruction embedding (an image-instruction policy)."""
        return self._instruction_batch is not None

    @property
    def instruction(self) -> np.ndarray | None:
        """A copy of the instruction embedding ``[E]`` fed with every observation (None: none read)."""
        return None if self._instruction_batch is None else self._instruction_batch[0].copy()

    def set_instruction(self, embedding: np.ndarray) -> None:
        """The instruction embedding ``[E]`` fed with every observation from now on."""
        if self._instruction_batch is None:
            raise EmbodiedError(f"{self.policy_io.path}: this policy reads no instruction")
        vector = np.asarray(embedding, dtype=np.float32).reshape(-1)
        if vector.shape != self._instruction_batch.shape[1:]:
            raise EmbodiedError(
                f"instruction embedding of shape {vector.shape}, the policy reads {self._instruction_batch.shape[1:]}"
            )
        self._instruction_batch[0] = vector

    def reset(self) -> None:
        """Drop the current plan: the next call plans from its observation (the node re-arms)."""
        self._executor.reset()

    def _plan(self, batch: np.ndarray) -> np.ndarray:
        """``[1, obs_dim]`` -> ``[1, action_dim]`` or the chunk ``[1, H, action_dim]``."""
        feeds = {self._input_name: batch}
        if self._image_batch is not None:
            feeds[self._image_name] = self._image_batch
        if self._instruction_batch is not None:
            feeds[self._instruction_name] = self._instruction_batch
        result: Any = self._session.run([self._output_name], feeds)
        return np.asarray(result[0])
