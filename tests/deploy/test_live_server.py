#!/usr/bin/python3
"""Starts the real fp4qd (CPU backend, ports chosen by the kernel) and checks what the manifests,
alerts and dashboard assume of it:
  - the health service answers SERVING for "liveness" and "readiness" (the probes' service
    names), also over --unix_socket, and NOT_FOUND for a name it does not serve;
  - the default ports of `fp4qd --help` are those of docs/DESIGN.md, of every overlay's
    containerPorts and of the Dockerfile;
  - every metric name the alerts and the dashboard use is exposed on /metrics with the type
    DESIGN.md gives (a histogram's _bucket/_sum/_count count as the histogram), and after some
    traffic the labels they group by are on the samples;
  - SIGTERM ends the server within its drain time, with a checkpoint in --state_dir.

Environment (set by tests/deploy/CMakeLists.txt): FP4Q_FP4QD, FP4Q_PROTOC, FP4Q_HEALTH_PROTO,
and FP4Q_CLI when the CLI is built.
"""

import importlib.util
import os
import re
import signal
import struct
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request

import grpc

import design_contract
import kustomize_render
import monitoring
import test_dockerfile

START_TIMEOUT_S = 60


def load_health_module(tmp):
    protoc = os.environ["FP4Q_PROTOC"]
    proto = os.environ["FP4Q_HEALTH_PROTO"]
    include = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(proto))))
    subprocess.run([protoc, f"-I{include}", f"--python_out={tmp}",
                    os.path.relpath(proto, include)], check=True, timeout=60)
    path = os.path.join(tmp, "grpc", "health", "v1", "health_pb2.py")
    # Loaded under another name: the package "grpc" is grpcio's.
    spec = importlib.util.spec_from_file_location("fp4q_deploy_health_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Server:
    """fp4qd as a child process; reads the two address lines from its stdout."""

    def __init__(self, binary, args, log_path):
        self.log = open(log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen([binary] + args, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)
        self.lines = []
        self.addresses = {}
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(START_TIMEOUT_S):
            self.stop(signal.SIGKILL)
            raise AssertionError(f"fp4qd printed {self.lines} in {START_TIMEOUT_S} s, not both "
                                 f"address lines; log: {self.log_text()}")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            m = re.fullmatch(r"fp4qd: (listening|metrics) on (\S+)", line.strip())
            if m:
                self.addresses[m.group(1)] = m.group(2)
            if len(self.addresses) == 2:
                self.ready.set()

    def log_text(self):
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-4000:]

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        text = r.read().decode("utf-8")
    types, samples = {}, []
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if m:
            types[m.group(1)] = m.group(2)
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{(.*)\})?\s+(\S+)", line)
        if not m:
            raise AssertionError(f"unparseable /metrics line {line!r}")
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        samples.append((m.group(1), labels, float(m.group(4))))
    return text, types, samples


def write_safetensors(path, name, rows, cols):
    """A small F32 tensor with varied values (not zeros), in the safetensors layout."""
    import json
    values = [((i * 7919) % 113 - 56) / 9.0 for i in range(rows * cols)]
    data = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({name: {"dtype": "F32", "shape": [rows, cols],
                                "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


class LiveServerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.health = load_health_module(cls.tmp.name)
        cls.binary = os.environ["FP4Q_FP4QD"]
        cls.state_dir = os.path.join(cls.tmp.name, "state")
        os.mkdir(cls.state_dir)
        cls.socket = os.path.join(cls.tmp.name, "fp4qd.sock")
        cls.server = Server(cls.binary, [
            "--listen", "127.0.0.1:0", "--metrics_listen", "127.0.0.1:0", "--backend", "cpu",
            "--unix_socket", cls.socket, "--state_dir", cls.state_dir,
            "--drain_timeout_s", "5"], os.path.join(cls.tmp.name, "fp4qd.log"))
        cls.grpc_address = cls.server.addresses["listening"]
        cls.metrics_address = cls.server.addresses["metrics"]

    @classmethod
    def tearDownClass(cls):
        if cls.server.proc.poll() is None:
            cls.server.stop(signal.SIGKILL)
        cls.tmp.cleanup()

    def check_health(self, target, service, timeout=10):
        request = self.health.HealthCheckRequest(service=service)
        with grpc.insecure_channel(target) as channel:
            call = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=self.health.HealthCheckRequest.SerializeToString,
                response_deserializer=self.health.HealthCheckResponse.FromString)
            return call(request, timeout=timeout)

    def wait_serving(self, target, service, limit_s=30):
        serving = self.health.HealthCheckResponse.SERVING
        deadline = time.monotonic() + limit_s
        while True:
            status = self.check_health(target, service).status
            if status == serving or time.monotonic() > deadline:
                return status
            time.sleep(0.2)

    def test_1_probe_service_names_answer_serving(self):
        serving = self.health.HealthCheckResponse.SERVING
        for service in ("liveness", "readiness", ""):
            with self.subTest(service=service):
                self.assertEqual(self.wait_serving(self.grpc_address, service), serving)
        # The sidecar's and DaemonSet's trainers may use the Unix socket instead of TCP.
        self.assertEqual(self.wait_serving(f"unix:{self.socket}", "liveness"), serving)
        # The health service really distinguishes names: an unknown one is NOT_FOUND.
        with self.assertRaises(grpc.RpcError) as ctx:
            self.check_health(self.grpc_address, "no-such-service")
        self.assertEqual(ctx.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_2_default_ports_match_design_manifests_and_dockerfile(self):
        r = subprocess.run([self.binary, "--help"], capture_output=True, text=True, timeout=30)
        help_text = r.stdout + r.stderr
        defaults = {}
        for flag in ("listen", "metrics_listen"):
            m = re.search(r"--" + flag + r"\b[^\n]*?(?:\n[^\n-][^\n]*?){0,3}?"
                          r"(\d+\.\d+\.\d+\.\d+):(\d+)", help_text)
            self.assertIsNotNone(m, f"--{flag} default not found in fp4qd --help:\n{help_text}")
            defaults[flag] = (m.group(1), int(m.group(2)))
        design = design_contract.server_flags()
        self.assertEqual(f"{defaults['listen'][0]}:{defaults['listen'][1]}", design["--listen"])
        self.assertEqual(f"{defaults['metrics_listen'][0]}:{defaults['metrics_listen'][1]}",
                         design["--metrics_listen"])
        grpc_port, metrics_port = defaults["listen"][1], defaults["metrics_listen"][1]
        overlays = os.path.join(design_contract.REPO, "deploy", "overlays")
        for name in sorted(os.listdir(overlays)):
            for obj in kustomize_render.render(os.path.join(overlays, name)):
                spec = obj.get("spec", {}).get("template", {}).get("spec") or {}
                for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
                    ports = {p["name"]: p["containerPort"] for p in c.get("ports") or []}
                    if c["name"] != "fp4qd":
                        continue
                    self.assertEqual(ports, {"grpc": grpc_port, "metrics": metrics_port}, name)
                    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                        self.assertEqual(c[probe]["grpc"]["port"], grpc_port, (name, probe))
                if obj["kind"] == "Service":
                    self.assertEqual([p["port"] for p in obj["spec"]["ports"]], [grpc_port])
        with open(test_dockerfile.DOCKERFILE, encoding="utf-8") as f:
            text = f.read()
        self.assertIn(f"EXPOSE {grpc_port} {metrics_port}\n", text)

    def drive_traffic(self):
        """A few real requests, so that labelled families have samples."""
        cli = os.environ.get("FP4Q_CLI")
        if not cli:
            return False
        src = os.path.join(self.tmp.name, "in.safetensors")
        dst = os.path.join(self.tmp.name, "out.safetensors")
        write_safetensors(src, "w", 32, 64)
        for args in (["info"], ["quantize", src, dst], ["health"]):
            r = subprocess.run([cli, "--server", self.grpc_address] + args, capture_output=True,
                               text=True, timeout=60)
            self.assertEqual(r.returncode, 0, f"fp4q {args}: {r.stdout}{r.stderr}")
        return True

    def test_3_every_alert_and_dashboard_metric_exists(self):
        self.assertEqual(self.wait_serving(self.grpc_address, "readiness"),
                         self.health.HealthCheckResponse.SERVING)
        trafficked = self.drive_traffic()
        text, types, samples = scrape(self.metrics_address)
        table = design_contract.metrics()
        series = design_contract.series_names(table)
        sample_names = {name for name, _, _ in samples}
        missing, wrong_type = [], []
        used = sorted(monitoring.all_metric_names())
        self.assertGreater(len(used), 20)
        for name in used:
            family = series[name][0]
            if family not in types and name not in sample_names:
                missing.append(name)
            elif family in types and types[family] != table[family][0]:
                wrong_type.append(f"{family}: {types[family]}, DESIGN.md {table[family][0]}")
        self.assertEqual(missing, [], f"not on /metrics:\n{text[:3000]}")
        self.assertEqual(wrong_type, [])
        ready = [v for n, _, v in samples if n == "fp4q_ready"]
        self.assertEqual(ready, [1.0])
        build = [lb for n, lb, _ in samples if n == "fp4q_build_info"]
        self.assertEqual([lb.get("backend") for lb in build], ["cpu"])
        if trafficked:
            # The labels alerts and dashboard group by are on the samples.
            for name, want in (("fp4q_requests_total", {"rpc", "code"}),
                               ("fp4q_request_duration_seconds_bucket", {"rpc", "le"}),
                               ("fp4q_queue_depth", {"device"})):
                got = [lb for n, lb, _ in samples if n == name]
                self.assertTrue(got, f"no {name} sample after traffic")
                for lb in got:
                    self.assertLessEqual(want, set(lb), f"{name} {lb}")
            quantize_ok = [v for n, lb, v in samples if n == "fp4q_requests_total"
                           and lb.get("rpc") == "Quantize" and lb.get("code") == "OK"]
            self.assertEqual(quantize_ok, [1.0])

    def test_4_sigterm_drains_and_checkpoints_within_grace(self):
        start = time.monotonic()
        rc = self.server.stop(signal.SIGTERM, timeout=60)
        elapsed = time.monotonic() - start
        self.assertEqual(rc, 0, self.server.log_text())
        # --drain_timeout_s 5 here; the manifests give 120 s for 30 s of drain + checkpoint.
        self.assertLess(elapsed, 5 + 10, self.server.log_text())
        self.assertTrue(os.path.isfile(os.path.join(self.state_dir, "fp4q-state.ckpt")),
                        f"no checkpoint after SIGTERM in {os.listdir(self.state_dir)}")


if __name__ == "__main__":
    unittest.main()
