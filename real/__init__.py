"""Deployment runtime (``embodied.real``): policy runner, safety layer, transports."""
