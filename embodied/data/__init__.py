"""Replay buffers and datasets."""
