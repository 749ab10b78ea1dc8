# bench/train_loop.py with the Python client's sleep-then-poll rule for replies expected late
# (fp4q._fast_socket.AUTO_WAKE_MAX) off: such replies are slept for throughout, as before it.
# Same arguments as train_loop.py; run from the repository root.
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.getcwd(), "client", "python"))
import fp4q._fast_socket  # noqa: E402

fp4q._fast_socket.AUTO_WAKE_MAX = 0.0
sys.argv[0] = "bench/train_loop.py"
runpy.run_path("bench/train_loop.py", run_name="__main__")
