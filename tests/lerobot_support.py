"""A tiny local SmolVLM backbone for SmolVLA tests: the real transformers architecture
(``SmolVLMConfig``: a SigLIP-style vision tower and a Llama text model) at a test size, and a
word-level tokenizer whose vocabulary covers the test instructions plus SmolVLM's image tokens.

SmolVLA builds its backbone from ``vlm_model_name`` (``AutoConfig`` and ``AutoProcessor``) and,
with ``load_vlm_weights=False``, initializes it randomly; the published name is a Hub id, so the
tests point it at this folder instead and nothing is downloaded. Its limit: the tokenizer knows
only :data:`WORDS` (others become ``<unk>``), enough for the instructions the tests use.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL = [
    "<pad>",
    "<unk>",
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
]
WORDS = [
    "push",
    "the",
    "block",
    "to",
    "goal",
    "a",
    "an",
    "and",
    "of",
    "on",
    "in",
    "open",
    "close",
    "drawer",
    "pick",
    "place",
    "put",
    "cube",
    "red",
    "blue",
    "green",
]
IMAGE_PX = 32
"""Side of the images the backbone's vision tower takes (SmolVLA resizes with padding to it)."""


def write_tiny_vlm(out: Path) -> Path:
    """Write the backbone config, processor and tokenizer to ``out``; returns ``out``."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        SmolVLMConfig,
        SmolVLMImageProcessor,
        SmolVLMProcessor,
        SmolVLMVideoProcessor,
    )

    # SmolVLM's processor names image tiles <row_r_col_c>; the tokens must exist even if unused
    tiles = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
    vocab = {token: i for i, token in enumerate(SPECIAL + tiles + WORDS + [str(d) for d in range(10)])}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        additional_special_tokens=SPECIAL[2:],
        extra_special_tokens={
            "fake_image_token": "<fake_token_around_image>",
            "image_token": "<image>",
            "end_of_utterance_token": "<end_of_utterance>",
            "global_image_token": "<global-img>",
        },
    )
    images = SmolVLMImageProcessor(
        size={"longest_edge": 2 * IMAGE_PX}, max_image_size={"longest_edge": IMAGE_PX}, do_image_splitting=False
    )
    processor = SmolVLMProcessor(
        image_processor=images, tokenizer=tokenizer, video_processor=SmolVLMVideoProcessor(), image_seq_len=4
    )
    processor.save_pretrained(out)
    config = SmolVLMConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": IMAGE_PX,
            "patch_size": 8,
        },
        text_config={
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": len(vocab),
            "max_position_embeddings": 512,
        },
        scale_factor=2,
        image_token_id=vocab["<image>"],
        vocab_size=len(vocab),
    )
    config.save_pretrained(out)
    return out
