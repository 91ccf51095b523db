"""Host-to-device copies that never make the host wait for the device.

`torch.tensor(values, device="cuda")` and `cpu_tensor.to("cuda")` copy from pageable memory and then synchronise the
stream: the host stalls until every queued kernel has run. Per-pass bookkeeping (row lengths, row indices,
temperatures) is known on the host, so it travels the other way through pinned memory with `non_blocking=True`; the
caching host allocator keeps the pinned buffer alive until the copy has finished.
"""

from collections.abc import Sequence

import torch


def to_device(x: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A CPU tensor on `device`, copied asynchronously on CUDA (no host sync); any other device: a plain `.to`."""
    device = torch.device(device)
    if device.type != "cuda" or x.device.type != "cpu":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def device_tensor(values: Sequence, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`torch.tensor(values, dtype=dtype)` on `device` without a host sync (see `to_device`)."""
    return to_device(torch.tensor(values, dtype=dtype), device)
