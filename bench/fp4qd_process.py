"""What the benchmarks through fp4qd share: fp4qd started by the benchmark (--fp4qd, CUDA IPC
and the fast socket on Unix sockets in a private folder) or one already running (--server,
--fast-socket), and the commit they report."""

import os
import shutil
import subprocess
import tempfile

import fp4q


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit():
    """The commit measured: FP4Q_COMMIT (scripts/device/run.sh sets the bundle's), else git's."""
    if os.environ.get("FP4Q_COMMIT"):
        return os.environ["FP4Q_COMMIT"]
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip() or None
    except OSError:
        return None


def add_server_args(ap, state_budget_bytes):
    """The options of where fp4qd is: --fp4qd (start one), its extra flags, or --server /
    --fast-socket of a running one; its state budget; the client's busy-poll."""
    ap.add_argument("--fp4qd", help="start this fp4qd for the run (CUDA IPC, fast socket)")
    ap.add_argument("--fp4qd-arg", action="append", default=[],
                    help="one more fp4qd flag (repeatable), e.g. --fp4qd-arg=--worker_spin_us=50")
    ap.add_argument("--server", default=os.environ.get("FP4Q_SERVER"),
                    help="a running fp4qd's gRPC address instead (unix:/path for CUDA IPC)")
    ap.add_argument("--fast-socket", default=os.environ.get("FP4Q_FAST_SOCKET"),
                    help="its --fast_socket path")
    ap.add_argument("--state-budget-bytes", type=int, default=state_budget_bytes,
                    help="--state_budget_bytes of the fp4qd started here")
    ap.add_argument("--spin-us", type=int, default=None,
                    help="the fast socket client's busy-poll of each reply (fp4q.Client "
                         "fast_socket_spin_us; default: the client's own, which busy-polls for "
                         "steps expected within 2 ms; 0: it sleeps until every reply)")


class Fp4qd:
    """fp4qd started for the run (--fp4qd), or the one given (--server, --fast-socket)."""

    def __init__(self, args, cuda):
        self.proc = None
        self.folder = None
        self.spin_us = args.spin_us
        if args.fp4qd:
            self.folder = tempfile.mkdtemp(prefix="fp4q-bench-")
            sock = os.path.join(self.folder, "grpc.sock")
            fast = os.path.join(self.folder, "fast.sock")
            cmd = [args.fp4qd, "--listen", "127.0.0.1:0", "--metrics_listen", "",
                   "--unix_socket", sock, "--fast_socket", fast,
                   "--state_budget_bytes", str(args.state_budget_bytes), "--log_format", "text"]
            if cuda:
                cmd += ["--allow_cuda_ipc", "--backend", "cuda"]
            else:
                cmd += ["--backend", "cpu"]
            cmd += args.fp4qd_arg
            self.command = cmd
            self.log = open(os.path.join(self.folder, "fp4qd.log"), "w")
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
            line = self.proc.stdout.readline()
            if not line.startswith("fp4qd: listening on"):
                self.stop()
                raise RuntimeError("fp4qd did not start: %r (log %s)" % (line, self.log.name))
            self.target, self.fast = "unix:" + sock, fast
        else:
            self.command = None
            self.target, self.fast = args.server, args.fast_socket

    def client(self, fast, namespace, ipc):
        """A client of this fp4qd in `namespace`; fast: over the fast socket; ipc: fp4q.Client's
        ipc ("require" on the GPU: a tensor that cannot go by CUDA IPC fails the row)."""
        return fp4q.Client(self.target, fast_socket=self.fast if fast else "",
                           fast_socket_spin_us=self.spin_us if fast else 0,
                           namespace=namespace, max_regions=1024, timeout=600, ipc=ipc)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
