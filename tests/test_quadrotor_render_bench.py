"""Quadrotor pictures (frames, mp4, trajectory PNG) and the ``embodied bench`` command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest

from embodied.cli import main
from embodied.sim.quadrotor_render import default_camera, plot_trajectory, render_frame, render_video

SETPOINT = np.array([0.0, 0.0, 1.0])
LEVEL_QUAT_WB = np.array([1.0, 0.0, 0.0, 0.0])  # w, x, y, z: body axes along the world axes


def test_camera_centres_its_target_and_keeps_z_up() -> None:
    cam = default_camera(SETPOINT)
    pixels, visible = cam.project(np.stack([cam.target_w, cam.target_w + np.array([0.0, 0.0, 0.1])]))
    assert visible.all()
    assert tuple(pixels[0]) == (cam.width_px // 2, cam.height_px // 2)
    assert pixels[1, 1] < pixels[0, 1]  # higher in the world is higher in the image


def test_frame_draws_the_vehicle_where_it_is() -> None:
    cam = default_camera(SETPOINT)
    empty = render_frame(SETPOINT + np.array([0.3, 0.0, 0.0]), LEVEL_QUAT_WB, SETPOINT, cam, drone_scale=0.0)
    for offset in ([0.3, 0.0, 0.0], [-0.3, 0.2, 0.1]):
        pos = SETPOINT + np.array(offset)
        img = render_frame(pos, LEVEL_QUAT_WB, SETPOINT, cam)
        assert img.shape == (cam.height_px, cam.width_px, 3) and img.dtype == np.uint8
        pixels, _ = cam.project(pos[None])
        u0, v0 = int(pixels[0, 0]), int(pixels[0, 1])
        changed = np.abs(img.astype(int) - empty.astype(int)).sum(axis=2) > 0
        near = changed[v0 - 30 : v0 + 30, u0 - 30 : u0 + 30].sum()
        assert near > 100  # arms and rotors around the projected centre
        assert changed.sum() < 3 * near + 2000  # and not scattered elsewhere


def test_video_and_plot_files(tmp_path: Path) -> None:
    t_count = 12
    time_s = np.arange(t_count) * 0.01
    position_w = SETPOINT + np.stack([0.2 * np.sin(time_s * 20), np.zeros(t_count), 0.1 * time_s], axis=1)
    angle = np.linspace(0.0, math.pi / 3, t_count)
    quat_wb = np.stack([np.cos(angle / 2), np.sin(angle / 2), np.zeros(t_count), np.zeros(t_count)], axis=1)
    video = render_video(position_w, quat_wb, SETPOINT, tmp_path / "v" / "flight.mp4", fps=25, time_s=time_s)
    cap = cv2.VideoCapture(str(video))
    try:
        assert int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) == t_count
        ok, frame = cap.read()
        assert ok and frame.shape == (480, 640, 3)
    finally:
        cap.release()
    png = plot_trajectory(time_s, position_w, SETPOINT, tmp_path / "traj.png")
    image = cv2.imread(str(png))
    assert image is not None and image.shape[0] > 200 and image.shape[1] > 400


def test_render_video_rejects_bad_shapes(tmp_path: Path) -> None:
    from embodied.errors import EmbodiedError

    with pytest.raises(EmbodiedError, match="quat_wb"):
        render_video(np.zeros((5, 3)), np.zeros((4, 4)), SETPOINT, tmp_path / "x.mp4")


def test_bench_sim_quadrotor_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "sim", "quadrotor", "--num-envs", "2,8", "--steps", "3", "--repeats", "2", "--no-compile"]
    assert main([*argv, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["num_envs"] for r in results] == [2, 8]
    for r in results:
        assert r["steps_per_s"] > 0 and r["compile"] is False and len(r["steps_per_s_repeats"]) == 2
    assert main(["bench", "sim", "quadrotor", "--num-envs", "4", "--steps", "2", "--repeats", "1", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)
    assert isinstance(single, dict) and single["num_envs"] == 4 and single["compile"] is False  # auto: small


def test_bench_env_quad_hover_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["bench", "env", "quad-hover", "--num-envs", "16", "--steps", "5", "--repeats", "1", "--no-compile"]) == 0
    )
    assert "M steps/s" in capsys.readouterr().out
    assert main(["bench", "sim", "quadrotr", "--num-envs", "4"]) == 2
    assert main(["bench", "env", "quad-hovr", "--num-envs", "4"]) == 2
