"""embodied: sim-to-real reinforcement learning for robots.

Vectorized simulators produce batches of torch tensors, one trainer feeds them to any
algorithm, and what the algorithm learns leaves as a deterministic ``obs -> action``
module that the exporters (ONNX, C99) and the deployment paths (ROS 2, firmware) consume.
"""

__version__ = "0.1.0"
