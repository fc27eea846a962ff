"""Experiment YAML overrides (``configs/<task>/<algo>.yaml``), shipped as package data."""
