"""Tasks (``embodied.tasks``): observation, reward, terminations and randomization, one file each."""
