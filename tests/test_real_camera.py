"""Camera input of the deploy node: ``sensor_msgs/Image`` decoding, the robot config's ``camera``
key, and an image policy flown through the node on arm-push's rendered top camera, commanding
what the export computes on the task's own observation and picture."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flow_deploy_support import ARM_ROBOT, fly_arm_push
from real_support import write_robot_variant

from embodied.config import ConfigError
from embodied.env import IMAGE_GROUP
from embodied.errors import MissingDependencyError
from embodied.policies.actor_critic import ActorCritic
from embodied.real import messages
from embodied.real.camera_image import decode_image
from embodied.real.observation import ObservationError
from embodied.real.robot_config import load_robot
from embodied.real.sim_state import image_message
from embodied.tasks.arm_push import ArmPush, ArmPushCfg

SIZE_PX = 40
CAMERA_INPUT = {"topic": "arm/top_camera/image_raw", "type": "sensor_msgs/msg/Image", "qos": "sensor"}


def _image(encoding: str, pixels: np.ndarray, pad: int = 0) -> Any:
    height, width = pixels.shape[:2]
    row = pixels.reshape(height, -1)
    step = row.shape[1] + pad
    data = np.zeros((height, step), dtype=np.uint8)
    data[:, : row.shape[1]] = row
    values = {"height": height, "width": width, "encoding": encoding, "step": step, "data": data.reshape(-1)}
    return messages.make("sensor_msgs/msg/Image", values)


def _rgb(height: int = 4, width: int = 6) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=(height, width, 3), dtype=np.uint8)


@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
def test_every_colour_encoding_decodes_to_the_rgb_picture(encoding: str) -> None:
    rgb = _rgb()
    pixels = rgb[:, :, ::-1] if encoding.startswith("bgr") else rgb
    if encoding.endswith("a8"):
        pixels = np.concatenate([pixels, np.full((*rgb.shape[:2], 1), 7, dtype=np.uint8)], axis=2)
    got = decode_image(_image(encoding, pixels, pad=5), rgb.shape)
    np.testing.assert_array_equal(got, rgb)
    assert got.flags.c_contiguous and got.dtype == np.uint8


def test_compressed_pictures_decode_png_exactly_and_jpeg_closely() -> None:
    import cv2

    rows, cols = np.meshgrid(np.arange(16), np.arange(24), indexing="ij")
    rgb = np.stack([rows * 12, cols * 9, np.full_like(rows, 128)], axis=-1).astype(np.uint8)  # smooth: JPEG keeps it
    for codec, tolerance in ((".png", 0.0), (".jpg", 3.0)):
        ok, encoded = cv2.imencode(codec, np.ascontiguousarray(rgb[:, :, ::-1]))  # OpenCV encodes BGR
        assert ok
        message = messages.make(
            "sensor_msgs/msg/CompressedImage",
            {"format": f"rgb8; {codec[1:]} compressed bgr8", "data": encoded.reshape(-1)},
        )
        got = decode_image(message, rgb.shape)
        assert got.shape == rgb.shape and np.abs(got.astype(float) - rgb).mean() <= tolerance, codec
    garbage = messages.make(
        "sensor_msgs/msg/CompressedImage", {"format": "jpeg", "data": np.arange(50, dtype=np.uint8)}
    )
    with pytest.raises(ObservationError, match=r"compressed image \(format 'jpeg', 50 bytes\) does not decode"):
        decode_image(garbage, rgb.shape)


def test_bytes_data_as_rclpy_may_deliver_it_decodes_the_same() -> None:
    rgb = _rgb()
    message = _image("rgb8", rgb, pad=2)
    message.data = bytes(message.data)
    np.testing.assert_array_equal(decode_image(message, rgb.shape), rgb)


def test_a_picture_over_loopback_dds_decodes_to_what_was_sent() -> None:
    """A real Cyclone DDS peer publishes the picture; the node's transport receives and decodes it."""
    import threading

    from real_support import free_domain_id

    from embodied.real.transports.dds import DdsTransport

    domain = free_domain_id()
    sender, receiver = DdsTransport(domain, loopback=True), DdsTransport(domain, loopback=True)
    try:
        got: list[Any] = []
        arrived = threading.Event()

        def on_image(message: Any) -> None:
            got.append(message)
            arrived.set()

        receiver.subscribe(CAMERA_INPUT["topic"], CAMERA_INPUT["type"], "sensor", on_image)
        publish = sender.publisher(CAMERA_INPUT["topic"], CAMERA_INPUT["type"], "sensor")
        assert sender.wait_for_subscribers(publish, timeout_s=10.0)
        rgb = np.random.default_rng(1).integers(0, 256, size=(SIZE_PX, SIZE_PX, 3), dtype=np.uint8)
        publish(image_message(rgb, {"frame_id": "top_camera", "stamp": {"sec": 1, "nanosec": 5}}))
        assert arrived.wait(5.0)
        np.testing.assert_array_equal(decode_image(got[0], rgb.shape), rgb)
    finally:
        sender.close()
        receiver.close()


def test_pictures_the_policy_cannot_read_are_named() -> None:
    rgb = _rgb()
    with pytest.raises(ObservationError, match=r"cam: image encoding 'bayer_rggb8'.*rgb8"):
        decode_image(_image("bayer_rggb8", rgb[:, :, 0]), rgb.shape, name="cam")
    with pytest.raises(ObservationError, match=r"3-channel images, the camera publishes mono8 \(1 channel\)"):
        decode_image(_image("mono8", rgb[:, :, 0]), rgb.shape)
    with pytest.raises(
        ObservationError, match=r"image is 4x6 \(height x width\), the policy reads 2x3.*camera\.resize"
    ):
        decode_image(_image("rgb8", rgb), (2, 3, 3))
    short = _image("rgb8", rgb)
    short.data = short.data[:-1]
    with pytest.raises(ObservationError, match=r"malformed image: 4x6 rgb8, step 18, 71 bytes"):
        decode_image(short, rgb.shape)


def test_resize_averages_the_pixels_each_target_pixel_covers() -> None:
    rgb = _rgb(8, 12)
    got = decode_image(_image("rgb8", rgb), (4, 6, 3), resize=True)
    blocks = rgb.reshape(4, 2, 6, 2, 3).astype(np.float64).mean(axis=(1, 3))
    assert np.abs(got.astype(np.float64) - blocks).max() <= 0.5 + 1e-9  # rounded to uint8


def test_robot_config_camera_key_is_checked(tmp_path: Path) -> None:
    with_input = {"inputs.top_camera": CAMERA_INPUT}
    robot = load_robot(write_robot_variant(tmp_path, ARM_ROBOT, {**with_input, "camera": {"input": "top_camera"}}))
    assert robot.camera is not None and robot.camera.input == "top_camera" and not robot.camera.resize
    assert load_robot(ARM_ROBOT).camera is None
    cases = {
        "camera.input: unknown input 'top_cam'": {**with_input, "camera": {"input": "top_cam"}},
        "input 'joints' carries sensor_msgs/msg/JointState; a camera input carries sensor_msgs/msg/Image or": {
            "camera": {"input": "joints"}
        },
        "camera.resize: expected true or false": {**with_input, "camera": {"input": "top_camera", "resize": "yes"}},
    }
    for message, edits in cases.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_robot(write_robot_variant(tmp_path, ARM_ROBOT, edits))


def _camera_env(seed: int) -> ArmPush:
    cfg = ArmPushCfg()
    backend = dataclasses.replace(cfg.backend, camera="top", image_size_px=SIZE_PX)
    try:
        return ArmPush(dataclasses.replace(cfg, backend=backend), num_envs=1, device="cpu", seed=seed)
    except MissingDependencyError as err:  # names the Debian packages (EGL or OSMesa)
        pytest.skip(str(err))


def _export_image_policy(export: Path) -> None:
    """A PPO image policy (``encoder: cnn``, random weights, the task's normalizer statistics)
    exported with the project's image exporter."""
    from embodied.export.image_onnx import export_image_onnx

    env = _camera_env(seed=0)
    obs = env.reset(seed=0)
    spec = env.io_spec()
    env.close()
    torch.manual_seed(0)
    dim = obs["policy"].shape[1]
    image_shape = tuple(obs[IMAGE_GROUP].shape[1:])
    policy = ActorCritic(dim, dim, spec.action_dim, actor_hidden=(32, 32), image_shape=image_shape, image_features=16)
    assert policy.actor_norm is not None
    policy.actor_norm.update(torch.randn(64, dim) * 0.3)
    export_image_onnx(policy.export_module(), spec, export, camera="top")


def test_an_image_policy_flies_arm_push_through_the_node_on_the_camera_picture(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    _export_image_policy(tmp_path / "export")
    robot = write_robot_variant(
        tmp_path, ARM_ROBOT, {"inputs.top_camera": CAMERA_INPUT, "camera": {"input": "top_camera"}}
    )
    # The test's power: the policy's action moves with the picture (its colour order included).
    from embodied.real.runner import PolicyRunner

    env = _camera_env(seed=3)
    first = env.reset(seed=3)
    obs, image = first["policy"][0].numpy(), first[IMAGE_GROUP][0].numpy()
    runner = PolicyRunner(tmp_path / "export")
    assert np.abs(runner(obs, image) - runner(obs, np.ascontiguousarray(image[:, :, ::-1]))).max() > 1e-3
    result = fly_arm_push(tmp_path / "export", episodes=1, seed=3, robot_path=robot, env=env)
    assert result.episodes == 1 and result.steps >= 10 and result.rejections == 0
    # the node decoded the bgr8, row-padded picture to the RGB one the policy reads: the same actions
    assert result.max_action_diff <= 1e-4, result


def test_gap_hold_watches_every_input_but_the_camera_unless_named(tmp_path: Path) -> None:
    """A camera slower than the control loop leaves periods without a picture that are not gaps."""
    pytest.importorskip("onnxruntime")
    from embodied.real.node import PolicyNode
    from embodied.real.runner import PolicyRunner
    from embodied.real.transports.memory import MemoryTransport

    _export_image_policy(tmp_path / "export")
    camera = {"inputs.top_camera": CAMERA_INPUT, "camera": {"input": "top_camera"}}
    for gap_hold, camera_watched in (({}, False), ({"inputs": ["top_camera", "joints"]}, True)):
        robot = load_robot(write_robot_variant(tmp_path, ARM_ROBOT, {**camera, "safety.gap_hold": gap_hold}))
        node = PolicyNode(MemoryTransport(), robot, PolicyRunner(tmp_path / "export"))
        assert (node.gates["top_camera"].gap_s is not None) == camera_watched
        assert node.gates["joints"].gap_s is not None


def test_an_image_policy_on_a_robot_without_a_camera_is_refused_naming_the_key(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from embodied.real.node import PolicyNode
    from embodied.real.runner import DeployUnsupportedError, PolicyRunner, check_deployable
    from embodied.real.transports.memory import MemoryTransport

    _export_image_policy(tmp_path / "export")
    robot = load_robot(ARM_ROBOT)
    want = rf"reads camera images \(image_input {SIZE_PX}x{SIZE_PX}x3 uint8 from camera 'top'\).*{ARM_ROBOT}.*camera: \{{input: NAME\}}"
    with pytest.raises(DeployUnsupportedError, match=want):
        check_deployable(tmp_path, robot)
    with pytest.raises(DeployUnsupportedError, match=want):
        PolicyNode(MemoryTransport(), robot, PolicyRunner(tmp_path / "export"))
    runner = PolicyRunner(tmp_path / "export")
    with pytest.raises(Exception, match="reads a camera image with each observation"):
        runner(np.zeros(runner.io_spec.obs_dim, dtype=np.float32))
    assert image_message(np.zeros((2, 2, 3), dtype=np.uint8), {}).step == 10  # the helper pads rows


def test_an_instruction_policy_without_an_instruction_to_feed_is_refused_by_name(tmp_path: Path) -> None:
    """An export whose ``instruction_input`` carries no training embedding (exported before it did),
    on a robot config without ``instruction:``: refused naming both; a graph without the input
    the file names is refused by the runner."""
    import json

    from embodied.policy_io import INSTRUCTION_INPUT_KEY
    from embodied.real.runner import DeployUnsupportedError, PolicyRunner, check_deployable

    _export_image_policy(tmp_path / "export")
    path = tmp_path / "export" / "policy_io.json"
    data = json.loads(path.read_text())
    data[INSTRUCTION_INPUT_KEY] = {"name": "instruction_embedding", "size": 32}
    path.write_text(json.dumps(data))
    robot = load_robot(
        write_robot_variant(tmp_path, ARM_ROBOT, {"inputs.top_camera": CAMERA_INPUT, "camera": {"input": "top_camera"}})
    )
    want = r"instruction embedding \(instruction_input 'instruction_embedding' \[32\]\).*set `instruction: TEXT`"
    with pytest.raises(DeployUnsupportedError, match=want):
        check_deployable(tmp_path, robot)
    with pytest.raises(Exception, match=r"names input 'instruction_embedding' \[32\].*re-export"):
        PolicyRunner(tmp_path / "export")


def test_sim_robot_serves_arm_push_with_its_camera_in_lockstep(tmp_path: Path) -> None:
    """``embodied sim-robot arm-push``'s simulator against the node, in one process (in-process
    transport, real threads, simulation time on /clock): every step applies the node's answer
    to the state it published, and that answer is what the export computes on the task's own
    observation and picture."""
    pytest.importorskip("onnxruntime")
    import threading

    from embodied.real.freshness import SimClock
    from embodied.real.node import PolicyNode
    from embodied.real.runner import PolicyRunner
    from embodied.real.sim_robot import SimRobot
    from embodied.real.transports.memory import MemoryTransport

    _export_image_policy(tmp_path / "export")
    robot = load_robot(
        write_robot_variant(tmp_path, ARM_ROBOT, {"inputs.top_camera": CAMERA_INPUT, "camera": {"input": "top_camera"}})
    )
    transport = MemoryTransport()
    sim_clock = SimClock()
    transport.subscribe(SimClock.TOPIC, SimClock.TYPE, "sensor", sim_clock.on_clock)
    node = PolicyNode(transport, robot, PolicyRunner(tmp_path / "export"), sim_clock=sim_clock)
    env = _camera_env(seed=3)
    sim = SimRobot(env, robot, transport, "arm-push")
    direct = PolicyRunner(tmp_path / "export")
    worst: list[float] = []

    def check(obs: Any, action: np.ndarray) -> None:
        want = direct(obs["policy"][0].numpy(), obs[IMAGE_GROUP][0].numpy())
        worst.append(float(np.max(np.abs(action - want))))

    stop = threading.Event()
    worker = threading.Thread(target=node.run, args=(stop,), daemon=True)
    worker.start()
    try:
        summary = sim.run(seconds=60.0, episodes=1, seed=3, on_step=check)
    finally:
        stop.set()
        worker.join(timeout=5.0)
        env.close()
    assert summary.episodes == 1 and summary.missed_commands == 0 and summary.safe_commands == 0
    assert len(worst) == summary.steps >= 10
    assert max(worst) <= 1e-4, max(worst)  # float64 message arithmetic against the task's float32
    assert sum(node.rejections.values()) == 0
