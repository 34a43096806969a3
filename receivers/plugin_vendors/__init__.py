"""Receivers for the vendors whose surface is an in-process plugin or a shell hook with its own shape.

OpenCode (8390) and Kilo Code (8391) through the shipped plugin files in ``js/``; Cline (8392) and
Hermes (8393) through the shared ``aep-collector-hook`` shim; pi (8396) through ``js/pi-extension.js``.
See ``README.md`` in this package for install steps, config keys and control postures.
"""

from __future__ import annotations

from . import cline, hermes, kilocode, opencode, pi

FACTORIES = [opencode.FACTORY, kilocode.FACTORY, cline.FACTORY, hermes.FACTORY, pi.FACTORY]
