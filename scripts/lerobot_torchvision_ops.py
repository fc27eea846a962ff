"""Declare torchvision's two operator schemas that its Python package registers unconditionally.

PyPI's torchvision wheels for Linux are CUDA builds; next to the CPU torch of this project their
compiled ``_C`` extension cannot load (it links libtorch_cuda), and ``import torchvision`` then
fails where it registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms``.
scripts/setup_lerobot.sh installs this module (and a ``.pth`` line that imports it) into
.venv-lerobot only when that import fails. It declares the two schemas and nothing else: the
operators have no kernel, so ``torchvision.ops.nms`` (detection models) raises if called, while
the torchvision models and transforms LeRobot's ACT and diffusion policies use are plain torch.
"""

import torch

_LIB = torch.library.Library("torchvision", "DEF")
_LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
_LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
