"""Exporters of ``Policy.export_module()``: one file per format."""
