"""Instruction embeddings as torch tensors, for the policies (the table and its use:
:mod:`embodied.policies.text_table`)."""

from __future__ import annotations

import torch

from embodied.policies.text_table import EMBED_DIM, INSTALL_HINT, embed_instruction_array

__all__ = ["EMBED_DIM", "INSTALL_HINT", "embed_instruction", "embed_instruction_array"]


def embed_instruction(instruction: str) -> torch.Tensor:
    """The instruction's embedding ``[E]`` float32 (cached per string; a fresh tensor each call)."""
    return torch.from_numpy(embed_instruction_array(instruction))
