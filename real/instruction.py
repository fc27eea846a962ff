"""The instruction embedding an image-instruction policy reads (``policy_io.json`` ``instruction_input``).

The export carries the training instruction and its embedding (``instruction``, ``embedding``),
which :class:`~embodied.real.runner.PolicyRunner` feeds every step by default. A robot config's
``instruction:`` replaces it: the node embeds that text once at start with the same packaged
word-embedding table the policy was trained with (:mod:`embodied.policies.text_table`, extra
``vla``; no torch, no download).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def robot_instruction_embedding(entry: dict[str, Any], text: str) -> np.ndarray | None:
    """``[E]`` float32 for the robot config's instruction ``text`` of a policy whose
    ``instruction_input`` is ``entry``; None when the export's own embedding applies ("" or the
    training instruction itself: nothing to embed)."""
    trained = str(entry.get("instruction", ""))
    if not text or text == trained:
        log.info("instruction: %r (the training instruction, embedded at export)", trained)
        return None
    from embodied.policies.text_table import embed_instruction_array

    log.info("instruction: %r (the robot config's; trained with %r)", text, trained)
    return embed_instruction_array(text)
