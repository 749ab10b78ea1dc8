# Run on the H200 of call 6 (GPU-262475a8), from the repository root, right after run6.sh:
#   timeout 60 python3 probe_tmp.py   (this file; output in ctypes-probe.txt)
# A torch launch on a stream behind cuStreamWaitValue32 on an unwritten mapped host word.
import ctypes, time, threading, torch
cu = ctypes.CDLL("libcuda.so.1")
rt = ctypes.CDLL("libcudart.so.13") if False else None
torch.cuda.init(); torch.zeros(1, device="cuda")
s = torch.cuda.Stream()
cudart = ctypes.CDLL(torch._C.__file__) if False else None
# mapped pinned host word through the driver
p = ctypes.c_void_p()
r = cu.cuMemHostAlloc(ctypes.byref(p), 16, 0x02)  # CU_MEMHOSTALLOC_DEVICEMAP
print("cuMemHostAlloc", r)
d = ctypes.c_uint64()
r = cu.cuMemHostGetDevicePointer_v2(ctypes.byref(d), p, 0); print("devptr", r, hex(d.value), hex(p.value))
ctypes.c_uint32.from_address(p.value).value = 0
t = time.perf_counter()
r = cu.cuStreamWaitValue32_v2(ctypes.c_void_p(s.cuda_stream), ctypes.c_uint64(d.value), ctypes.c_uint32(1), ctypes.c_uint(0))
print("wait(host mapped)", r)
with torch.cuda.stream(s):
    x = torch.ones(4, device="cuda"); y = x * 2
print("launch took %.3f ms" % ((time.perf_counter() - t) * 1e3), "query", s.query())
ctypes.c_uint32.from_address(p.value).value = 1
s.synchronize(); print("drained", y.sum().item())
# device word
w = torch.zeros(4, dtype=torch.int32, device="cuda")
r = cu.cuStreamWaitValue32_v2(ctypes.c_void_p(s.cuda_stream), ctypes.c_uint64(w.data_ptr()), ctypes.c_uint32(0), ctypes.c_uint(0))
print("wait(device)", r)
attr = ctypes.c_int()
for a, n in ((111, "CAN_USE_STREAM_WAIT_VALUE_NOR?"), (91, "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM"), (119,"?")):
    cu.cuDeviceGetAttribute(ctypes.byref(attr), a, 0); print(n, a, attr.value)
