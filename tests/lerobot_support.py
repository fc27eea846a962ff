"""Small LeRobot policies for the tests and bench/lerobot_eval.py, and a tiny local SmolVLM
backbone for SmolVLA: the real transformers architecture
(``SmolVLMConfig``: a SigLIP-style vision tower and a Llama text model) at a test size, and a
word-level tokenizer whose vocabulary covers the test instructions plus SmolVLM's image tokens.

SmolVLA builds its backbone from ``vlm_model_name`` (``AutoConfig`` and ``AutoProcessor``) and,
with ``load_vlm_weights=False``, initializes it randomly; the published name is a Hub id, so the
tests point it at this folder instead and nothing is downloaded. Its limit: the tokenizer knows
only :data:`WORDS` (others become ``<unk>``), enough for the instructions the tests use.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from embodied.data.lerobot_format import ACTION_KEY, IMAGE_PREFIX, STATE_KEY

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
STATE, ACTIONS, SIZE_PX = 18, 3, 64  # arm-push with the top camera
CAMERA = IMAGE_PREFIX + "top"
KINDS = ("act", "diffusion", "smolvla")


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


def features(image_px: int = SIZE_PX, camera: str = CAMERA) -> tuple[dict[str, Any], dict[str, Any]]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {
        STATE_KEY: PolicyFeature(FeatureType.STATE, (STATE,)),
        camera: PolicyFeature(FeatureType.VISUAL, (3, image_px, image_px)),
    }
    return inputs, {ACTION_KEY: PolicyFeature(FeatureType.ACTION, (ACTIONS,))}


def make_config(
    kind: str, vlm: Path, image_px: int = SIZE_PX, camera: str = CAMERA, overrides: dict[str, Any] | None = None
) -> Any:
    """A small config of LeRobot policy ``kind`` for arm-push's features (no pretrained backbone;
    SmolVLA's VLM backbone is the tiny local one at ``vlm``); ``overrides``: fields to change
    (e.g. ACT's ``temporal_ensemble_coeff``), checked by the config's own ``__post_init__``."""
    config = _small_config(kind, vlm, image_px, camera)
    return dataclasses.replace(config, **overrides) if overrides else config


def _small_config(kind: str, vlm: Path, image_px: int, camera: str) -> Any:
    inputs, outputs = features(image_px, camera)
    if kind == "act":
        from lerobot.policies.act.configuration_act import ACTConfig

        return ACTConfig(
            input_features=inputs, output_features=outputs, chunk_size=4, n_action_steps=2,
            pretrained_backbone_weights=None, dim_model=32, n_heads=2, dim_feedforward=64,
            n_encoder_layers=1, n_decoder_layers=1, use_vae=False, device="cpu",
        )  # fmt: skip
    if kind == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        return DiffusionConfig(
            input_features=inputs, output_features=outputs, n_obs_steps=2, horizon=8, n_action_steps=4,
            down_dims=(16, 32), pretrained_backbone_weights=None, crop_shape=None, num_inference_steps=3,
            diffusion_step_embed_dim=16, spatial_softmax_num_keypoints=8, device="cpu",
        )  # fmt: skip
    if kind == "smolvla":
        from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig

        return SmolVLAConfig(
            input_features=inputs, output_features=outputs, vlm_model_name=str(vlm), load_vlm_weights=False,
            chunk_size=4, n_action_steps=2, resize_imgs_with_padding=(IMAGE_PX, IMAGE_PX), num_steps=2,
            tokenizer_max_length=16, device="cpu",
        )  # fmt: skip
    raise ValueError(kind)


def save_policy(kind: str, dataset: Path, out: Path, seed: int = 0, **cfg_kwargs: Any) -> Path:
    """Build policy ``kind`` with random weights and save it as LeRobot's trainer does."""
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    vlm = write_tiny_vlm(out.parent / "tiny_vlm") if kind == "smolvla" else Path()
    config = make_config(kind, vlm, **cfg_kwargs)
    torch.manual_seed(seed)
    policy = get_policy_class(config.type)(config)
    stats = LeRobotDatasetMetadata(repo_id="local/demos", root=dataset).stats
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    policy.save_pretrained(out)
    preprocessor.save_pretrained(out)
    postprocessor.save_pretrained(out)
    return out
