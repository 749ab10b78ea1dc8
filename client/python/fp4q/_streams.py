"""A device's current CUDA stream through torch's raw handle and the driver.

torch.cuda.current_stream(device) makes a Stream object, switching to the device and back to
do so: it took most of 46 us a step on the H100 host of h200-loop call 14, where it was called
twice, against a few microseconds for the raw handle and one driver call. The client asks about
the current stream at each call whose tensors travel by IPC (the host's wait before the send,
fp4q._regions.Transfer.before_send) and at each synchronous optimizer step (whether the
backward pass is still queued, fp4q._overlap.ReadySteps). Every function here falls back to
torch's Stream where the driver refuses its call, so the outcome is torch's either way.
"""

import torch

from fp4q import _cuda_driver

# torch's handle of a device's current stream as an int, without making a Stream object;
# absent from builds without CUDA.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def on_current_stream(device, call, *args):
    """call(stream, *args), `stream` the CUstream handle of `device`'s current stream. A handle
    of 0 (torch's default stream) names the legacy stream of the thread's current context, so
    the call is then made with `device` current."""
    if _raw_stream is not None and device.index is not None:
        stream = _raw_stream(device.index)
    else:
        stream = torch.cuda.current_stream(device).cuda_stream
    if stream == 0 and device.index is not None and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            return call(0, *args)
    return call(stream, *args)


def idle(device):
    """Whether `device`'s current stream has completed everything queued on it (cuStreamQuery,
    or torch's Stream.query() where the driver refuses)."""
    try:
        return on_current_stream(device, _cuda_driver.stream_query)
    except _cuda_driver.DriverError:
        return torch.cuda.current_stream(device).query()


def synchronize(device):
    """Waits on the host for everything queued on `device`'s current stream
    (cuStreamSynchronize, or torch's Stream.synchronize() where the driver refuses: a failed
    kernel's error is then raised as torch raises it)."""
    try:
        on_current_stream(device, _cuda_driver.stream_synchronize)
    except _cuda_driver.DriverError:
        torch.cuda.current_stream(device).synchronize()
