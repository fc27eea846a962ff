"""The firmware C sources as package data (``embodied.firmware``): a wheel install builds, emulates
and flashes the controller from them. Locate them with
:func:`embodied.export.c_build.firmware_dir`; nothing here is Python to import."""
