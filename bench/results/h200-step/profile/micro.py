import sys, os, time, ctypes
sys.path.insert(0, os.path.join(os.getcwd(), "client", "python"))
import torch
from fp4q import _cuda_driver as D
x = torch.randn(1 << 20, device="cuda"); torch.cuda.synchronize()
lib = D._driver(); lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
def t(name, f, n=20000):
    for _ in range(200): f()
    a = time.perf_counter()
    for _ in range(n): f()
    print("%-40s %.2f us" % (name, (time.perf_counter() - a) / n * 1e6))
t("current_stream(0)", lambda: torch.cuda.current_stream(0))
t("current_stream(0).synchronize()", lambda: torch.cuda.current_stream(0).synchronize())
t("_cuda_getCurrentRawStream(0)", lambda: torch._C._cuda_getCurrentRawStream(0))
t("raw + cuStreamSynchronize", lambda: lib.cuStreamSynchronize(torch._C._cuda_getCurrentRawStream(0)))
t("torch.cuda.synchronize()", torch.cuda.synchronize)
t("allocation_identity", lambda: D.allocation_identity(x.data_ptr()))
p = torch.nn.Parameter(x.view(1024, 1024)); p.grad = torch.randn_like(p)
g = p.grad
t("p.grad", lambda: p.grad); t("g.data_ptr()", g.data_ptr); t("g.shape", lambda: g.shape)
t("g.dtype", lambda: g.dtype); t("g.is_contiguous()", g.is_contiguous)
