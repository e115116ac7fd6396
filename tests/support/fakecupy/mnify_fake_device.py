"""pytest plugin (``-p mnify_fake_device``): the CUDA kernels replaced by their numpy twins.

With the CuPy stand-in beside it on ``sys.path``, the gpu-marked tests run their own code on
CPU; comparisons of a kernel with its twin are then trivially equal, so this only proves the
tests themselves run (see test_gpu_tests_on_stand_in.py).
"""

from __future__ import annotations

import functools
import sys
import types

from mnify.runtime.kernels import host

shim = types.ModuleType("mnify.runtime.kernels.device")
for _name in ("pack", "unpack", "channel_sums", "bn_backward_sums"):
    setattr(shim, _name, getattr(host, _name))
shim.gather_channels = host.gather_channels
shim.split_channels = host.split_channels
shim.prepare_pack = lambda arrays, out, scale=1.0: functools.partial(host.pack, arrays, out, scale)
shim.prepare_unpack = lambda buf, arrays, scale=1.0: functools.partial(
    host.unpack, buf, arrays, scale
)
sys.modules["mnify.runtime.kernels.device"] = shim
