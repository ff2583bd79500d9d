"""Docker HEALTHCHECK: GET /health on the port the running simulator was given (exit 0 when 200).

The port comes from the simulator's own command line (--port, default 30000), read from /proc,
so the image's HEALTHCHECK works with whatever flags the unit passes.
"""

from __future__ import annotations

import pathlib
import sys
import urllib.error
import urllib.request


def simulator_port() -> int:
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "sglang_sim" not in args:
            continue
        for i, arg in enumerate(args):
            if arg == "--port" and i + 1 < len(args):
                return int(args[i + 1])
            if arg.startswith("--port="):
                return int(arg.split("=", 1)[1])
        return 30000
    return 30000


def main() -> int:
    url = f"http://127.0.0.1:{simulator_port()}/health"
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError, ValueError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
