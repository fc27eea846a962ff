"""The instruction embedding a VLA-shaped policy reads (``policy_io.json`` ``instruction_input``).

The export carries the training instruction and its embedding (``instruction``, ``embedding``),
which the node feeds every step by default. A robot config's ``instruction:`` replaces it: the
node embeds that text once at start with the same packaged word-embedding table the policy was
trained with (:mod:`embodied.policies.text_table`, extra ``vla``; no torch, no download).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from embodied.errors import EmbodiedError

log = logging.getLogger(__name__)


def instruction_embedding(entry: dict[str, Any], text: str, source: str) -> np.ndarray:
    """``[E]`` float32 for the robot config's instruction ``text`` ("" for the export's own) of a
    policy whose ``policy_io.json`` (``source``) has the ``instruction_input`` ``entry``."""
    size = int(entry.get("size", 0))
    trained = str(entry.get("instruction", ""))
    default = entry.get("embedding")
    if not text or text == trained:
        if not isinstance(default, list) or len(default) != size:
            raise EmbodiedError(
                f"{source}: instruction_input carries no embedding of its training instruction (exported before "
                "it did); set `instruction: TEXT` in the robot config or re-export the run"
            )
        vector = np.asarray(default, dtype=np.float32)
        log.info("instruction: %r (the training instruction, embedded at export)", trained)
    else:
        from embodied.policies.text_table import embed_instruction_array

        vector = embed_instruction_array(text)
        log.info("instruction: %r (the robot config's; trained with %r)", text, trained)
    if vector.shape != (size,) or not np.isfinite(vector).all():
        raise EmbodiedError(f"{source}: the instruction embedding has shape {vector.shape}, the policy reads [{size}]")
    return vector
