# SPDX-License-Identifier: BSD-3-Clause
"""lucid_amp.autocast: the reference API's autocast, a thin front over torch.autocast.

    with lucid_amp.autocast("cuda"):                      # float16 on CUDA
        loss = loss_fn(model(x), y)

    with lucid_amp.autocast("cpu", dtype=torch.bfloat16): # bfloat16 on the CPU
        ...

    @lucid_amp.autocast("cuda", dtype=torch.bfloat16)     # as a decorator
    def forward(x): ...

Inside the region, ops that autocast knows run in ``dtype`` (the device's default when
None: float16 on CUDA, bfloat16 on the CPU) while the parameters stay float32; ops that
need range (reductions, losses) stay in float32. Regions nest: each restores the state it
found, and leaving the outermost one drops the cached low-precision weight copies. This is
torch.autocast's behaviour, which does the work; the class only fixes the reference API's
argument order (device type first) and checks its arguments, in every PyTorch from 1.13 on.
The C++ library has the same guard as lucid::amp::autocast.
"""

import functools
from typing import Optional

import torch

__all__ = ["autocast", "is_autocast_enabled"]


class autocast:  # noqa: N801 (the reference API's name)
    """Context manager and decorator: autocast for one device type.

    Args:
        device_type: "cuda" or "cpu" (a torch.device is accepted too).
        dtype: the lower-precision type ops are cast to (torch.float16 or
            torch.bfloat16); None: the device's default.
        enabled: False makes the region one where autocast is off for this device type.
        cache_enabled: as torch.autocast (None: PyTorch's default).
    """

    def __init__(
        self,
        device_type: str = "cuda",
        dtype: Optional[torch.dtype] = None,
        enabled: bool = True,
        cache_enabled: Optional[bool] = None,
    ) -> None:
        if isinstance(device_type, torch.device):
            device_type = device_type.type
        if not isinstance(device_type, str):
            raise ValueError(f"autocast: device_type must be a str such as 'cuda', got {device_type!r}")
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise ValueError(f"autocast: dtype must be a floating dtype such as torch.float16, got {dtype!r}")
        self.device_type = device_type
        self.dtype = dtype
        self.enabled = bool(enabled)
        self.cache_enabled = cache_enabled
        self._regions = []

    def _make(self) -> torch.autocast:
        kwargs = {"enabled": self.enabled}
        if self.dtype is not None:
            kwargs["dtype"] = self.dtype
        if self.cache_enabled is not None:
            kwargs["cache_enabled"] = self.cache_enabled
        return torch.autocast(self.device_type, **kwargs)

    def __enter__(self) -> "autocast":
        region = self._make()
        region.__enter__()
        self._regions.append(region)
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        region = self._regions.pop()
        return region.__exit__(exc_type, exc_val, exc_tb)

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self._make():
                return fn(*args, **kwargs)

        return wrapper


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    """Whether autocast is on for ``device_type`` ("cuda" or "cpu") in the calling thread."""
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"is_autocast_enabled: device_type must be 'cuda' or 'cpu', got {device_type!r}")
    try:
        return torch.is_autocast_enabled(device_type)  # PyTorch 2.4 and later
    except TypeError:  # earlier ones: one function per device type
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return torch.is_autocast_enabled()
