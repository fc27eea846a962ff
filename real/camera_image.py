"""A ``sensor_msgs/Image`` (or ``CompressedImage``) as the uint8 picture an image policy reads:
``[H, W, C]``, row 0 at the top, RGB channel order (``policy_io.json`` ``image_input``; what the
simulator's cameras render, see docs/conventions.md, "Camera images").

ROS images are row-major with row 0 at the top (REP 118 / ``sensor_msgs/Image``), each row
``step`` bytes long (a driver may pad rows). Encodings read here: ``rgb8``, ``bgr8``, ``rgba8``,
``bgra8`` (alpha dropped) and ``mono8`` (for a one-channel policy only: a grey picture is not
the colour one the policy learned from). A picture of another size is refused, naming both
sizes, unless the robot config's ``camera.resize`` is set: then it is scaled with OpenCV's area
interpolation (imported only then), which averages the pixels a target pixel covers, the closest
to what a camera with fewer pixels would record.

A ``sensor_msgs/CompressedImage`` (``image_transport``'s ``compressed`` topics: JPEG or PNG in
``data``, ``format`` naming them) is decoded with OpenCV (imported only for it). JPEG is lossy:
the policy then sees compression artefacts it never saw in simulation; PNG is exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embodied.real.observation import ObservationError

CHANNEL_ORDER: dict[str, tuple[int, ...]] = {
    "rgb8": (0, 1, 2),
    "bgr8": (2, 1, 0),
    "rgba8": (0, 1, 2),
    "bgra8": (2, 1, 0),
    "mono8": (0,),
}
"""Encoding -> indices of R, G, B (or grey) among the message's channels."""
CHANNELS_IN_MESSAGE = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}


def decode_image(
    message: Any, shape_hwc: tuple[int, int, int], resize: bool = False, name: str = "camera"
) -> np.ndarray:
    """``message`` (``sensor_msgs/Image``) -> ``[H, W, C]`` uint8 of ``shape_hwc``, a fresh array.

    Raises :class:`ObservationError` naming the input ``name`` for an unknown encoding, a size or
    channel count the policy cannot read, or a data length that does not match ``step x height``.
    """
    channels = shape_hwc[2]
    if not hasattr(message, "encoding") and hasattr(message, "format"):
        return _decode_compressed(message, shape_hwc, resize, name)
    encoding = str(message.encoding).lower()
    if encoding not in CHANNEL_ORDER:
        raise ObservationError(
            f"{name}: image encoding {message.encoding!r} is not read here; publish one of "
            f"{', '.join(CHANNEL_ORDER)} (e.g. through image_proc / a debayer node)"
        )
    order = CHANNEL_ORDER[encoding]
    if len(order) != channels:
        raise ObservationError(
            f"{name}: the policy reads {channels}-channel images, the camera publishes {encoding} "
            f"({len(order)} channel{'s' if len(order) > 1 else ''}); convert in the camera driver"
        )
    rows, cols, step = int(message.height), int(message.width), int(message.step)
    in_message = CHANNELS_IN_MESSAGE[encoding]
    data = _raw_bytes(message.data)
    if rows <= 0 or cols <= 0 or step < cols * in_message or data.size != step * rows:
        raise ObservationError(
            f"{name}: malformed image: {rows}x{cols} {encoding}, step {step}, {data.size} bytes "
            f"(want step >= {cols * in_message} and step x height bytes)"
        )
    pixels = data.reshape(rows, step)[:, : cols * in_message].reshape(rows, cols, in_message)[:, :, list(order)]
    return _sized(pixels, shape_hwc, resize, name)


def _raw_bytes(raw: Any) -> np.ndarray:
    """``data`` of a message as a flat uint8 array: a list over Cyclone DDS, ``array('B')`` or
    ``bytes`` from rclpy, numpy from rosbags."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return np.frombuffer(raw, dtype=np.uint8)
    return np.asarray(raw, dtype=np.uint8).reshape(-1)


def _decode_compressed(message: Any, shape_hwc: tuple[int, int, int], resize: bool, name: str) -> np.ndarray:
    import cv2  # only for compressed pictures: the deploy runtime does not need it otherwise

    channels = shape_hwc[2]
    flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    decoded = cv2.imdecode(_raw_bytes(message.data), flag)
    if decoded is None:
        raise ObservationError(
            f"{name}: compressed image (format {str(message.format)!r}, {len(message.data)} bytes) does not decode "
            "as JPEG or PNG"
        )
    pixels = decoded.reshape(decoded.shape[0], decoded.shape[1], -1)
    if channels == 3:
        pixels = pixels[:, :, ::-1]  # OpenCV decodes to BGR
    return _sized(pixels, shape_hwc, resize, name)


def _sized(pixels: np.ndarray, shape_hwc: tuple[int, int, int], resize: bool, name: str) -> np.ndarray:
    """``pixels [rows, cols, C]`` at the policy's size (scaled when ``resize``, else refused)."""
    height, width, _ = shape_hwc
    rows, cols = pixels.shape[:2]
    if (rows, cols) != (height, width):
        if not resize:
            raise ObservationError(
                f"{name}: image is {rows}x{cols} (height x width), the policy reads {height}x{width}; "
                "resize it before it reaches the node, or set camera.resize: true in the robot config"
            )
        import cv2  # only for resizing: the deploy runtime does not need it otherwise

        scaled = cv2.resize(pixels, (width, height), interpolation=cv2.INTER_AREA)
        return np.ascontiguousarray(np.asarray(scaled, dtype=np.uint8).reshape(height, width, -1))
    return np.ascontiguousarray(pixels, dtype=np.uint8)
