"""Crazyflie tooling: the firmware build (host library, QEMU target, out-of-tree app), the
software-in-the-loop harness, and the checks that pick Crazyflie policies by their
``policy_io.json`` (``extra.vehicle == "crazyflie"``, :mod:`embodied.crazyflie.vehicle`)."""
