"""ROS 2 wire format: Cyclone DDS structs generated from rosbags' definitions serialize to
exactly rosbags' CDR bytes, ROS 2 naming, a pub/sub round trip over loopback DDS, and a node
over DDS that stays up on malformed input."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from real_support import ARM_JOINTS, arm_io_spec, export_policy, free_domain_id, joint_state, odometry

from embodied.real import messages
from embodied.real.deploy import build_node
from embodied.real.robot_config import builtin_robots, load_robot
from embodied.real.safety import SafetyState
from embodied.real.transports.dds import DdsTransport, idl_struct, to_idl

ESTOP_TYPE = "std_msgs/msg/Bool"


def _samples() -> dict[str, Any]:
    """A populated message of every type the runtime sends or receives (odd sizes exercise padding)."""
    odom = odometry((1.5, -2.0, 0.25), (0.1, 0.2, 0.3, 0.927), (0.5, 0.0, -0.1), (0.01, 0.02, 3.0))
    odom.header.stamp.sec, odom.header.stamp.nanosec = 1_700_000_000, 123_456_789
    odom.pose.covariance[:] = np.arange(36) * 0.5
    return {
        "nav_msgs/msg/Odometry": odom,
        "sensor_msgs/msg/JointState": joint_state(["a", "bb", "ccc"], [0.1, -0.2, 0.3], [1.0, 2.0, 3.0]),
        "std_msgs/msg/Float32MultiArray": messages.make(
            "std_msgs/msg/Float32MultiArray",
            {"layout": {"dim": [{"label": "motors", "size": 4, "stride": 4}]}, "data": [1.0, 2.5, -3.0, 1e4]},
        ),
        "std_msgs/msg/Float64MultiArray": messages.make(
            "std_msgs/msg/Float64MultiArray", {"layout": {"data_offset": 1}, "data": [0.1, 0.2, 0.3, 0.4, 0.5]}
        ),
        ESTOP_TYPE: messages.make(ESTOP_TYPE, {"data": True}),
        # The moving goal of quad-track (real/robots/crazyflie_track.yaml).
        "geometry_msgs/msg/PoseStamped": messages.make(
            "geometry_msgs/msg/PoseStamped",
            {
                "header": {"stamp": {"sec": 7, "nanosec": 5}, "frame_id": "world"},
                "pose": {"position": {"x": 0.5, "y": -0.25, "z": 1.0}, "orientation": {"z": 0.6, "w": 0.8}},
            },
        ),
        "geometry_msgs/msg/TwistStamped": messages.make(
            "geometry_msgs/msg/TwistStamped",
            {"header": {"frame_id": "w"}, "twist": {"linear": {"x": 1.25, "y": -0.5}, "angular": {"z": 0.1}}},
        ),
        # The tracked points of arm-push (real/robots/arm_push_sim.yaml).
        "geometry_msgs/msg/PointStamped": messages.make(
            "geometry_msgs/msg/PointStamped",
            {"header": {"stamp": {"sec": 3, "nanosec": 9}, "frame_id": "base"}, "point": {"x": 0.45, "y": -0.1}},
        ),
        # A camera picture (real/camera_image.py): 3x5 bgr8, rows padded to 16 bytes.
        "sensor_msgs/msg/Image": messages.make(
            "sensor_msgs/msg/Image",
            {
                "header": {"stamp": {"sec": 11, "nanosec": 13}, "frame_id": "camera"},
                "height": 3,
                "width": 5,
                "encoding": "bgr8",
                "step": 16,
                "data": np.arange(48, dtype=np.uint8),
            },
        ),
        "sensor_msgs/msg/CompressedImage": messages.make(
            "sensor_msgs/msg/CompressedImage",
            {
                "header": {"frame_id": "camera"},
                "format": "rgb8; jpeg compressed bgr8",
                "data": np.arange(13, dtype=np.uint8),
            },
        ),
        "geometry_msgs/msg/AccelStamped": messages.make(
            "geometry_msgs/msg/AccelStamped",
            {"header": {"frame_id": "abc"}, "accel": {"linear": {"x": -2.0, "z": 0.3}}},
        ),
    }


def test_every_type_in_builtin_robot_configs_is_covered() -> None:
    used = {ESTOP_TYPE}
    for name in builtin_robots():
        robot = load_robot(name)
        used |= {i.type for i in robot.inputs.values()} | {robot.command.type}
    assert used <= set(_samples()), f"add a wire test sample for {sorted(used - set(_samples()))}"


@pytest.mark.parametrize("type_name", sorted(_samples()))
def test_cyclone_struct_bytes_equal_rosbags_cdr(type_name: str) -> None:
    message = _samples()[type_name]
    reference = messages.serialize(message, type_name)
    ours = to_idl(message, type_name).serialize()
    assert ours == reference
    assert reference[:4] == b"\x00\x01\x00\x00"  # CDR little endian encapsulation, as ROS 2 sends
    # And the other way: Cyclone's decoder reads rosbags' bytes back to the same values.
    decoded = idl_struct(type_name).deserialize(reference)
    assert (
        messages.serialize(messages.typestore().deserialize_cdr(decoded.serialize(), type_name), type_name) == reference
    )


def test_known_sizes_of_probe_messages() -> None:
    twist = messages.make("geometry_msgs/msg/Twist", {"linear": {"x": 1.0}})
    assert len(to_idl(twist, "geometry_msgs/msg/Twist").serialize()) == 52


def test_ros2_dds_names() -> None:
    assert messages.dds_type_name("nav_msgs/msg/Odometry") == "nav_msgs::msg::dds_::Odometry_"
    assert messages.dds_topic_name("/cf/odom") == "rt/cf/odom"
    assert idl_struct("std_msgs/msg/Float32MultiArray").__idl_typename__ == "std_msgs::msg::dds_::Float32MultiArray_"


def test_unknown_type_names_closest_match() -> None:
    with pytest.raises(Exception, match="nav_msgs/msg/Odometry"):
        messages.check_type("nav_msgs/msg/Odometri")


def test_pubsub_round_trip_over_loopback_dds() -> None:
    domain = free_domain_id()
    sender, receiver = DdsTransport(domain, loopback=True), DdsTransport(domain, loopback=True)
    got: list[Any] = []
    arrived = threading.Event()

    def on_message(m: Any) -> None:
        got.append(m)
        arrived.set()

    receiver.subscribe("/cf/odom", "nav_msgs/msg/Odometry", "sensor", on_message)
    publish = sender.publisher("/cf/odom", "nav_msgs/msg/Odometry", "reliable")
    assert sender.wait_for_subscribers(publish, timeout_s=10.0)
    sent = _samples()["nav_msgs/msg/Odometry"]
    publish(sent)
    assert arrived.wait(5.0)
    assert to_idl(sent, "nav_msgs/msg/Odometry").serialize() == got[0].serialize()
    np.testing.assert_allclose(messages.to_vector(got[0].pose.pose.position), [1.5, -2.0, 0.25])
    sender.close()
    receiver.close()


def test_node_over_dds_survives_malformed_joint_states(tmp_path: Path) -> None:
    """A real DDS node (arm config) fed bad then good /joint_states: it logs, holds, recovers."""
    export = export_policy(tmp_path, arm_io_spec())
    domain = free_domain_id()
    node_side, robot_side = DdsTransport(domain, loopback=True), DdsTransport(domain, loopback=True)
    node = build_node(node_side, export, "ros2_control_arm")
    commands: list[np.ndarray] = []
    robot_side.subscribe(
        node.robot.command.topic,
        node.robot.command.type,
        "reliable",
        lambda m: commands.append(messages.to_vector(m.data)),
    )
    publish = robot_side.publisher("/joint_states", "sensor_msgs/msg/JointState", "reliable")
    assert robot_side.wait_for_subscribers(publish, timeout_s=10.0)
    stop = threading.Event()
    worker = threading.Thread(target=node.run, args=(stop,), daemon=True)
    worker.start()
    try:
        period = node.period_s
        # Built at each publish: stamped now, so a starved test thread cannot make them stale.
        bad = [
            lambda: joint_state(ARM_JOINTS[:3], [0.0] * 3, [0.0] * 3),  # missing joints
            lambda: joint_state(ARM_JOINTS, [0.0] * 6, [0.0] * 2),  # velocity array too short
            lambda: joint_state(ARM_JOINTS, [float("nan")] * 6, [0.0] * 6),  # NaN positions
        ]
        for message in bad:
            for _ in range(5):
                publish(message())
                time.sleep(period)
        assert worker.is_alive() and node.rejections["invalid_observation"] >= 3
        assert node.state is SafetyState.FAULT
        deadline = time.monotonic() + 120.0  # hang guard: re-arming takes a few periods
        while node.state is not SafetyState.ARMED and time.monotonic() < deadline:
            publish(joint_state(ARM_JOINTS, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.0] * 6))
            time.sleep(period)
        assert node.state is SafetyState.ARMED
    finally:
        stop.set()
        worker.join(timeout=2.0)
        node_side.close()
        robot_side.close()
    # Until armed the arm was told to hold its last valid measured joints, never a NaN.
    assert commands and all(np.isfinite(c).all() for c in commands)
    assert any(np.allclose(c, [0.0] * 6) for c in commands)  # held while the NaN samples came
    assert any(np.allclose(c, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]) for c in commands)


# rmw_dds_common/msg/*.msg of each distro (the interface definitions rmw_cyclonedds publishes).
RMW_DDS_COMMON_MSGS = {
    "humble": {"Gid": "char[24] data"},
    "jazzy": {"Gid": "char[16] data"},
}
NODE_ENTITIES_INFO = "string<=256 node_namespace\nstring<=256 node_name\nGid[] reader_gid_seq\nGid[] writer_gid_seq\n"
PARTICIPANT_ENTITIES_INFO = "Gid gid\nNodeEntitiesInfo[] node_entities_info_seq\n"


@pytest.mark.parametrize("distro", ["humble", "jazzy"])
def test_ros_discovery_info_decodes_with_the_rmw_dds_common_definition(distro: str) -> None:
    """The DDS-mode node announces itself like rmw_cyclonedds: read back over real Cyclone DDS,
    the sample's CDR decodes with rosbags from the distro's rmw_dds_common message definitions."""
    from cyclonedds.sub import DataReader
    from cyclonedds.topic import Topic
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    from embodied.real.transports.dds import DdsTransport, _qos
    from embodied.real.transports.discovery import DISCOVERY_TOPIC, participant_entities_info

    store = get_typestore(Stores.ROS2_HUMBLE if distro == "humble" else Stores.ROS2_JAZZY)
    types: dict = {}
    for name, text in {
        **RMW_DDS_COMMON_MSGS[distro],
        "NodeEntitiesInfo": NODE_ENTITIES_INFO,
        "ParticipantEntitiesInfo": PARTICIPANT_ENTITIES_INFO,
    }.items():
        types.update(get_types_from_msg(text, f"rmw_dds_common/msg/{name}"))
    store.register(types)

    domain = free_domain_id()
    node_side = DdsTransport(
        domain_id=domain, loopback=True, namespace="/drone1", node_name="policy", ros_distro=distro
    )
    node_side.subscribe("cf/odom", "nav_msgs/msg/Odometry", "sensor", lambda m: None)
    node_side.publisher("cf/motor_thrust", "std_msgs/msg/Float32MultiArray", "reliable")
    # A late joiner (like `ros2 node list` started afterwards) still gets the latched sample.
    observer = DdsTransport(domain_id=domain, loopback=True)
    reader = DataReader(
        observer._participant,
        Topic(observer._participant, DISCOVERY_TOPIC, participant_entities_info(distro)[0]),
        qos=_qos("latched"),
    )
    samples: list = []
    deadline = time.monotonic() + 10.0
    while not samples and time.monotonic() < deadline:
        samples = [s for s in reader.take(N=10) if getattr(s.sample_info, "valid_data", True)]
        time.sleep(0.05)
    assert samples, "no ros_discovery_info sample"
    decoded: Any = store.deserialize_cdr(samples[-1].serialize(), "rmw_dds_common/msg/ParticipantEntitiesInfo")
    gid_size = 24 if distro == "humble" else 16
    participant = bytes(decoded.gid.data)
    assert len(participant) == gid_size
    assert participant[:16] == node_side._participant.guid.bytes and participant[16:] == bytes(gid_size - 16)
    (node,) = decoded.node_entities_info_seq
    assert (node.node_namespace, node.node_name) == ("/drone1", "policy")
    readers = {bytes(g.data)[:16] for g in node.reader_gid_seq}
    writers = {bytes(g.data)[:16] for g in node.writer_gid_seq}
    assert readers == {g.bytes for g in node_side._reader_guids} and len(readers) == 1
    assert writers == {g.bytes for g in node_side._writer_guids} and len(writers) == 1
    node_side.close()
    observer.close()


def test_closing_a_publisher_participant_is_seen_at_once() -> None:
    """DdsTransport.close deletes its participant: a subscriber learns that the publisher left
    without waiting for a timeout (the node then sends the safe command next period)."""
    from embodied.real.transports.dds import DdsTransport

    domain = free_domain_id()
    receiver = DdsTransport(domain_id=domain, loopback=True)
    sender = DdsTransport(domain_id=domain, loopback=True)
    lost = threading.Event()
    receiver.subscribe("cf/odom", "nav_msgs/msg/Odometry", "sensor", lambda m: None, lost.set)
    publish = sender.publisher("cf/odom", "nav_msgs/msg/Odometry", "reliable")
    assert sender.wait_for_subscribers(publish, timeout_s=10.0)
    publish(odometry())
    sender.close()
    # 5 s is half of Cyclone's 10 s default lease: only the disposal itself can pass, not expiry.
    assert lost.wait(5.0), "the subscriber never saw the publisher leave"
    receiver.close()
