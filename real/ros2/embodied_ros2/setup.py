"""ament_python build of the embodied_ros2 package (``colcon build --packages-select embodied_ros2``)."""

from glob import glob

from setuptools import setup

PACKAGE = "embodied_ros2"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=[PACKAGE],
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    # The policy runtime itself comes from the `embodied` Python package (pip install embodied[dds]).
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="embodied maintainers",
    maintainer_email="maintainers@embodied.invalid",
    description="ROS 2 node running an embodied policy export with a safety layer",
    license="Apache-2.0",
    entry_points={"console_scripts": [f"policy_node = {PACKAGE}.policy_node:main"]},
)
