"""ROS 2 wrapper of ``embodied.real``: the node entry point lives in :mod:`embodied_ros2.policy_node`."""
