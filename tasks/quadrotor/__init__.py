"""The quadrotor task family: everything quadrotor-specific that is neither a simulator backend
(``sim/quadrotor.py``, ``sim/mujoco_crazyflie.py``) nor firmware C.

=================  ===========================================================================
``terms.py``       the observation term table (``ALL_TERMS``), the heading frame, the 180° yaw
                   symmetry: the one definition every counterpart is tested against
``hover_core.py``  the pure step: physics call, observation, reward terms, episode ends
``hover_fused.py`` the same step as one compiled function on rows (``env.sim.compile``)
``hover.py``       ``quad-hover``: config, resets, randomization, the env class
``track.py``       ``quad-track``: ``quad-hover`` with a setpoint moving along a path
``gaps.py``        reality-gap models (delays, biases, thrust mismatch, battery sag)
=================  ===========================================================================

The vehicle's physical constants are one table, ``embodied.sim.vehicle_variants`` (simulators
sit below tasks and may not import them, so the table lives on the lower floor that the
simulators, these tasks, ``verify`` and the exporters all read).
"""
