"""Run the simulator as a child process on a free loopback port (for tests and local benchmarks).

    sim = SimProcess(["--model-path", "m", "--tp", "8"], log_dir=tmp, env={"SGLANG_SIM_TIME_FACTOR": "0.01"})
    sim.wait_ready(); ...; sim.stop()

Its stdout and stderr go to a log file, which plays the node's journal.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

PACKAGE_PARENT = Path(__file__).resolve().parents[1]
READY_LINE = "The server is fired up and ready to roll!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimProcess:
    def __init__(self, flags: list[str], log_dir: Path, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"sim-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        # The caller's SGLANG_SIM_* and allocator settings are not inherited: only `env` counts.
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_SIM_", "PYTORCH_"))}
        full_env.update({"PYTHONPATH": str(PACKAGE_PARENT), **(env or {})})
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang_sim", *flags, "--port", str(self.port)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=full_env)

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the ready line; raises with the log if the process exits or takes too long."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"simulator exited {self.proc.returncode}:\n{self.output()[-3000:]}")
            if READY_LINE in self.output():
                return
            time.sleep(0.02)
        raise AssertionError(f"simulator not ready after {timeout} s:\n{self.output()[-3000:]}")

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
