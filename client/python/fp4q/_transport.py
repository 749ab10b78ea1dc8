"""One request's tensor transport: inline bytes, or CUDA IPC region slices.

A `Transfer` is built per request by the client: `input()` fills a fp4q.v1.Tensor from a torch
tensor, `output()` plans where an output goes (a region slice in a tensor allocated here, or
inline), `before_send()` makes the client's GPU work on those tensors complete (the ordering
contract of fp4q.proto), and `result()` turns a reply's TensorResult (or codes/scales bytes)
into a torch tensor on the device the caller asked for (`result_tensor`).
"""

import torch

from fp4q import ipc
from fp4q import tensors


class Transfer:
    def __init__(self, client):
        self._client = client
        self.uses_regions = False
        self._devices = set()
        self._keep = []          # tensors that must outlive the request
        self._copy_back = []     # (arena view, destination tensor)
        self._arena = None

    # ------------------------------------------------------------------ plumbing

    def _region_for(self, tensor):
        """(region_id, offset) for a CUDA tensor, or raises ipc.NoIpc."""
        device = tensor.device
        uuid = self._client._ipc_uuid(device)
        arena = self._client._arena_for(device)
        nbytes = tensor.numel() * tensor.element_size()
        if arena is not None and arena.fits(nbytes):
            if self._arena is None:
                arena.lock.acquire()
                self._arena = arena
            if self._arena is arena:
                view = arena.take(nbytes, tensor.dtype, tuple(tensor.shape))
                if view is not None:
                    return view, self._client._regions.slice_for(view, uuid)
        return tensor, self._client._regions.slice_for(tensor, uuid)

    def _note_ipc(self, tensor):
        self.uses_regions = True
        self._devices.add(tensor.device)
        self._client._count("ipc_tensors")

    # ------------------------------------------------------------------ inputs

    def input(self, msg, tensor, field):
        """Fills `msg` (fp4q.v1.Tensor) from `tensor`; CUDA tensors by IPC when possible."""
        if not isinstance(tensor, torch.Tensor):
            raise tensors.ClientArgumentError("%s: expected a torch.Tensor, got %s" %
                                              (field, type(tensor).__name__))
        t = tensor.detach() if tensor.requires_grad else tensor
        msg.dtype = tensors.proto_dtype(t, field)
        del msg.shape[:]
        msg.shape.extend(t.shape)
        slot = self.input_region(t)
        if slot is None:
            msg.inline_data = tensors.tensor_bytes(t)
            self._client._count("inline_tensors")
        else:
            msg.region.region_id, msg.region.offset = slot

    def input_region(self, t):
        """(region_id, offset) holding `t`'s bytes, or None to send it inline."""
        if not t.is_cuda or t.numel() == 0:
            return None
        try:
            src = t.contiguous()
            try:
                dest, slot = self._region_for(src)
            except ipc.NoIpc as e:
                if "not a multiple" not in str(e):
                    raise
                src = src.clone()  # a fresh allocation is aligned
                dest, slot = self._region_for(src)
        except ipc.NoIpc as e:
            self._client._ipc_refused(t.device, str(e))
            return None
        if dest is not src:
            dest.copy_(src)
        self._keep.append(dest)
        self._note_ipc(dest)
        return slot

    # ------------------------------------------------------------------ outputs

    def output(self, target, shape, dtype, device):
        """Plans an output of `shape`/`dtype` wanted on `device`.

        Returns a tensor the server will write through IPC (and points `target`, a
        fp4q.v1.OutputTarget, at it), or None for inline.
        """
        device = torch.device(device)
        if device.type != "cuda":
            return None
        out = torch.empty(shape, dtype=dtype, device=device)
        if out.numel() == 0:
            return None
        try:
            dest, slot = self._region_for(out)
        except ipc.NoIpc as e:
            self._client._ipc_refused(device, str(e))
            return None
        if dest is not out:
            self._copy_back.append((dest, out))
        self._keep.append(dest)
        self._note_ipc(dest)
        target.region.region_id, target.region.offset = slot
        return out

    # ------------------------------------------------------------------ ordering

    def before_send(self):
        for dev in self._devices:
            torch.cuda.current_stream(dev).synchronize()

    def after_reply(self):
        for view, out in self._copy_back:
            out.copy_(view)
        self._copy_back = []
        self.release()

    def release(self):
        if self._arena is not None:
            self._arena.reset()
            self._arena.lock.release()
            self._arena = None
        self._keep = []



def result_tensor(planned, data, dtype, shape, device, field):
    """An output as a torch tensor on `device`: `planned` when the server wrote it by IPC,
    else the inline bytes (checked against dtype and shape) copied to `device`."""
    if planned is not None:
        return planned
    t = tensors.from_bytes(data, dtype, shape, field)
    device = torch.device(device)
    return t if device.type == "cpu" else t.to(device)
