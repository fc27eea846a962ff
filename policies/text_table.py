"""Instruction embeddings from a word-embedding model shipped inside a package (no download).

The model is WordLlama's default ``l2_supercat`` table (``wordllama`` on PyPI, extra ``instruction``):
a 32 000 x 256 float16 token-embedding table distilled from Llama 2 token embeddings and its
tokenizer, both inside the wheel (``wordllama/weights/``, ``wordllama/tokenizers/``). The
package's own loader looks for the tokenizer in a folder named ``tokenizer/`` (the wheel has
``tokenizers/``) and then falls back to a download; this module opens both files straight from
the installed package, so a missing file is an error here, never a network request.

An instruction's embedding is the mean-pooled token embedding, ``[E]`` float32 (``E`` = 256),
computed once per distinct string and cached: a policy sees the same instruction every step.
This module needs no torch, so the deploy runtime embeds a robot config's instruction with it;
:mod:`embodied.policies.text_embedding` returns the same vector as a tensor.
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

import numpy as np

from embodied.errors import MissingDependencyError, import_optional

INSTALL_HINT = 'pip install "embodied[instruction]"'
WEIGHTS_FILE = "weights/l2_supercat_256.safetensors"
"""The default table inside the ``wordllama`` package (256-wide, the one its wheel carries)."""
TOKENIZER_FILE = "tokenizers/l2_supercat_tokenizer_config.json"
EMBED_DIM = 256
"""Width ``E`` of an instruction embedding."""


@functools.cache
def _model() -> Any:
    """WordLlama inference over the packaged table and tokenizer (loaded once per process)."""
    wordllama = import_optional(
        "wordllama", "instruction embeddings of the image-instruction flow policy", INSTALL_HINT
    )
    from safetensors import safe_open
    from tokenizers import Tokenizer
    from wordllama.inference import WordLlamaInference

    root = importlib.resources.files(wordllama)
    weights, tokenizer = root / WEIGHTS_FILE, root / TOKENIZER_FILE
    for path in (weights, tokenizer):
        if not path.is_file():
            raise MissingDependencyError(
                f"the installed wordllama package has no {path}; reinstall it with: {INSTALL_HINT}"
            )
    with safe_open(str(weights), framework="np") as f:
        table = f.get_tensor("embedding.weight")
    return WordLlamaInference(table, Tokenizer.from_file(str(tokenizer)))


@functools.cache
def _embed_cached(instruction: str) -> tuple[float, ...]:
    vector = np.asarray(_model().embed([instruction]), dtype=np.float32)[0]
    return tuple(float(v) for v in vector)


def embed_instruction_array(instruction: str) -> np.ndarray:
    """The instruction's embedding ``[E]`` float32 (cached per string; a fresh array each call).
    Needs no torch: the deploy node embeds a robot config's instruction with it."""
    return np.array(_embed_cached(instruction), dtype=np.float32)
