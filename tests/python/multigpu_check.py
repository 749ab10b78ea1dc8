"""Several GPUs from the Python client: tensors on cuda:0 and cuda:1 (cuda:0 current all along)
go to one CUDA fp4qd by IPC, run on their own GPU, and equal the inline (CPU-memory) path.

  PYTHONPATH=client/python:tests/python python3 tests/python/multigpu_check.py --fp4qd BIN/fp4qd

Needs torch with 2+ GPUs, grpcio, protobuf and the generated client/python/fp4q/_proto/.
Prints one PASS/FAIL line per check; exit 0 when all pass, 1 on a failure, 77 (skip) with the
reason when fewer than two GPUs are visible.
"""

import argparse
import os
import sys

import torch

import fp4q
import fp4q_testing


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp4qd", required=True)
    args = p.parse_args()
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        print("SKIP multigpu_check: %d CUDA device(s) visible to torch, 2 needed" % n)
        return 77
    os.environ["FP4Q_FP4QD"] = args.fp4qd
    server = fp4q_testing.Server("--allow_cuda_ipc", "--cuda_ipc_over_tcp", backend="cuda")
    ipc = fp4q.Client(server.target, ipc="require", timeout=120)
    inline = fp4q.Client(server.target, ipc="never", timeout=120)
    failed = 0
    try:
        served = [g.uuid for g in ipc.server_info().gpus]
        torch.cuda.set_device(0)
        for dev in (0, 1):
            g = torch.Generator(device="cuda:%d" % dev).manual_seed(int.from_bytes(os.urandom(4),
                                                                                 "little"))
            x = torch.randn(256, 1024, device="cuda:%d" % dev, generator=g)
            before = dict(ipc.stats)
            y = ipc.qdq(x)
            q = ipc.quantize(x, outputs="both").rowwise
            used = ipc.stats["ipc_tensors"] - before.get("ipc_tensors", 0)
            fell_back = ipc.stats["ipc_fallbacks"] - before.get("ipc_fallbacks", 0)
            ref_y = inline.qdq(x.cpu())
            ref_q = inline.quantize(x.cpu(), outputs="both").rowwise
            checks = {
                "result_on_same_device": y.device == x.device and q.codes.device == x.device,
                "qdq_equals_inline": torch.equal(y.cpu(), ref_y),
                "quantize_equals_inline": torch.equal(q.codes.cpu(), ref_q.codes.cpu()) and
                torch.equal(q.scales.cpu(), ref_q.scales.cpu()),
                "went_by_ipc": used > 0 and fell_back == 0,
                "current_device_untouched": torch.cuda.current_device() == 0,
            }
            ok = all(checks.values())
            failed += not ok
            print("%s cuda:%d (%s; served %s) %s" % ("PASS" if ok else "FAIL", dev,
                                                    fp4q.ipc.device_uuid(dev), served, checks),
                  flush=True)
    except Exception as e:  # noqa: BLE001 - reported as a failure
        failed += 1
        print("FAIL exception: %s: %s" % (type(e).__name__, e), flush=True)
    finally:
        ipc.close()
        inline.close()
        server.stop()
    print("multigpu_check: %s" % ("PASS" if failed == 0 else "FAIL (%d)" % failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
