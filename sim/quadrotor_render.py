"""Pictures of quadrotor flights: OpenCV frames and ``.mp4`` videos, and a matplotlib trajectory plot.

All inputs are numpy arrays in the frames of ``docs/conventions.md`` (world z up, quaternion
``(w, x, y, z)`` body -> world). Rendering is a plain pinhole projection drawn with OpenCV
lines, so it needs no GPU, no OpenGL and no display.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from embodied.errors import EmbodiedError
from embodied.sim.quadrotor import quat_to_rot
from embodied.sim.vehicle_variants import NOMINAL

# OpenCV colours are BGR.
_RED, _GREEN, _BLUE = (40, 40, 220), (40, 170, 40), (220, 90, 30)
_GREY, _DARK, _ORANGE = (200, 200, 200), (60, 60, 60), (0, 140, 255)
_BACKGROUND = (250, 248, 245)

ROTOR_RADIUS_M = 0.0225
"""Crazyflie 2.x propeller radius (45 mm propellers)."""


@dataclass(frozen=True)
class Camera:
    """Pinhole camera looking from ``eye_w`` at ``target_w`` with world z up."""

    eye_w: np.ndarray
    target_w: np.ndarray
    width_px: int = 640
    height_px: int = 480
    fov_deg: float = 50.0

    def project(self, points_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[K, 3]`` world points -> (``[K, 2]`` int pixels, ``[K]`` bool in front of the camera)."""
        forward = self.target_w - self.eye_w
        forward = forward / np.linalg.norm(forward)
        right = np.cross(forward, np.array([0.0, 0.0, 1.0]))
        right = right / np.linalg.norm(right)
        up = np.cross(right, forward)
        rel = np.asarray(points_w, dtype=np.float64) - self.eye_w
        depth = rel @ forward
        focal_px = 0.5 * self.height_px / math.tan(math.radians(self.fov_deg) / 2)
        safe = np.where(depth > 1e-6, depth, 1e-6)
        u = 0.5 * self.width_px + focal_px * (rel @ right) / safe
        v = 0.5 * self.height_px - focal_px * (rel @ up) / safe
        pixels = np.clip(np.stack([u, v], axis=1), -1e5, 1e5).round().astype(np.int32)
        return pixels, depth > 1e-6


def quat_to_matrix(quat_wb: np.ndarray) -> np.ndarray:
    """``(w, x, y, z)`` ``[4]`` or ``[T, 4]`` -> ``[3, 3]`` / ``[T, 3, 3]`` body -> world (normalized first)."""
    quat = torch.as_tensor(np.asarray(quat_wb, dtype=np.float64)).reshape(-1, 4)
    rot = quat_to_rot(torch.nn.functional.normalize(quat, dim=1)).reshape(-1, 3, 3).numpy()
    return rot[0] if np.ndim(quat_wb) == 1 else rot


def default_camera(setpoint_w: np.ndarray, width_px: int = 640, height_px: int = 480) -> Camera:
    """An oblique view from front-left-above of the setpoint, ~1.9 m away (sees the ±0.6 m box)."""
    target = np.asarray(setpoint_w, dtype=np.float64)
    return Camera(target + np.array([1.2, -1.2, 0.8]), target - np.array([0.0, 0.0, 0.15]), width_px, height_px)


def _polyline(img: np.ndarray, cam: Camera, points_w: np.ndarray, color: tuple[int, int, int], thick: int) -> None:
    pixels, visible = cam.project(points_w)
    for a, b, va, vb in zip(pixels[:-1], pixels[1:], visible[:-1], visible[1:]):
        if va and vb:
            cv2.line(img, (int(a[0]), int(a[1])), (int(b[0]), int(b[1])), color, thick, cv2.LINE_AA)


def render_frame(
    position_w: np.ndarray,
    quat_wb: np.ndarray,
    setpoint_w: np.ndarray,
    camera: Camera | None = None,
    arm_length_m: float = NOMINAL.arm_length_m,
    drone_scale: float = 3.0,
    ground_z_m: float = 0.0,
    trail_w: np.ndarray | None = None,
    label: str = "",
) -> np.ndarray:
    """One ``[H, W, 3]`` uint8 BGR image of the quadrotor at ``position_w [3]``, ``quat_wb [4]``.

    Draws a ground grid, the setpoint (orange cross), the past path ``trail_w [K, 3]``, the
    arms and rotors (M1/M3 counter-clockwise in red, M2/M4 clockwise in blue) and the body axes (x red, y green,
    z blue). The vehicle is drawn ``drone_scale`` times its size so a 92 mm frame stays visible.
    """
    setpoint = np.asarray(setpoint_w, dtype=np.float64)
    cam = camera or default_camera(setpoint)
    img = np.full((cam.height_px, cam.width_px, 3), _BACKGROUND, dtype=np.uint8)

    # Ground grid: 2.4 m square around the setpoint, 0.2 m pitch.
    ticks = np.linspace(-1.2, 1.2, 13)
    for t in ticks:
        for a, b in (((t, -1.2), (t, 1.2)), ((-1.2, t), (1.2, t))):
            seg = np.array(
                [
                    [setpoint[0] + a[0], setpoint[1] + a[1], ground_z_m],
                    [setpoint[0] + b[0], setpoint[1] + b[1], ground_z_m],
                ]
            )
            _polyline(img, cam, seg, _GREY, 1)

    cross = 0.06
    for axis in np.eye(3):
        _polyline(img, cam, np.stack([setpoint - cross * axis, setpoint + cross * axis]), _ORANGE, 2)
    if trail_w is not None and len(trail_w) > 1:
        _polyline(img, cam, np.asarray(trail_w, dtype=np.float64), _DARK, 1)

    pos = np.asarray(position_w, dtype=np.float64)
    rot = quat_to_matrix(quat_wb)
    # Shadow straight below, so height is readable in a single view.
    _polyline(img, cam, np.array([pos, [pos[0], pos[1], ground_z_m]]), _GREY, 1)

    d = drone_scale * arm_length_m / math.sqrt(2.0)
    rotors_b = np.array([[d, -d, 0.0], [-d, -d, 0.0], [-d, d, 0.0], [d, d, 0.0]])  # M1..M4
    circle = np.linspace(0.0, 2.0 * math.pi, 17)
    ring_b = drone_scale * ROTOR_RADIUS_M * np.stack([np.cos(circle), np.sin(circle), np.zeros_like(circle)], axis=1)
    for i, rotor_b in enumerate(rotors_b):
        rotor_w = pos + rot @ rotor_b
        _polyline(img, cam, np.stack([pos, rotor_w]), _DARK, 3)
        _polyline(img, cam, rotor_w + (rot @ ring_b.T).T, _RED if i % 2 == 0 else _BLUE, 2)
    axis_len = 2.0 * d
    for axis, color in zip(np.eye(3), (_RED, _GREEN, _BLUE)):
        _polyline(img, cam, np.stack([pos, pos + axis_len * (rot @ axis)]), color, 2)

    if label:
        cv2.putText(img, label, (10, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.55, _DARK, 1, cv2.LINE_AA)
    return img


def open_video_writer(path: Path | str, fps: float, width_px: int, height_px: int) -> cv2.VideoWriter:
    """An OpenCV ``mp4v`` writer (H.264/``avc1`` is not available in the pip OpenCV build)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), float(fps), (width_px, height_px))
    if not writer.isOpened():
        raise EmbodiedError(f"cannot open video writer for {path} (codec mp4v, {width_px}x{height_px} @ {fps} fps)")
    return writer


def render_video(
    position_w: np.ndarray,
    quat_wb: np.ndarray,
    setpoint_w: np.ndarray,
    path: Path | str,
    fps: float = 50.0,
    width_px: int = 640,
    height_px: int = 480,
    time_s: np.ndarray | None = None,
) -> Path:
    """Write an ``.mp4`` of a flight, one frame per row of ``position_w [T, 3]`` / ``quat_wb [T, 4]``.

    ``time_s [T]`` (optional) labels each frame with time and distance to the setpoint. Returns
    the path written.
    """
    position_w = np.asarray(position_w, dtype=np.float64)
    quat_wb = np.asarray(quat_wb, dtype=np.float64)
    if position_w.ndim != 2 or position_w.shape[1] != 3 or quat_wb.shape != (len(position_w), 4):
        raise EmbodiedError(
            f"render_video expects position_w [T, 3] and quat_wb [T, 4], got {position_w.shape} and {quat_wb.shape}"
        )
    setpoint = np.asarray(setpoint_w, dtype=np.float64)
    cam = default_camera(setpoint, width_px, height_px)
    writer = open_video_writer(path, fps, width_px, height_px)
    try:
        for t in range(len(position_w)):
            label = ""
            if time_s is not None:
                err_m = float(np.linalg.norm(position_w[t] - setpoint))
                label = f"t = {float(time_s[t]):5.2f} s   |pos - setpoint| = {err_m:.3f} m"
            writer.write(
                render_frame(position_w[t], quat_wb[t], setpoint, cam, trail_w=position_w[: t + 1], label=label)
            )
    finally:
        writer.release()
    return Path(path)


def plot_trajectory(time_s: np.ndarray, position_w: np.ndarray, setpoint_w: np.ndarray, path: Path | str) -> Path:
    """PNG with position vs time per axis (setpoint dashed) and the 3-D path. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    time_s = np.asarray(time_s, dtype=np.float64)
    position_w = np.asarray(position_w, dtype=np.float64)
    setpoint = np.asarray(setpoint_w, dtype=np.float64)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=(11, 4.5))
    try:
        ax = fig.add_subplot(1, 2, 1)
        for i, (name, color) in enumerate(zip("xyz", ("tab:red", "tab:green", "tab:blue"))):
            ax.plot(time_s, position_w[:, i], color=color, label=f"{name}_w")
            ax.axhline(setpoint[i], color=color, linestyle="--", linewidth=0.8)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("position (m)")
        ax.set_title("position vs time (dashed: setpoint)")
        ax.legend(loc="best")
        ax.grid(alpha=0.3)
        ax3 = fig.add_subplot(1, 2, 2, projection="3d")
        ax3.plot(position_w[:, 0], position_w[:, 1], position_w[:, 2], color="0.3")
        ax3.scatter(*position_w[0], color="tab:green", label="start")
        ax3.scatter(*position_w[-1], color="tab:red", label="end")
        ax3.scatter(*setpoint, color="tab:orange", marker="*", s=120, label="setpoint")
        ax3.set_xlabel("x (m)")
        ax3.set_ylabel("y (m)")
        ax3.set_zlabel("z (m)")
        ax3.set_title("3-D path")
        ax3.legend(loc="upper left")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
