"""The policy artifact: a trained policy alone (its plain-array description + its IOSpec).

Every checkpoint writes one beside it (``ckpt/policy.pt``). Exporters, ``eval --policy``,
``deploy`` and the firmware tools read this file instead of rebuilding the run's algorithm,
replay buffer and optimizer. The file is a ``torch.save`` archive of plain containers and
tensors only (loaded with ``weights_only=True``), sealed like checkpoints
(:mod:`embodied.checkpoint_seal`)::

    {"artifact_version": 1, "kind": "mlp", "policy": {...}, "io_spec": IOSpec.to_dict(),
     "env_steps": int, "checkpoint_seal": str}

``kind`` names an entry of :data:`POLICY_KINDS`, which turns an exported module into its
description and back. A new policy family (e.g. a flow-matching policy) adds one entry; a
file naming a kind this version does not know fails with :class:`UnknownPolicyKindError`.
Kinds: ``mlp`` (:class:`~embodied.export.layers.MlpArrays`), ``flow`` (a flow-matching
policy's deterministic sampler, :class:`~embodied.export.flow_arrays.FlowArrays`, whose module
returns an action chunk; :meth:`PolicyArtifact.policy` executes chunks receding-horizon) and
``image`` (a policy that also reads camera images, :class:`~embodied.export.image_arrays.ImageArrays`,
whose module takes ``(obs [B, D], image [B, H, W, C] uint8)``; a kind's ``obs_groups`` say which
observation groups its module reads, and :meth:`PolicyArtifact.obs_policy` feeds them from the
observation dict).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from embodied.action_chunks import CHUNK_EXTRA_KEY, ChunkExecutor, ChunkSpec
from embodied.checkpoint_seal import SealError, load_error_detail, pickled_object_refusal, seal, unseal
from embodied.env import IMAGE_GROUP, ObsDict
from embodied.errors import EmbodiedError
from embodied.export.artifact_errors import PolicyArtifactError
from embodied.export.flow_arrays import FlowArrays, build_flow, flow_arrays, is_flow_sampler
from embodied.export.image_arrays import (
    ConvLayer,
    ImageArrays,
    LayerNormArrays,
    build_image,
    image_arrays,
    is_image_policy,
)
from embodied.export.layers import (
    EXPORTED_POLICY_ATTRS,
    DenseLayer,
    MlpArrays,
    SymmetryArrays,
    layers_outside_net,
    mlp_arrays,
    sequential_from_layers,
    with_io_symmetry,
)
from embodied.io_spec import IOSpec

ARTIFACT_VERSION = 1
POLICY_FILE = Path("ckpt") / "policy.pt"
"""Where a run keeps its policy artifact, beside ``ckpt/latest.pt``."""


class UnknownPolicyKindError(PolicyArtifactError):
    """The artifact names a policy kind missing from :data:`POLICY_KINDS`."""


@dataclass(frozen=True)
class PolicyKind:
    """How one policy family travels as plain data.

    ``describe(module)`` validates an exported module and returns its description (a frozen
    dataclass of arrays and numbers); ``build(description)`` returns the float32 CPU torch
    module computing the same ``obs [B, obs_dim] -> action [B, action_dim]``.
    """

    name: str
    description_type: type
    nested_types: tuple[type, ...]
    """Dataclasses that may appear inside the description (encoded by name)."""
    describe: Callable[[nn.Module], Any]
    build: Callable[[Any], nn.Module]
    matches: Callable[[nn.Module], bool] = lambda module: False
    """Whether an exported module is of this family (how a checkpoint's policy finds its kind)."""
    obs_groups: tuple[str, ...] = ("policy",)
    """The observation groups the module's ``forward`` takes, in argument order (the first is
    always the policy vector ``[B, obs_dim]``)."""


_MLP_REBUILT = frozenset({"obs_mean", "obs_std", "obs_clip", "layers", "symmetry"})
"""MlpArrays fields :func:`_build_mlp` turns back into torch; any other field must hold its default."""


def _build_mlp(arrays: MlpArrays) -> nn.Module:
    """The ExportedPolicy whose :func:`mlp_arrays` is ``arrays``."""
    from embodied.policies.mlp import ExportedPolicy

    for f in dataclasses.fields(arrays):
        if f.name in _MLP_REBUILT or f.default is dataclasses.MISSING:
            continue
        if getattr(arrays, f.name) is not f.default and getattr(arrays, f.name) != f.default:
            # A stage added to MlpArrays after this rebuild was written: refuse rather than drop it.
            raise PolicyArtifactError(f"MlpArrays.{f.name} is set but not rebuilt into a torch module")

    try:
        net = sequential_from_layers(arrays.layers, "mlp")
    except EmbodiedError as err:
        raise PolicyArtifactError(str(err)) from None
    policy = ExportedPolicy(
        net,
        torch.from_numpy(np.array(arrays.obs_mean, dtype=np.float32)),
        torch.from_numpy(np.array(arrays.obs_std, dtype=np.float32)),
        arrays.obs_clip,
    )
    sym = arrays.symmetry
    if sym is None:
        return policy
    tables = {
        "select_index": int(sym.select_index),
        "obs_source": [int(i) for i in np.asarray(sym.obs_source)],
        "obs_sign": [float(v) for v in np.asarray(sym.obs_sign)],
        "action_source": [int(i) for i in np.asarray(sym.action_source)],
    }
    try:
        return policy.with_symmetry(tables)
    except ValueError as err:
        raise PolicyArtifactError(f"symmetry: {err}") from None


def _is_mlp(module: nn.Module) -> bool:
    return all(hasattr(module, attr) for attr in EXPORTED_POLICY_ATTRS) and not layers_outside_net(module)


POLICY_KINDS: dict[str, PolicyKind] = {
    "mlp": PolicyKind("mlp", MlpArrays, (MlpArrays, DenseLayer, SymmetryArrays), mlp_arrays, _build_mlp, _is_mlp),
    "flow": PolicyKind("flow", FlowArrays, (FlowArrays, DenseLayer), flow_arrays, build_flow, is_flow_sampler),
    "image": PolicyKind(
        "image",
        ImageArrays,
        (ImageArrays, ConvLayer, LayerNormArrays, DenseLayer),
        image_arrays,
        build_image,
        is_image_policy,
        ("policy", IMAGE_GROUP),
    ),
}
"""Policy families an artifact can hold, by the name stored in the file."""


def artifact_kind_of(module: nn.Module) -> str | None:
    """The :data:`POLICY_KINDS` name describing ``module`` (``Policy.export_module()``), or None."""
    return next((name for name, kind in POLICY_KINDS.items() if kind.matches(module)), None)


def artifact_kind_known(module: nn.Module, kind: str | None = None) -> bool:
    """Whether ``kind`` (any kind when None) can describe ``module``."""
    found = artifact_kind_of(module)
    return found is not None and (kind is None or found == kind)


def policy_kind(name: str) -> PolicyKind:
    """The :data:`POLICY_KINDS` entry ``name``, or :class:`UnknownPolicyKindError`."""
    if name not in POLICY_KINDS:
        raise UnknownPolicyKindError(
            f"policy kind {name!r} is not known to this version of embodied (known: {', '.join(POLICY_KINDS)}); "
            "upgrade embodied or re-export with the version that trained it"
        )
    return POLICY_KINDS[name]


def _encode(value: Any, types: dict[str, type]) -> Any:
    """Plain containers + tensors for ``value``: every field of a dataclass travels, so fields
    added to a description later are saved without changes here."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        name = type(value).__name__
        if name not in types:
            raise PolicyArtifactError(f"cannot store a {name} in a policy artifact (not a field type of its kind)")
        fields = {f.name: _encode(getattr(value, f.name), types) for f in dataclasses.fields(value)}
        return {"__dataclass__": name, "fields": fields}
    if isinstance(value, np.ndarray):
        return {"__array__": torch.from_numpy(np.ascontiguousarray(value).copy())}
    if isinstance(value, tuple | list):
        return {"__tuple__" if isinstance(value, tuple) else "__list__": [_encode(v, types) for v in value]}
    if isinstance(value, dict):
        return {"__dict__": {str(k): _encode(v, types) for k, v in value.items()}}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise PolicyArtifactError(f"cannot store a {type(value).__name__} in a policy artifact")


def _decode(value: Any, types: dict[str, type], where: str) -> Any:
    if isinstance(value, dict):
        if "__dataclass__" in value:
            name = value["__dataclass__"]
            if name not in types:
                raise PolicyArtifactError(f"{where}: unknown description type {name!r}")
            fields = {k: _decode(v, types, f"{where}.{k}") for k, v in dict(value.get("fields", {})).items()}
            try:
                return types[name](**fields)
            except TypeError as err:
                raise PolicyArtifactError(f"{where}: {name} does not take these fields ({err})") from None
        if "__array__" in value:
            tensor = value["__array__"]
            if not isinstance(tensor, torch.Tensor):
                raise PolicyArtifactError(f"{where}: expected a tensor")
            return np.ascontiguousarray(tensor.numpy())
        if "__tuple__" in value or "__list__" in value:
            raw = value["__tuple__"] if "__tuple__" in value else value["__list__"]
            items = [_decode(v, types, f"{where}[{i}]") for i, v in enumerate(raw)]
            return tuple(items) if "__tuple__" in value else items
        if "__dict__" in value:
            return {k: _decode(v, types, f"{where}.{k}") for k, v in value["__dict__"].items()}
        raise PolicyArtifactError(f"{where}: unrecognized entry with keys {sorted(value)}")
    return value


@dataclass(frozen=True)
class PolicyArtifact:
    """A policy without its training machinery: ``description`` (of ``kind``) and its interface."""

    kind: str
    description: Any
    io_spec: IOSpec
    env_steps: int = 0
    checkpoint_seal: str = ""
    """The seal (SHA-256) of the checkpoint this policy was taken from, "" when unknown."""

    @classmethod
    def from_module(
        cls, module: nn.Module, io_spec: IOSpec, kind: str | None = None, env_steps: int = 0, checkpoint_seal: str = ""
    ) -> PolicyArtifact:
        """Describe an exported module (``Policy.export_module()``); validates it. ``kind``: a
        :data:`POLICY_KINDS` name, found from the module when None. A symmetry the ``io_spec``
        declares (``extra.yaw_symmetry``) is put around the module first, so every artifact takes
        and returns physical quantities. A chunked policy's :class:`ChunkSpec` is added to the
        spec's ``extra`` (``action_chunk``), so ``policy_io.json`` tells deployments."""
        if kind is None:
            kind = artifact_kind_of(module) or "mlp"  # "mlp" names what is missing in its error
        description = policy_kind(kind).describe(with_io_symmetry(module, io_spec))
        chunk: ChunkSpec | None = getattr(description, "chunk_spec", None)
        if chunk is not None:
            io_spec = dataclasses.replace(io_spec, extra={**io_spec.extra, CHUNK_EXTRA_KEY: chunk.to_dict()})
        if description.obs_dim != io_spec.obs_dim or description.action_dim != io_spec.action_dim:
            raise PolicyArtifactError(
                f"policy maps {description.obs_dim} -> {description.action_dim} but its IOSpec describes "
                f"{io_spec.obs_dim} -> {io_spec.action_dim}"
            )
        return cls(kind, description, io_spec, env_steps, checkpoint_seal)

    def module(self) -> nn.Module:
        """The float32 CPU torch module of the policy: ``obs [B, D] -> action [B, A]``, or the
        chunk ``[B, H, A]`` for a chunked kind (``flow``); it takes one argument per entry of
        :attr:`obs_groups` (``image``: ``(obs [B, D], image [B, H, W, C] uint8)``)."""
        return policy_kind(self.kind).build(self.description)

    @property
    def obs_groups(self) -> tuple[str, ...]:
        """Observation groups the policy reads, in the order its module takes them."""
        return policy_kind(self.kind).obs_groups

    @property
    def chunk_spec(self) -> ChunkSpec:
        """Chunk length and executed steps (1 and 1 for a policy without chunks)."""
        return ChunkSpec.from_extra(self.io_spec.extra, "artifact io_spec extra")

    def policy(self, device: torch.device | str = "cpu") -> ChunkExecutor[torch.Tensor]:
        """The policy as a callable for a kind that reads the policy vector alone:
        ``policy(obs [N, D]) -> action [N, A]``, deterministic, executing chunks
        receding-horizon; ``policy.reset()`` starts a new plan. :meth:`obs_policy` takes the
        observation dict, for every kind."""
        if len(self.obs_groups) > 1:
            raise PolicyArtifactError(
                f"a policy of kind {self.kind!r} reads {', '.join(self.obs_groups)}, not the policy vector alone: "
                "call it through PolicyArtifact.obs_policy() with the observation dict"
            )
        module = self.module().to(device).eval()

        @torch.no_grad()
        def plan(obs: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = module(obs.float())
            return out

        return ChunkExecutor(plan, self.chunk_spec)

    def obs_policy(self, device: torch.device | str = "cpu") -> Callable[[ObsDict], torch.Tensor]:
        """The policy as a callable for any kind: ``policy(obs) -> action [N, A]``,
        deterministic, reading the groups of :attr:`obs_groups` from the observation dict
        (``obs["policy"] [N, D]``; an image policy also ``obs["image"] [N, H, W, C]`` uint8)."""
        if len(self.obs_groups) == 1:
            vector_policy = self.policy(device)  # chunks run receding-horizon
            return lambda obs: vector_policy(obs[self.obs_groups[0]])
        if self.chunk_spec.length > 1:
            # no kind reading several groups returns chunks; refuse rather than run a chunk as one action
            raise PolicyArtifactError(
                f"a policy of kind {self.kind!r} with action chunks cannot be run from observation dicts"
            )
        module = self.module().to(device).eval()
        first, *others = self.obs_groups

        @torch.no_grad()
        def act(obs: ObsDict) -> torch.Tensor:
            missing = [group for group in self.obs_groups if group not in obs]
            if missing:
                raise PolicyArtifactError(
                    f"a policy of kind {self.kind!r} reads observation group(s) {missing}, absent here"
                )
            # the vector is cast to float32; the other groups (uint8 images) go in as the env gives them
            out: torch.Tensor = module(obs[first].float(), *(obs[group] for group in others))
            return out

        return act

    def to_bytes(self) -> bytes:
        """The sealed ``torch.save`` archive of this artifact."""
        kind = policy_kind(self.kind)
        types = {t.__name__: t for t in kind.nested_types}
        payload = {
            "artifact_version": ARTIFACT_VERSION,
            "kind": self.kind,
            "policy": _encode(self.description, types),
            "io_spec": _encode(self.io_spec.to_dict(), {}),
            "env_steps": int(self.env_steps),
            "checkpoint_seal": self.checkpoint_seal,
        }
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        return seal(buffer.getvalue())

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> PolicyArtifact:
        """Verify the seal and read an artifact (``name`` is used in errors)."""
        try:
            payload = torch.load(io.BytesIO(unseal(data, name)), map_location="cpu", weights_only=True)
        except SealError as err:
            raise PolicyArtifactError(str(err)) from None
        except (
            RuntimeError,
            EOFError,
            pickle.UnpicklingError,
            zipfile.BadZipFile,
            ValueError,
            KeyError,
            TypeError,
        ) as err:
            refusal = pickled_object_refusal(err)
            if refusal is not None:
                raise PolicyArtifactError(f"{name}: {refusal}") from None
            raise PolicyArtifactError(f"{name}: corrupt or not a policy artifact ({load_error_detail(err)})") from None
        if not isinstance(payload, dict) or "kind" not in payload or "policy" not in payload:
            raise PolicyArtifactError(f"{name}: not a policy artifact (expected a mapping with 'kind' and 'policy')")
        version = payload.get("artifact_version")
        if version != ARTIFACT_VERSION:
            raise PolicyArtifactError(
                f"{name}: artifact_version {version!r}, this version of embodied reads {ARTIFACT_VERSION}"
            )
        kind = policy_kind(str(payload["kind"]))
        types = {t.__name__: t for t in kind.nested_types}
        description = _decode(payload["policy"], types, f"{name}: policy")
        if not isinstance(description, kind.description_type):
            raise PolicyArtifactError(f"{name}: policy is not a {kind.description_type.__name__}")
        try:
            io_spec = IOSpec.from_dict(_decode(payload["io_spec"], {}, f"{name}: io_spec"))
        except (KeyError, TypeError, ValueError) as err:
            raise PolicyArtifactError(f"{name}: io_spec is malformed ({err})") from None
        env_steps, sealed = payload.get("env_steps", 0), payload.get("checkpoint_seal", "")
        if isinstance(env_steps, bool) or not isinstance(env_steps, int) or env_steps < 0:
            raise PolicyArtifactError(f"{name}: env_steps should be a non-negative integer, found {env_steps!r:.40}")
        if not isinstance(sealed, str):
            raise PolicyArtifactError(f"{name}: checkpoint_seal should be text, found {type(sealed).__name__}")
        return cls(kind.name, description, io_spec, env_steps, sealed)


def read_policy_artifact(path: Path) -> PolicyArtifact:
    """Load ``path`` (a ``policy.pt``); raise :class:`PolicyArtifactError` naming it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PolicyArtifactError(f"{path}: no policy artifact there") from None
    except OSError as err:
        raise PolicyArtifactError(f"{path}: cannot read it: {err.strerror or err}") from None
    return PolicyArtifact.from_bytes(data, str(path))
