"""fp4q: the Python client of fp4qd, the NVFP4 training numerics server.

    import fp4q
    client = fp4q.Client("127.0.0.1:50051")          # every RPC, torch tensors in and out
    q = client.quantize(x).rowwise                     # fp4q.QuantizedTensor
    fp4q.set_default_client(client)                    # for the fp4-train style functions:
    packed, scale = fp4q.quantize(x, stochastic=True, seed=1, step=7)   # an fp4q.Fp4Tensor
    y = fp4q.fp4_mm(a, b)                              # a @ b^T (tensor cores where there are)
    layer = fp4q.nn.Linear(1024, 4096)                 # drop-in nn.Linear, NVFP4 recipe
    opt = fp4q.optim.AdamW(model.parameters(), lr=1e-3, client=client)  # 4-bit stored weights

Failures raise fp4q.Fp4qError (gRPC code + server message). See client.py for the transport
contract (inline vs CUDA IPC), functional.py / nn.py for the numerics API and optim.py for the
optimizers whose parameters the server stores in 4 bits.
"""

from fp4q import nn
from fp4q import optim
from fp4q.client import Client
from fp4q.errors import Fp4qError, ServerRestartedError
from fp4q.functional import (ErrorFeedback, Fp4MmPath, Fp4Operands, Fp4Pair, Fp4Tensor,
                             default_client, dequantize, fp4_linear, fp4_matmul, fp4_mm,
                             fp4_mm_path, last_fp4_mm_path, qdq, quantize, set_default_client,
                             swizzle_scales, to_fp4_operands)
from fp4q.options import (AdamWHyperparameters, OptimizerSpec, QuantOptions,
                          SgdHyperparameters)
from fp4q.results import (DenseOperand, OptimizerState, QuantizedTensor, QuantizeResult,
                          StepItem, StepItemResult, StepResult, UpdateResult, WeightState)
from fp4q.tensors import ClientArgumentError

__version__ = "0.1.0"

__all__ = [
    "AdamWHyperparameters", "Client", "ClientArgumentError", "DenseOperand", "ErrorFeedback",
    "Fp4MmPath",
    "Fp4Operands", "Fp4Pair", "Fp4Tensor", "Fp4qError", "OptimizerSpec", "OptimizerState",
    "QuantOptions", "QuantizeResult", "QuantizedTensor", "ServerRestartedError",
    "SgdHyperparameters", "StepItem", "StepItemResult", "StepResult", "UpdateResult",
    "WeightState", "default_client", "dequantize", "fp4_linear", "fp4_matmul", "fp4_mm",
    "fp4_mm_path", "last_fp4_mm_path", "nn", "optim", "qdq", "quantize", "set_default_client",
    "swizzle_scales", "to_fp4_operands",
]
