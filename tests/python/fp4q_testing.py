"""Test support: a live fp4qd on loopback ports, its metrics, and the golden vectors.

Environment (set by tests/python/CMakeLists.txt; settable by hand):
  FP4Q_FP4QD             the fp4qd binary (default: <repo>/build/bin/fp4qd)
  FP4Q_GOLDEN_DIR        the folder of the golden vectors (default: <repo>/tests/data/golden)
  FP4Q_PROTO_DESCRIPTOR  the generated service descriptor (see fp4q/_protogen.py)
  FP4Q_KEEP_SERVER_LOGS  set: keep each server's stderr log (its path is Server.log_path)
"""

import os
import queue
import re
import subprocess
import tempfile
import threading
import time
import urllib.request

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
_LISTEN_RE = re.compile(r"^fp4qd: listening on (\S+)$")
_METRICS_RE = re.compile(r"^fp4qd: metrics on (\S+)$")


def wait_serving(client, timeout_s=30):
    """Until `client`'s health check answers SERVING (a restarted server, a new channel). Only
    UNAVAILABLE is waited out: gRPC's channel fails its first call after the server went away
    ("Broken pipe"), fast socket or not; any other error is raised."""
    import grpc  # noqa: PLC0415 - here, not at the top: fixtures that never wait need neither
    import fp4q  # noqa: PLC0415
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status = client.health()
            if status == "SERVING":
                return
        except fp4q.Fp4qError as e:
            if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        else:
            if time.monotonic() > deadline:
                raise RuntimeError("fp4qd health: %s after %d s" % (status, timeout_s))
        time.sleep(0.1)


def fp4qd_path():
    return os.environ.get("FP4Q_FP4QD") or os.path.join(REPO, "build", "bin", "fp4qd")


def golden_dir():
    return os.environ.get("FP4Q_GOLDEN_DIR") or os.path.join(REPO, "tests", "data", "golden")


def golden_path():
    return os.path.join(golden_dir(), "nvfp4_rtn_public.safetensors")


def socket_path(name):
    """A path for a Unix socket in a fresh private folder (the caller removes the folder).
    A socket path must fit in 107 bytes: a long $TMPDIR is passed over for /tmp."""
    base = os.environ.get("TMPDIR", "/tmp")
    if len(base) > 64:
        base = "/tmp"
    return os.path.join(tempfile.mkdtemp(prefix="fp4q-", dir=base), name)


class Server:
    """fp4qd --backend cpu on 127.0.0.1 port 0; .target and .metrics_target once started.
    extra_args are appended to fp4qd's command line (e.g. "--fast_socket", socket_path("f"))."""

    def __init__(self, *extra_args, backend="cpu", start_timeout_s=60):
        binary = fp4qd_path()
        if not os.access(binary, os.X_OK):
            raise RuntimeError("fp4qd not found at %s (build it, or set FP4Q_FP4QD)" % binary)
        args = [binary, "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0",
                "--backend", backend, "--log_format", "text"] + list(extra_args)
        self.log_path = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                     "fp4qd-python-test-%d-%d.log" % (os.getpid(), time.monotonic_ns()))
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True)
        lines = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()
        self.target = self.metrics_target = None
        deadline = time.monotonic() + start_timeout_s
        while self.target is None or self.metrics_target is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                tail = self._tail()
                self.stop()
                raise RuntimeError("fp4qd did not print its addresses (exit %s); log: %s" %
                                   (self.proc.poll(), tail))
            m = _LISTEN_RE.match(line.strip())
            if m:
                self.target = m.group(1)
            m = _METRICS_RE.match(line.strip())
            if m:
                self.metrics_target = m.group(1)

    def _pump(self, lines):
        for line in self.proc.stdout:
            lines.put(line)
        lines.put(None)

    def _tail(self):
        self._log.flush()
        with open(self.log_path) as f:
            return f.read()[-3000:]

    def metrics(self):
        with urllib.request.urlopen("http://%s/metrics" % self.metrics_target, timeout=10) as r:
            return r.read().decode()

    def metric(self, name, **labels):
        """The value of one sample of `name` with exactly these labels (None if absent)."""
        want = {k: str(v) for k, v in labels.items()}
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            m = re.match(r"^([a-zA-Z_:][\w:]*)(\{([^}]*)\})?\s+(\S+)", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
            if got == want:
                return float(m.group(4))
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self._log.closed:
            self._log.close()
            if not os.environ.get("FP4Q_KEEP_SERVER_LOGS"):
                os.unlink(self.log_path)
