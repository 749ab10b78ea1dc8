"""GPU check of the client's CUDA IPC plumbing alone, before or without a CUDA fp4qd.

A stand-in server (a child process: CUDA IPC handles cannot be opened by the process that made
them) speaks fp4q.v1 for the RPCs below, maps registered regions with CuPy, and computes QDQ and
row-wise RTN Quantize with the numpy reference of NUMERICS.md (fp4q_reference.py). The client
sends the same requests by IPC and inline; the results must be bit-identical, outputs must land
in the caller's tensors, and each allocation must be registered (and opened) once. It checks
the client, not fp4qd: gpu_ipc_check.py does that.

  PYTHONPATH=client/python:tests/python python3 tests/python/gpu_fake_server_check.py
Needs a GPU, torch, cupy, grpcio, protobuf. Prints "N passed, M failed".
"""

import concurrent.futures
import os
import subprocess
import sys
import tempfile
import time

import grpc
import numpy as np

import fp4q_reference as R


# ---------------------------------------------------------------- the stand-in server

def serve(port_file):
    import cupy
    from fp4q import ipc
    from fp4q._messages import METHODS, pb

    cupy.cuda.runtime.getDeviceCount()  # initializes the driver
    uuid = ipc.device_uuid(0)
    state = {"opens": 0, "mappings": {}, "regions": {}, "sessions": {}}

    def header():
        return pb.ReplyHeader(server_epoch=7, backend="cuda", device_uuid=uuid)

    def session_of(ctx):
        sid = dict(ctx.invocation_metadata()).get("fp4q-session", "")
        if sid not in state["sessions"]:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "session: unknown")
        return sid

    def view(slice_msg, nbytes, ctx, field):
        reg = state["regions"].get(slice_msg.region_id)
        if reg is None or reg[2] != session_of(ctx):
            ctx.abort(grpc.StatusCode.NOT_FOUND, "%s.region_id: no region" % field)
        ptr, size, _ = reg
        if slice_msg.offset % 16 or slice_msg.offset + nbytes > size:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "%s.offset: %d" % (field,
                                                                           slice_msg.offset))
        mem = cupy.cuda.UnownedMemory(ptr, size, None)
        return cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(mem, slice_msg.offset))

    def dense_in(t, ctx):
        n = int(np.prod(t.shape)) * (4 if t.dtype == pb.DType.DTYPE_F32 else 2)
        raw = (view(t.region, n, ctx, "input").get().tobytes() if t.WhichOneof("data") == "region"
               else t.inline_data)
        if t.dtype == pb.DType.DTYPE_F32:
            return np.frombuffer(raw, "<f4").reshape(tuple(t.shape))
        return R.bf16_to_f32(np.frombuffer(raw, "<u2")).reshape(tuple(t.shape))

    def put(raw, target, result_field, data_field, region_field, ctx):
        if target.HasField("region"):
            view(target.region, len(raw), ctx, "out").set(np.frombuffer(raw, np.uint8))
            cupy.cuda.runtime.deviceSynchronize()
            getattr(result_field, region_field).CopyFrom(target.region)
        else:
            setattr(result_field, data_field, raw)

    def to_bf16_bytes(f):
        bits = f.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.astype("<u2").tobytes()

    def Qdq(req, ctx):  # noqa: N802
        x = dense_in(req.input, ctx)
        q = R.quantize_nvfp4(x)
        y = R.dequantize_nvfp4(q["packed"], q["scales"], q["s_enc"])
        out_dtype = req.out_dtype or req.input.dtype
        raw = y.astype("<f4").tobytes() if out_dtype == pb.DType.DTYPE_F32 else to_bf16_bytes(y)
        rep = pb.QdqReply(header=header(), global_amax=float(q["amax"]))
        rep.output.dtype = out_dtype
        rep.output.shape.extend(req.input.shape)
        put(raw, req.out, rep.output, "inline_data", "region", ctx)
        return rep

    def Quantize(req, ctx):  # noqa: N802
        q = R.quantize_nvfp4(dense_in(req.input, ctx))
        rep = pb.QuantizeReply(header=header())
        rw = rep.rowwise
        rw.format, rw.block, rw.scale_layout = 1, 1, 1
        rw.shape.extend(req.input.shape)
        rw.global_amax, rw.s_enc = float(q["amax"]), float(q["s_enc"])
        put(q["packed"].tobytes(), req.rowwise_codes, rw, "codes", "codes_region", ctx)
        put(q["scales"].tobytes(), req.rowwise_scales, rw, "scales", "scales_region", ctx)
        return rep

    def ServerInfo(req, ctx):  # noqa: N802
        rep = pb.ServerInfoReply(header=header(), backend="cuda",
                                 version="fake opens=%d" % state["opens"], server_epoch=7)
        rep.supported_modes.extend(["nvfp4", "cuda_ipc"])
        rep.gpus.add(uuid=uuid, name="stand-in")
        return rep

    def OpenSession(req, ctx):  # noqa: N802
        sid = os.urandom(16).hex()
        state["sessions"][sid] = []
        return pb.OpenSessionReply(header=header(), session_id=sid, lease_seconds=30)

    def KeepAlive(req, ctx):  # noqa: N802
        session_of(ctx)
        return pb.KeepAliveReply(header=header(), lease_seconds=30)

    def CloseSession(req, ctx):  # noqa: N802
        sid = session_of(ctx)
        ids = state["sessions"].pop(sid)
        for rid in ids:
            state["regions"].pop(rid, None)
        return pb.CloseSessionReply(header=header(), regions_released=len(ids))

    def RegisterCudaRegion(req, ctx):  # noqa: N802
        sid = session_of(ctx)
        if len(req.ipc_handle) != 64:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "ipc_handle: %d bytes" %
                      len(req.ipc_handle))
        if req.device_uuid != uuid:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "device_uuid: %s" % req.device_uuid)
        ptr = state["mappings"].get(req.ipc_handle)
        if ptr is None:
            ptr = cupy.cuda.runtime.ipcOpenMemHandle(req.ipc_handle, 1)
            state["mappings"][req.ipc_handle] = ptr
            state["opens"] += 1
        rid = os.urandom(16).hex()
        state["regions"][rid] = (ptr, req.size, sid)
        state["sessions"][sid].append(rid)
        return pb.RegisterCudaRegionReply(header=header(), region_id=rid)

    def UnregisterCudaRegion(req, ctx):  # noqa: N802
        sid = session_of(ctx)
        if state["regions"].pop(req.region_id, None) is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "region_id: no region")
        state["sessions"][sid].remove(req.region_id)
        return pb.UnregisterCudaRegionReply(header=header())

    impl = {k: v for k, v in locals().items() if k in METHODS}
    handlers = {name: grpc.unary_unary_rpc_method_handler(
        fn, request_deserializer=METHODS[name][1].FromString,
        response_serializer=METHODS[name][2].SerializeToString) for name, fn in impl.items()}
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=1),
                         options=[("grpc.max_receive_message_length", -1),
                                  ("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("fp4q.v1.Fp4q",
                                                                          handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.replace(port_file + ".tmp", port_file)
    server.wait_for_termination()


# ---------------------------------------------------------------- the client checks

def main():
    import torch
    import fp4q

    port_file = os.path.join(tempfile.mkdtemp(), "port")
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", port_file])
    results = []
    try:
        for _ in range(600):
            if os.path.exists(port_file) or child.poll() is not None:
                break
            time.sleep(0.1)
        target = "127.0.0.1:" + open(port_file).read()
        ipc = fp4q.Client(target, ipc="require", timeout=60)
        inline = fp4q.Client(target, ipc="never", timeout=60)

        def check(name, ok, **detail):
            results.append(bool(ok))
            print("%s %s %s" % ("PASS" if ok else "FAIL", name, detail), flush=True)

        def same(a, b):
            return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())

        g = torch.Generator(device="cuda").manual_seed(0)
        big = torch.randn(256, 256, device="cuda", generator=g)
        for dtype in (torch.float32, torch.bfloat16):
            x = big.to(dtype)
            y = ipc.qdq(x)
            check("qdq %s by IPC equals inline" % dtype, same(y, inline.qdq(x)) and y.is_cuda)
        part = big[64:96]  # a view 64 rows into its allocation
        check("qdq of a view", same(ipc.qdq(part), inline.qdq(part.cpu()).cuda()))
        odd = big.reshape(-1)[1:1 + 32 * 64].reshape(32, 64)  # 4 bytes off: sent as a copy
        check("qdq of a misaligned view", same(ipc.qdq(odd), inline.qdq(odd)))
        out = torch.full((512, 256), float("nan"), device="cuda")
        ipc.qdq(big, out=out[128:384])
        check("qdq into out= slice", same(out[128:384], inline.qdq(big)) and
              bool(out[:128].isnan().all()) and bool(out[384:].isnan().all()))
        qi, qn = ipc.quantize(big).rowwise, inline.quantize(big).rowwise
        check("quantize codes/scales by IPC", same(qi.codes, qn.codes) and
              same(qi.scales, qn.scales) and qi.codes.is_cuda and qi.s_enc == qn.s_enc)
        large = torch.randn(1024, 4096, device="cuda", generator=g)  # 16 MiB: its own cudaMalloc
        check("qdq of a large tensor", same(ipc.qdq(large[512:]), inline.qdq(large[512:])))
        regs = ipc.stats["registrations"]
        for _ in range(5):
            ipc.qdq(large[:512], out=large[512:])
            ipc.qdq(big, out=out[:256])
        opens = int(ipc.server_info().version.split("opens=")[1])
        check("no new registration for known allocations",
              ipc.stats["registrations"] == regs and regs >= 2, registrations=regs,
              server_opens=opens)
        check("one open per allocation", opens == regs, opens=opens, registrations=regs)
        arena_client = fp4q.Client(target, ipc="require", timeout=60)
        arena_client.enable_arena("cuda", nbytes=4 << 20, max_tensor_bytes=64 << 10)
        xs = [torch.randn(16, 64, device="cuda", generator=g) for _ in range(40)]
        ys = [arena_client.qdq(x) for x in xs]
        check("arena: 40 small tensors, one registration",
              arena_client.stats["registrations"] == 1 and
              all(same(y, inline.qdq(x)) for x, y in zip(xs, ys)),
              registrations=arena_client.stats["registrations"])
        arena_client.close()
        released = ipc.close_session()
        check("close_session releases the regions", released == regs, released=released)
        y = ipc.qdq(big)  # a new session and new registrations, transparently
        check("new session after close", same(y, inline.qdq(big)))
        ipc.close()
        inline.close()
    finally:
        child.terminate()
        child.wait(timeout=30)
    print("%d passed, %d failed" % (sum(results), len(results) - sum(results)))
    return 0 if results and all(results) else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(main())
