"""A ``sensor_msgs/Image`` as the uint8 picture an image policy reads: ``[H, W, C]``, row 0 at
the top, RGB channel order (``policy_io.json`` ``image_input``; what the simulator's cameras
render, see docs/conventions.md, "Camera images").

ROS images are row-major with row 0 at the top (REP 118 / ``sensor_msgs/Image``), each row
``step`` bytes long (a driver may pad rows). Encodings read here: ``rgb8``, ``bgr8``, ``rgba8``,
``bgra8`` (alpha dropped) and ``mono8`` (for a one-channel policy only: a grey picture is not
the colour one the policy learned from). A picture of another size is refused, naming both
sizes, unless the robot config's ``camera.resize`` is set: then it is scaled with OpenCV's area
interpolation (imported only then), which averages the pixels a target pixel covers, the closest
to what a camera with fewer pixels would record.
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
    height, width, channels = shape_hwc
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
    raw = message.data  # a list over Cyclone DDS, array('B') or bytes from rclpy, numpy from rosbags
    if isinstance(raw, (bytes, bytearray, memoryview)):
        data = np.frombuffer(raw, dtype=np.uint8)
    else:
        data = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if rows <= 0 or cols <= 0 or step < cols * in_message or data.size != step * rows:
        raise ObservationError(
            f"{name}: malformed image: {rows}x{cols} {encoding}, step {step}, {data.size} bytes "
            f"(want step >= {cols * in_message} and step x height bytes)"
        )
    pixels = data.reshape(rows, step)[:, : cols * in_message].reshape(rows, cols, in_message)[:, :, list(order)]
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
