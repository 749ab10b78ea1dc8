"""GPU host check of the Python client: CUDA IPC against inline, registration caching, and a
short training run of fp4q.nn.Linear against bf16 nn.Linear.

Run on a machine with a GPU, torch >= 2.x, grpcio and protobuf (no protoc needed: carry the
generated client/python/fp4q/_proto/ folder, made here by `python3 client/python/fp4q/_protogen.py`):

  PYTHONPATH=client/python:tests/python python3 tests/python/gpu_ipc_check.py \
      --fp4qd BUILD/bin/fp4qd --out OUTDIR [--steps 300] [--fast-socket PATH] \
      [--fp4qd-arg=FLAG ...]
  (or --target HOST:PORT --metrics HOST:PORT for a server already running with
   --backend cuda --allow_cuda_ipc)

Writes OUTDIR/gpu_ipc_check.json (every check, its numbers and verdict), OUTDIR/train_loss.csv
and OUTDIR/train_loss.json (per-step losses of both models), and prints "N passed, M failed".
Exit status 0 only when every check passed.
"""

import argparse
import csv
import json
import os
import sys
import threading
import time
import traceback

import torch

import fp4q
import fp4q_testing


class Checks:
    def __init__(self):
        self.results = []

    def run(self, name, fn):
        t0 = time.monotonic()
        try:
            detail = fn() or {}
            ok = detail.pop("ok", True)
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the rest
            ok, detail = False, {"error": "%s: %s" % (type(e).__name__, e),
                                 "trace": traceback.format_exc()[-2000:]}
        detail["seconds"] = round(time.monotonic() - t0, 3)
        self.results.append({"check": name, "passed": bool(ok), **detail})
        print("%s %s %s" % ("PASS" if ok else "FAIL", name,
                            json.dumps({k: v for k, v in detail.items() if k != "trace"})),
              flush=True)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())


def check_server(ipc, metrics):
    info = ipc.server_info()
    uuid = fp4q.ipc.device_uuid(torch.cuda.current_device())
    served = [g.uuid for g in info.gpus]
    return {"ok": info.backend == "cuda" and "cuda_ipc" in info.supported_modes and
            any(fp4q.ipc.normalize_uuid(u) == fp4q.ipc.normalize_uuid(uuid) for u in served),
            "backend": info.backend, "modes": list(info.supported_modes), "gpus": served,
            "client_gpu": uuid, "version": info.version}


def check_handle_matches_torch(ipc):
    """Our driver-read handle and offset equal what torch's own CUDA sharing sends."""
    big = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    view = big[4096:]
    base, size = fp4q._cuda_driver.address_range(view.data_ptr())
    ours = fp4q._cuda_driver.ipc_handle(base)
    st = view.untyped_storage()
    shared = st._share_cuda_()
    handle, offset = shared[1], shared[3]
    try:  # torch's consumer would release the count; nobody else will
        torch.UntypedStorage._release_ipc_counter_cuda(shared[4], shared[5])
    except Exception:  # noqa: BLE001 - only a leak of this throwaway buffer
        pass
    raw = handle if len(handle) == 64 else handle[2:66]
    return {"ok": raw == ours and offset == st.data_ptr() - base and
            view.data_ptr() - base == 4096 + offset,
            "torch_handle_len": len(handle), "offset": offset, "allocation_bytes": size}


def check_buffer_id_identifies_allocation(ipc):
    """The RegionCache hit path: cuPointerGetAttributes gives the allocation's base and a
    buffer id, also from a thread with no current context, and a new id after a re-allocation
    at the same address; a cached tensor then costs no IPC handle export."""
    torch.cuda.empty_cache()
    a = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # a segment of its own
    ptr = a.data_ptr() + 4096
    base, size = fp4q._cuda_driver.address_range(ptr)
    start, range_size, buffer_id = fp4q._cuda_driver.allocation_identity(ptr)
    single = fp4q._cuda_driver.buffer_id(ptr)  # the plan check's singular call
    other, single_other = [], []

    def without_context():
        other.append(fp4q._cuda_driver.allocation_identity(ptr))
        try:  # cuda.h does not promise this one here: the plan check falls back if it fails
            single_other.append(fp4q._cuda_driver.buffer_id(ptr))
        except fp4q._cuda_driver.DriverError as e:
            single_other.append(str(e))

    t = threading.Thread(target=without_context)
    t.start()
    t.join()
    del a
    torch.cuda.empty_cache()
    b = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    start2, _, buffer_id2 = fp4q._cuda_driver.allocation_identity(b.data_ptr())
    single2 = fp4q._cuda_driver.buffer_id(b.data_ptr() + 4096)
    hits0, regs0 = ipc._regions.hits, ipc._regions.registrations
    for _ in range(3):
        ipc.register_tensor(b[256:])
    hits, regs = ipc._regions.hits - hits0, ipc._regions.registrations - regs0
    return {"ok": start == base and buffer_id != 0 and other == [(start, range_size, buffer_id)]
            and (start2 != start or buffer_id2 != buffer_id) and hits == 2 and regs <= 1
            and single == buffer_id and single2 == buffer_id2,
            "range_start_is_base": start == base, "range_size": range_size,
            "address_range_size": size, "buffer_id": buffer_id,
            "same_from_thread_without_context": other == [(start, range_size, buffer_id)],
            "singular_call_same_id": single == buffer_id and single2 == buffer_id2,
            "singular_call_from_thread_without_context": single_other[0] if single_other
            else None,
            "realloc_same_base": start2 == start, "realloc_new_buffer_id": buffer_id2 != buffer_id,
            "cache_hits": hits, "registrations": regs}


def check_ipc_equals_inline(ipc, inline):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, 512, device="cuda", generator=g)
    w = torch.randn(384, 512, device="cuda", generator=g) * 0.05
    diffs = []
    before = dict(ipc.stats)

    def cmp(label, a, b):
        if not same(a, b):
            diffs.append(label)

    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        for kw in ({}, {"rounding": "stochastic", "seed": 7, "step": 3},
                   {"block": "16x16", "outputs": "both"},
                   {"scale_layout": "swizzled"},
                   {"outputs": "columnwise", "rht": "default", "rounding": "stochastic",
                    "seed": 1, "step": 2}):
            a, b = ipc.quantize(xd, **kw), inline.quantize(xd, **kw)
            for side in ("rowwise", "columnwise"):
                qa, qb = getattr(a, side), getattr(b, side)
                if (qa is None) != (qb is None):
                    diffs.append("%s %s %s presence" % (dtype, kw, side))
                elif qa is not None:
                    cmp("%s %s %s codes" % (dtype, kw, side), qa.codes, qb.codes)
                    cmp("%s %s %s scales" % (dtype, kw, side), qa.scales, qb.scales)
                    if qa.codes.device.type != "cuda":
                        diffs.append("%s result not on cuda" % side)
        cmp("qdq %s" % dtype, ipc.qdq(xd), inline.qdq(xd))
    qa, qb = ipc.quantize(x).rowwise, ipc.quantize(w).rowwise
    ia, ib = inline.quantize(x).rowwise, inline.quantize(w).rowwise
    cmp("dequantize", ipc.dequantize(qa), inline.dequantize(ia))
    cmp("matmul f32", ipc.matmul(qa, qb), inline.matmul(ia, ib))
    cmp("matmul bf16", ipc.matmul(qa, qb, torch.bfloat16), inline.matmul(ia, ib, torch.bfloat16))
    out = torch.full((256, 512), float("nan"), device="cuda")
    ipc.qdq(x, out=out)
    cmp("qdq into out", out, inline.qdq(x))
    cmp("cpu path", inline.qdq(x.cpu()), ipc.qdq(x).cpu())
    used = ipc.stats["ipc_tensors"] - before.get("ipc_tensors", 0)
    fell_back = ipc.stats["ipc_fallbacks"] - before.get("ipc_fallbacks", 0)
    return {"ok": not diffs and used > 0 and fell_back == 0 and inline.stats["ipc_tensors"] == 0,
            "differences": diffs, "ipc_tensors": used, "inline_client_ipc_tensors":
            inline.stats["ipc_tensors"]}


def check_dense_operands(ipc, inline):
    """Matmul of dense operands (fp4q.DenseOperand, by IPC and inline) equals the Matmul of the
    same operands quantized by separate Quantize calls, bit for bit, on the CUDA backend."""
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(96, 512, device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn(384, 512, device="cuda", generator=g) * 0.05
    t = torch.randn(512, 128, device="cuda", generator=g)  # tokens x features (wgrad's shape)
    diffs = []
    cases = [
        ("fprop", x, {}, w, {"block": "16x16"}),
        ("fprop SR", x, {"rounding": "stochastic", "seed": 5, "step": 2}, w,
         {"block": "16x16", "rounding": "stochastic", "seed": 6, "step": 2}),
        ("wgrad RHT SR column-wise", t, {"outputs": "columnwise", "rht": "default",
                                        "rounding": "stochastic", "seed": 8, "step": 4},
         x.float().t().contiguous(),
         {"outputs": "columnwise", "rht": "default", "rounding": "stochastic", "seed": 9,
          "step": 4}),
    ]
    for label, a, oa, b, ob in cases:
        side_a = "columnwise" if oa.get("outputs") == "columnwise" else "rowwise"
        side_b = "columnwise" if ob.get("outputs") == "columnwise" else "rowwise"
        qa = getattr(ipc.quantize(a, **oa), side_a)
        qb = getattr(ipc.quantize(b, **ob), side_b)
        for dt in (torch.float32, torch.bfloat16):
            want = ipc.matmul(qa, qb, dt)
            got = ipc.matmul(fp4q.DenseOperand(a, **oa), fp4q.DenseOperand(b, **ob), dt)
            if not same(got, want):
                diffs.append("%s %s by IPC" % (label, dt))
            got = inline.matmul(fp4q.DenseOperand(a.cpu(), **oa),
                                fp4q.DenseOperand(b.cpu(), **ob), dt)
            if not same(got, want.cpu()):
                diffs.append("%s %s inline" % (label, dt))
    return {"ok": not diffs, "differences": diffs}


def check_thread_without_context(ipc):
    """A tensor made on this thread travels by IPC from a thread that made no CUDA call (as
    autograd's backward thread does: fp4q.nn.Linear's backward GEMMs), its allocation not yet
    registered: the export binds the device's primary context there. Same result as here."""
    torch.cuda.empty_cache()
    x = torch.randn(4096, 4096, device="cuda")  # 64 MiB: an allocation of its own, no arena
    got, errors = [], []

    def run():
        try:
            got.append(ipc.quantize(x).rowwise)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append("%s: %s" % (type(e).__name__, e))
    t = threading.Thread(target=run)
    t.start()
    t.join()
    want = ipc.quantize(x).rowwise
    same_codes = bool(got) and same(got[0].codes, want.codes) and same(got[0].scales,
                                                                      want.scales)
    return {"ok": not errors and same_codes, "errors": errors, "bit_identical": same_codes}


def check_registration_cached(ipc, inline, server):
    torch.cuda.empty_cache()  # src and dst below get fresh cudaMalloc allocations
    opens0 = server.metric("fp4q_cuda_handle_opens_total")
    regs0 = ipc.stats["registrations"]
    src = torch.randn(64, 64 << 10, device="cuda")     # 16 MiB: an allocation of its own
    dst = torch.empty(64, 64 << 10, device="cuda")
    for i in range(16):
        ipc.qdq(src[4 * i:4 * i + 4], out=dst[4 * i:4 * i + 4])
    torch.cuda.synchronize()
    opens1 = server.metric("fp4q_cuda_handle_opens_total")
    # Each request quantizes its own 4-row slice (its own global amax), so the reference is
    # the inline QDQ of each slice, not of the whole tensor.
    expected = torch.cat([inline.qdq(src[4 * i:4 * i + 4].cpu()) for i in range(16)])
    regs = ipc.stats["registrations"] - regs0
    opened = None if opens0 is None or opens1 is None else opens1 - opens0
    return {"ok": regs == 2 and opened == 2 and torch.equal(dst.cpu(), expected),
            "requests": 16, "registrations": regs, "handle_opens": opened,
            "bit_identical_to_inline": torch.equal(dst.cpu(), expected),
            "open_handles": server.metric("fp4q_cuda_open_handles"),
            "regions": server.metric("fp4q_cuda_regions")}


def check_arena(target):
    c = fp4q.Client(target, ipc="require")
    try:
        c.enable_arena("cuda", nbytes=8 << 20, max_tensor_bytes=64 << 10)
        xs = [torch.randn(16, 64, device="cuda") for _ in range(32)]
        regs0 = c.stats["registrations"]
        ys = [c.qdq(x) for x in xs]
        ref = fp4q.Client(target, ipc="never")
        ok = all(torch.equal(y.cpu(), ref.qdq(x.cpu())) for x, y in zip(xs, ys))
        ref.close()
        return {"ok": ok and c.stats["registrations"] - regs0 <= 2,
                "registrations_for_32_small_tensors": c.stats["registrations"] - regs0}
    finally:
        c.close()


def check_optim_ipc_equals_inline(ipc, inline):
    """fp4q.optim.SGD with momentum and EF over bf16 CUDA parameters: by IPC (plans reused,
    brief replies, DQ(W) written into param.data by the server) and inline (gradients and DQ(W)
    in the messages) give bit-identical parameters, step after step; the parameters are
    poisoned between steps, so a step that did not write them shows. Steps 0-3: gradients are
    new tensors each step (zero_grad(set_to_none=True)); steps 4-7: views of one buffer at
    other offsets each step, in another order, so that every IPC step re-slices its plan. The
    odd steps find the stream idle (sent without a ready signal or a wait for the stream)."""
    import fp4q.optim
    g = torch.Generator(device="cuda").manual_seed(5)
    shapes = [(64, 128), (128, 64), (32, 256)]
    start = [torch.randn(s, device="cuda", generator=g).mul_(0.05).to(torch.bfloat16)
             for s in shapes]
    runs, idle = {}, {}
    for label, client in (("ipc", ipc), ("inline", inline)):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        opt = fp4q.optim.SGD(params, lr=0.05, momentum=0.9, error_feedback=True, client=client,
                             name_prefix="optim_check_%s_" % label)
        reused0 = client.stats["step_plans_reused"]
        history = []
        flat = torch.empty(4 << 20, dtype=torch.bfloat16, device="cuda")
        resliced0 = client.stats["step_plans_resliced"]
        for step in range(8):
            gg = torch.Generator(device="cuda").manual_seed(100 + step)
            grads = [torch.randn(p.shape, device="cuda", generator=gg).to(torch.bfloat16)
                     for p in params]
            if step >= 4:  # the same values, placed in the buffer at shifting offsets
                at = 4096 * step
                for k in (2, 0, 1):
                    n = grads[k].numel()
                    view = flat[at:at + n].view(grads[k].shape)
                    view.copy_(grads[k])
                    grads[k] = view
                    at += n + 256 * (step + k)
            for p, g in zip(params, grads):
                p.grad = g
            for p in params:  # the server must write every parameter
                p.data.fill_(float("nan"))
            if step % 2:
                # The stream idle when step() asks: sent without a ready signal or the host's
                # wait for the stream (ReadySteps.idle_order); the other steps may find the
                # poison still queued and send a ready word.
                torch.cuda.synchronize()
            opt.step()
            torch.cuda.synchronize()
            history.append([p.detach().clone() for p in params])
            opt.zero_grad(set_to_none=True)
        stored = [client.get_weight(n).dequantized for n in opt.stored_names.values()]
        rs = opt._ready_steps
        idle[label] = (rs.idle, rs.sent) if rs is not None else None
        runs[label] = (history, stored, client.stats["step_plans_reused"] - reused0,
                       client.stats["step_plans_resliced"] - resliced0)
        for n in opt.stored_names.values():
            client.delete_weight(n)
    (h_ipc, s_ipc, reused, resliced), (h_inline, s_inline, reused_inline, _) = (runs["ipc"],
                                                                               runs["inline"])
    steps_equal = [all(same(a, b) for a, b in zip(x, y)) for x, y in zip(h_ipc, h_inline)]
    finite = all(bool(torch.isfinite(t.float()).all()) for x in h_ipc for t in x)
    stored_equal = all(same(a.cpu(), b.cpu()) for a, b in zip(s_ipc, h_ipc[-1])) and all(
        same(a.cpu(), b.cpu()) for a, b in zip(s_inline, h_inline[-1]))
    moved = not all(same(a, b) for a, b in zip(h_ipc[-1], start))
    idle_ok = idle["ipc"] is not None and idle["ipc"][0] >= 4  # at least the odd steps
    return {"ok": all(steps_equal) and finite and stored_equal and moved and reused >= 3 and
            resliced >= 3 and reused_inline == 0 and idle_ok, "steps_bit_identical": steps_equal,
            "all_finite": finite, "params_equal_stored_dq": stored_equal, "weights_moved": moved,
            "ipc_step_plans_reused": reused, "ipc_step_plans_resliced": resliced,
            "inline_step_plans_reused": reused_inline,
            "ready_steps_idle_and_signalled": idle}


def check_optim_one_pass(ipc):
    """fp4q.optim.SGD(scaling='delayed', one_pass=True) by IPC against the same optimizer in two
    passes: bit-identical bf16 parameters over 6 steps (poisoned before each step), every step
    run in one pass; then a step with a NaN gradient is refused and leaves DQ(W) of the
    unchanged weights in the (poisoned) parameters, written back by the one pass's restore,
    and the stored weights unchanged."""
    import fp4q.optim
    g = torch.Generator(device="cuda").manual_seed(9)
    shapes = [(64, 128), (256, 64), (48, 512)]
    start = [torch.randn(s, device="cuda", generator=g).mul_(0.05).to(torch.bfloat16)
             for s in shapes]
    runs = {}
    for one_pass in (True, False):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        opt = fp4q.optim.SGD(params, lr=0.05, scaling="delayed", rounding="stochastic",
                             one_pass=one_pass, client=ipc,
                             name_prefix="one_pass_check_%d_" % one_pass)
        history = []
        for step in range(6):
            gg = torch.Generator(device="cuda").manual_seed(200 + step)
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=gg).to(torch.bfloat16)
                p.data.fill_(float("nan"))
            opt.step()
            torch.cuda.synchronize()
            history.append([p.detach().clone() for p in params])
        refused = restored = stored_kept = None
        if one_pass:
            stored = [ipc.get_weight(n).dequantized for n in opt.stored_names.values()]
            for k, p in enumerate(params):
                p.grad = torch.randn(p.shape, device="cuda").to(torch.bfloat16)
                if k == 1:
                    p.grad[7, 9] = float("nan")
                p.data.fill_(float("nan"))
            try:
                opt.step()
                refused = False
            except fp4q.Fp4qError as e:
                refused = "element %d is NaN" % (7 * 64 + 9) in str(e)
            torch.cuda.synchronize()
            restored = all(same(p.detach(), h) for p, h in zip(params, history[-1]))
            stored_kept = all(same(ipc.get_weight(n).dequantized.cpu(), s.cpu())
                              for n, s in zip(opt.stored_names.values(), stored))
        runs[one_pass] = (history, opt.one_pass_steps, refused, restored, stored_kept)
        for n in opt.stored_names.values():
            ipc.delete_weight(n)
    (h1, n1, refused, restored, kept), (h2, n2, _, _, _) = runs[True], runs[False]
    steps_equal = [all(same(a, b) for a, b in zip(x, y)) for x, y in zip(h1, h2)]
    finite = all(bool(torch.isfinite(t.float()).all()) for x in h1 for t in x)
    return {"ok": all(steps_equal) and finite and n1 == 6 and n2 == 0 and bool(refused) and
            bool(restored) and bool(kept), "steps_bit_identical": steps_equal,
            "all_finite": finite, "one_pass_steps": [n1, n2], "nan_step_refused": refused,
            "outputs_restored_to_dq_w": restored, "stored_weights_unchanged": kept}


def check_optim_overlap(ipc):
    """fp4q.optim.SGD(overlap=True): step() returns before the reply and the current stream
    waits on the device for the server's done signal. Without any host synchronization between
    steps, each step's parameters (poisoned with NaN before it, cloned on the stream right after
    step() returns) are bit-identical to overlap=False's; a NaN gradient (refused on the device)
    and a deleted weight (refused before any device work: the client releases the stream) are
    raised by the next synchronize() naming the step, the stream never stays blocked, and the
    refused step number is sent again. fp4qd takes ready signals, so the host never waits for
    the gradients: each is made behind ~1.5 ms of GPU sleep, so a server reading it before its
    ready signal would read the last step's; a ready word never written is refused after
    fp4qd's timeout (DEADLINE_EXCEEDED) with nothing changed and the stream released.
    overlap=False's steps, with their ready signals (the default) and without (the host
    waits), are bit-identical too, every ready word written by the driver (cuStreamWriteValue32);
    a synchronous step whose ready word is never written is sent again after the host's wait
    and applies once."""
    import threading
    import fp4q.optim
    from fp4q import _cuda_driver, _overlap, _streams
    g = torch.Generator(device="cuda").manual_seed(6)
    # The ready words are written by the driver (cuStreamWriteValue32), not by a fill_: counted.
    driver_write, driver_writes = _cuda_driver.stream_write_value32, []

    def counted_write(stream, ptr, value):
        driver_write(stream, ptr, value)
        driver_writes.append(value)
    _cuda_driver.stream_write_value32 = counted_write
    shapes = [(64, 128), (128, 64), (32, 256)]
    start = [torch.randn(s, device="cuda", generator=g).mul_(0.05).to(torch.bfloat16)
             for s in shapes]
    runs = {}
    # overlap=False with the host's wait, overlap=False with ready signals (the stream is busy
    # at every step: each step carries one), overlap=True.
    try:
        for variant, overlap, ready in (("host", False, False), ("ready", False, True),
                                        ("overlap", True, True)):
            params = [torch.nn.Parameter(w.clone()) for w in start]
            opt = fp4q.optim.SGD(params, lr=0.05, momentum=0.9, error_feedback=True, client=ipc,
                                 name_prefix="overlap_check_%s_" % variant, overlap=overlap,
                                 ready_signal=ready)
            history = []
            for step in range(8):
                gg = torch.Generator(device="cuda").manual_seed(200 + step)
                torch.cuda._sleep(3000000)  # the gradients come late on the stream
                for p in params:
                    p.grad = torch.randn(p.shape, device="cuda", generator=gg).to(torch.bfloat16)
                    p.data.fill_(float("nan"))  # queued before the step: the server must write it
                opt.step()
                history.append([p.detach().clone() for p in params])  # queued after the wait
                opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            opt.synchronize()
            runs[variant] = (history, opt, params)
    finally:
        _cuda_driver.stream_write_value32 = driver_write
    (h_sync, _, _), (h_ready, sync_opt, sync_params), (h_over, opt, params) = (
        runs["host"], runs["ready"], runs["overlap"])
    steps_equal = [all(same(a, b) for a, b in zip(x, y)) for x, y in zip(h_sync, h_over)]
    ready_equal = [all(same(a, b) for a, b in zip(x, y)) for x, y in zip(h_sync, h_ready)]
    finite = all(bool(torch.isfinite(t.float()).all()) for x in h_over for t in x)
    o, r = opt._overlapped, sync_opt._ready_steps
    out = {"steps_bit_identical": steps_equal, "all_finite": finite,
           "server_step": opt.server_step, "sent_overlapped": o.sent,
           "completed_in_step": o.completed, "sent_with_ready_signal": o.ready_sent,
           "sync_ready_steps_bit_identical": ready_equal,
           "sync_ready": None if r is None else {"sent": r.sent, "idle": r.idle},
           "ready_words_by_the_driver": len(driver_writes),
           "step_plans_named": ipc.stats["step_plans_named"]}  # steps by step_named's path
    # The handle the driver calls use: torch's raw current stream where this torch has it, as
    # Stream.cuda_stream has it, on the default stream and inside another one.
    raw, raw_ok = _streams._raw_stream, True
    if raw is not None:
        here, side = torch.cuda.current_device(), torch.cuda.Stream()
        handles = [(raw(here), torch.cuda.current_stream().cuda_stream)]
        with torch.cuda.stream(side):
            handles.append((raw(here), torch.cuda.current_stream().cuda_stream))
        raw_ok = all(a == b for a, b in handles) and handles[1][1] == side.cuda_stream
        out["raw_stream_handles"] = handles
    # The current stream's query and host wait by the driver (fp4q._streams) answer as torch's
    # Stream does, on the default stream and on another, with no fallback to torch's.
    fell_back = []
    torch_stream = torch.cuda.current_stream

    def counted_stream(*a, **k):
        fell_back.append(1)
        return torch_stream(*a, **k)

    def by_driver(call, dev):
        torch.cuda.current_stream = counted_stream  # a fallback to torch's Stream is counted
        try:
            return call(dev)
        finally:
            torch.cuda.current_stream = torch_stream
    answers = []
    dev = torch.device("cuda", torch.cuda.current_device())
    for stream in (None, torch.cuda.Stream()):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(20000000)  # about 10 ms: the stream is busy
            busy = by_driver(_streams.idle, dev)
            by_driver(_streams.synchronize, dev)
            answers.append((busy, by_driver(_streams.idle, dev), torch_stream(dev).query()))
    out["stream_idle_busy_then_synchronized"] = answers
    out["stream_calls_by_torch"] = len(fell_back)
    streams_ok = answers == [(False, True, True)] * 2 and (raw is None or not fell_back)
    # Without overlap, a ready word never written: fp4qd refuses the step after its timeout,
    # and step() sends it again after the host's wait; the step applies once.
    if r is not None:
        writes = _overlap._ready_order
        _overlap._ready_order = lambda signal, device, value, sent: (
            lambda transfer: transfer.before_send(skip=device))
        try:
            for p in sync_params:
                p.grad = torch.full(p.shape, 0.01, device="cuda", dtype=torch.bfloat16)
            torch.cuda._sleep(3000000)  # busy: the step carries a ready word
            sync_opt.step()
        finally:
            _overlap._ready_order = writes
        out["sync_ready_fallback"] = {"fallbacks": r.fallbacks,
                                      "server_step": sync_opt.server_step, "off": r.off}
    sync_ok = r is not None and all(ready_equal) and r.sent == 8 and r.idle == 0 and (
        out["sync_ready_fallback"] == {"fallbacks": 1, "server_step": 9, "off": None})

    def stream_released():
        done = threading.Event()
        threading.Thread(target=lambda: (torch.cuda.current_stream().synchronize(),
                                         done.set()), daemon=True).start()
        return done.wait(30)

    def error_of(call):
        """'CODE: message' of the Fp4qError call() raises, or None."""
        try:
            call()
            return None
        except fp4q.Fp4qError as e:
            return "%s: %s" % (e.code.name, e.message)

    def grads(nan=False):
        for p in params:
            p.grad = torch.full(p.shape, 0.01, device="cuda", dtype=torch.bfloat16)
        if nan:
            params[1].grad[3, 5] = float("nan")
    grads(nan=True)
    opt.step()  # step 9, refused on the device
    out["released_after_device_refusal"] = stream_released()
    out["nan_error"] = error_of(opt.synchronize)
    grads()
    opt.step()  # step 9 again
    opt.synchronize()
    out["server_step_after_resend"] = opt.server_step
    order = o._order
    o._order = lambda value: (lambda transfer: transfer.before_send())  # never writes it
    grads()
    opt.step()  # step 10: its ready word is never written
    out["released_after_ready_timeout"] = stream_released()
    out["ready_error"] = error_of(opt.synchronize)
    o._order = order
    grads()
    opt.step()  # step 10 again
    opt.synchronize()
    out["server_step_after_ready_resend"] = opt.server_step
    ipc.delete_weight(opt.stored_names[0])
    grads()
    opt.step()  # step 11, refused before any device work: the signal is the client's to write
    out["released_after_host_refusal"] = stream_released()
    out["deleted_error"] = error_of(opt.step)
    for run in runs.values():
        for n in run[1].stored_names.values():
            try:
                ipc.delete_weight(n)
            except fp4q.Fp4qError:
                pass
    nan_ok = bool(out["nan_error"]) and out["nan_error"].startswith(
        "INVALID_ARGUMENT: step 9 (overlap=True") and "is NaN" in out["nan_error"]
    del_ok = bool(out["deleted_error"]) and out["deleted_error"].startswith(
        "NOT_FOUND: step 11 (overlap=True") and "no weight" in out["deleted_error"]
    ready_ok = bool(out["ready_error"]) and out["ready_error"].startswith(
        "DEADLINE_EXCEEDED: step 10 (overlap=True") and (
        "ready_signal: the worker's stream did not write" in out["ready_error"])
    out["ok"] = (sync_ok and raw_ok and streams_ok and all(steps_equal) and finite and
                 opt.server_step == 10 and o.sent >= 12 and
                 o.ready_sent >= 8 and out["ready_words_by_the_driver"] == 16 and
                 out["released_after_device_refusal"] and
                 out["released_after_host_refusal"] and out["released_after_ready_timeout"]
                 and out["server_step_after_resend"] == 9 and
                 out["server_step_after_ready_resend"] == 10 and nan_ok and del_ok and ready_ok)
    return out


def check_scaled_mm(ipc):
    a = torch.randn(128, 256, device="cuda")
    b = torch.randn(192, 256, device="cuda")
    ops = fp4q.to_fp4_operands(a, b, client=ipc)
    ref = fp4q.fp4_matmul(a, b, client=ipc).float()
    detail = {"a_dtype": str(ops.a.dtype), "scale_dtype": str(ops.scale_a.dtype),
              "alpha": ops.alpha}
    try:
        y = torch._scaled_mm(ops.a, ops.b.t(), ops.scale_a, ops.scale_b,
                             out_dtype=torch.float32) * ops.alpha
        detail["rel_err_vs_fp4_matmul"] = float((y - ref).norm() / ref.norm())
        detail["ok"] = detail["rel_err_vs_fp4_matmul"] < 1e-5
    except RuntimeError as e:
        cap = torch.cuda.get_device_capability()
        # FP4 tensor-core GEMMs need sm_100+; Hopper refuses them. Reported, not failed.
        detail["scaled_mm"] = "not run on sm_%d%d: %s" % (cap[0], cap[1], str(e)[:300])
        detail["ok"] = cap[0] < 10
    return detail


def make_model(linear, seed, device, d_in=256, hidden=512, depth=3, classes=32):
    torch.manual_seed(seed)
    layers = [linear(d_in, hidden), torch.nn.GELU()]
    for _ in range(depth):
        layers += [torch.nn.LayerNorm(hidden), linear(hidden, hidden), torch.nn.GELU()]
    layers += [torch.nn.LayerNorm(hidden), linear(hidden, classes)]
    return torch.nn.Sequential(*layers).to(device)


def check_training(ipc, out_dir, steps, device="cuda"):
    torch.manual_seed(1234)
    teacher = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                  torch.nn.Linear(256, 32)).to(device)
    data = torch.randn(16384, 256, device=device)
    with torch.no_grad():
        labels = teacher(data).argmax(-1)
    base = make_model(torch.nn.Linear, 5, device)
    fp4 = make_model(lambda i, o: fp4q.nn.Linear(i, o, client=ipc), 5, device)
    fp4.load_state_dict(base.state_dict())  # identical initial weights
    losses = {"bf16": [], "nvfp4": []}
    for name, model in (("bf16", base), ("nvfp4", fp4)):
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
        g = torch.Generator(device=device).manual_seed(99)
        t0 = time.monotonic()
        for _ in range(steps):
            idx = torch.randint(0, data.shape[0], (256,), device=device, generator=g)
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(data[idx]), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
        losses[name + "_seconds"] = round(time.monotonic() - t0, 2)
    with open(os.path.join(out_dir, "train_loss.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "bf16", "nvfp4"])
        for i, (a, b) in enumerate(zip(losses["bf16"], losses["nvfp4"])):
            w.writerow([i + 1, "%.6f" % a, "%.6f" % b])
    meta = {"model": "MLP 256-512x4-32 (GELU, LayerNorm), AdamW lr 2e-3, batch 256, "
                     "bf16 autocast; labels from a fixed random teacher",
            "steps": steps, "device": (torch.cuda.get_device_name() if device == "cuda"
                                       else device),
            "torch": torch.__version__, "recipe": str(fp4q.nn.Recipe())}
    with open(os.path.join(out_dir, "train_loss.json"), "w") as f:
        json.dump({"meta": meta, **losses}, f)
    tail = max(1, steps // 10)
    end_b = sum(losses["bf16"][-tail:]) / tail
    end_f = sum(losses["nvfp4"][-tail:]) / tail
    start = losses["nvfp4"][0]
    return {"ok": end_f < 0.6 * start and end_f < 1.5 * end_b + 0.05,
            "first_loss": start, "last_tenth_mean_bf16": end_b, "last_tenth_mean_nvfp4": end_f,
            "seconds_bf16": losses["bf16_seconds"], "seconds_nvfp4": losses["nvfp4_seconds"]}


class _Remote:
    """A server started elsewhere: only its metrics are read."""

    def __init__(self, target, metrics_target):
        self.target, self.metrics_target = target, metrics_target

    metrics = fp4q_testing.Server.metrics
    metric = fp4q_testing.Server.metric

    def stop(self):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fp4qd", help="fp4qd binary to start (--backend cuda --allow_cuda_ipc)")
    p.add_argument("--target")
    p.add_argument("--metrics")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--fp4qd-arg", action="append", default=[],
                   help="with --fp4qd: one more flag for it (repeatable), e.g. "
                        "--fp4qd-arg=--idle_inline=true")
    p.add_argument("--fast-socket", metavar="PATH",
                   help="with --fp4qd: it serves this fast socket too, and the checks' clients "
                        "make their calls over it (default: gRPC)")
    args = p.parse_args()
    for flag, given in (("--fp4qd-arg", args.fp4qd_arg), ("--fast-socket", args.fast_socket)):
        if given and not args.fp4qd:
            p.error("%s: only with --fp4qd (a server this check starts)" % flag)
    os.makedirs(args.out, exist_ok=True)
    if not torch.cuda.is_available():
        print("gpu_ipc_check: no CUDA device visible to torch", file=sys.stderr)
        return 2
    if args.fp4qd:
        os.environ["FP4Q_FP4QD"] = args.fp4qd
        fast = ["--fast_socket=" + args.fast_socket] if args.fast_socket else []
        server = fp4q_testing.Server("--allow_cuda_ipc", "--cuda_ipc_over_tcp", *fast,
                                     *args.fp4qd_arg, backend="cuda")
    else:
        server = _Remote(args.target, args.metrics)
    checks = Checks()
    ipc = fp4q.Client(server.target, ipc="require", timeout=300, fast_socket=args.fast_socket)
    inline = fp4q.Client(server.target, ipc="never", timeout=300, fast_socket=args.fast_socket)
    try:
        checks.run("server_serves_this_gpu_with_ipc", lambda: check_server(ipc, server))
        checks.run("handle_matches_torch_sharing", lambda: check_handle_matches_torch(ipc))
        checks.run("buffer_id_identifies_allocation",
                   lambda: check_buffer_id_identifies_allocation(ipc))
        checks.run("ipc_bit_identical_to_inline", lambda: check_ipc_equals_inline(ipc, inline))
        checks.run("ipc_from_a_thread_without_context",
                   lambda: check_thread_without_context(ipc))
        checks.run("dense_operand_matmul_bit_identical",
                   lambda: check_dense_operands(ipc, inline))
        checks.run("registration_cached_one_open_per_allocation",
                   lambda: check_registration_cached(ipc, inline, server))
        checks.run("arena_pools_small_tensors", lambda: check_arena(server.target))
        checks.run("to_fp4_operands_scaled_mm", lambda: check_scaled_mm(ipc))
        checks.run("optim_ipc_bit_identical_to_inline",
                   lambda: check_optim_ipc_equals_inline(ipc, inline))
        checks.run("optim_one_pass_bit_identical_refusal_restores",
                   lambda: check_optim_one_pass(ipc))
        checks.run("optim_overlap_bit_identical_and_never_blocked",
                   lambda: check_optim_overlap(ipc))
        checks.run("training_nvfp4_linear_vs_bf16",
                   lambda: check_training(ipc, args.out, args.steps))
    finally:
        ipc.close()
        inline.close()
        server.stop()
    passed = sum(r["passed"] for r in checks.results)
    failed = len(checks.results) - passed
    with open(os.path.join(args.out, "gpu_ipc_check.json"), "w") as f:
        json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                   "checks": checks.results}, f, indent=1)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
