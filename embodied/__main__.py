"""``python -m embodied``: the same command line as ``embodied`` (and what ``torchrun -m embodied``
starts in every training process)."""

import sys

from embodied.cli import main

if __name__ == "__main__":
    sys.exit(main())
