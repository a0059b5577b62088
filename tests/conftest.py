"""Test-wide settings: 8 fake CPU devices so sharding tests can build real meshes."""

import os

# Must be set before JAX initialises its backends.
os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
