"""Receivers for the vendors whose surface is an in-process plugin or a shell hook with its own shape.

OpenCode and Kilo Code through the shipped plugin files in ``js/``; Cline and Hermes through the
shared ``aep-collector-hook`` shim; pi through ``js/pi-extension.js``.
See ``README.md`` in this package for install steps, config keys and control postures.
"""

from __future__ import annotations

from . import cline, hermes, kilocode, opencode, pi

FACTORIES = [opencode.FACTORY, kilocode.FACTORY, cline.FACTORY, hermes.FACTORY, pi.FACTORY]
