"""The release version, as the installed package's metadata carries it.

The version is written once, in the top-level VERSION file: setup.cfg puts
it into the package metadata read here, and meson.build compiles it into
cutpointd (its `hello` reply) and cutpoint-sync.
"""

from __future__ import annotations

from importlib.metadata import version

VERSION = version("cutpoint")
