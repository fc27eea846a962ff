"""ManiSkill3's camera throughput (PushCube-v1, ``base_camera``): :mod:`camera_throughput` with
its defaults, kept under this name for the commands in docs/benchmarks/maniskill.md::

    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/maniskill_camera.py --num-envs 4 16 --size-px 64
"""

from camera_throughput import main

if __name__ == "__main__":
    main()
