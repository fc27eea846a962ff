"""Launch the embodied policy node.

ros2 launch embodied_ros2 policy.launch.py export_dir:=/abs/run/export robot_config:=crazyflie_sim
Topics of the built-in robot configs can be remapped with the *_topic arguments.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

# (name in the robot configs, launch argument that remaps it); the names are relative, so the
# node's namespace applies to them.
REMAPPABLE_TOPICS = (
    ("cf/odom", "odom_topic"),
    ("cf/motor_thrust", "motor_command_topic"),
    ("cf/estop", "estop_topic"),
    ("joint_states", "joint_states_topic"),
    ("forward_position_controller/commands", "joint_command_topic"),
    ("estop", "arm_estop_topic"),
)


def generate_launch_description() -> LaunchDescription:
    default_params = PathJoinSubstitution([FindPackageShare("embodied_ros2"), "config", "policy_node.yaml"])
    arguments = [
        DeclareLaunchArgument("export_dir", description="folder with policy.onnx and policy_io.json"),
        DeclareLaunchArgument(
            "robot_config", default_value="crazyflie_sim", description="built-in robot config or YAML path"
        ),
        DeclareLaunchArgument("params_json", default_value="", description="robot param overrides as JSON"),
        DeclareLaunchArgument(
            "task",
            default_value="",
            description="with export_dir:=lerobot:REF, the task it was trained on (default: the robot config's task:)",
        ),
        DeclareLaunchArgument("device", default_value="cpu", description="where torch runs a LeRobot policy"),
        DeclareLaunchArgument("params_file", default_value=default_params, description="node parameter YAML"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        DeclareLaunchArgument("use_sim_time", default_value="false", description="judge stamps against /clock"),
        DeclareLaunchArgument(
            "autostart",
            default_value="true",
            description="configure and activate at start; false: wait for a lifecycle manager (ros2 lifecycle set)",
        ),
    ]
    arguments += [
        DeclareLaunchArgument(arg, default_value=topic, description=f"topic used for {topic}")
        for topic, arg in REMAPPABLE_TOPICS
    ]
    node = Node(
        package="embodied_ros2",
        executable="policy_node",
        name="embodied_policy",
        namespace=LaunchConfiguration("namespace"),
        output="screen",
        parameters=[
            LaunchConfiguration("params_file"),
            {
                "export_dir": LaunchConfiguration("export_dir"),
                "robot_config": LaunchConfiguration("robot_config"),
                # A JSON object would otherwise be parsed as YAML into a mapping, which a ROS 2
                # parameter cannot hold ("Got <class 'dict'>"): keep it a string.
                "params_json": ParameterValue(LaunchConfiguration("params_json"), value_type=str),
                "task": ParameterValue(LaunchConfiguration("task"), value_type=str),
                "device": ParameterValue(LaunchConfiguration("device"), value_type=str),
                "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
                "autostart": ParameterValue(LaunchConfiguration("autostart"), value_type=bool),
            },
        ],
        remappings=[(topic, LaunchConfiguration(arg)) for topic, arg in REMAPPABLE_TOPICS],
    )
    return LaunchDescription([*arguments, node])
