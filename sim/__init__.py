"""Simulator backends (``embodied.sim``): one file each; heavy imports stay inside them."""
