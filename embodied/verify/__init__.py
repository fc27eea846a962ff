"""Pre-flight verification of a trained quadrotor policy (``embodied verify RUN_DIR``).

``observation`` assembles a policy's observation from raw state by ``policy_io.json`` field
names, ``episodes`` flies the policy in the independent MuJoCo Crazyflie
(``embodied.sim.mujoco_crazyflie``), ``policy`` loads the exported ONNX model, ``gates`` holds
the pass/fail thresholds, ``report`` runs every check and writes ``verify.json``, ``plot`` draws
``verify.png``.
"""
