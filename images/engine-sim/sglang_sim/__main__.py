"""``python3 -m sglang_sim [SGLang flags]``: the lab's stand-in for ``python3 -m sglang.launch_server``."""

from __future__ import annotations

import asyncio
import sys

from .args import parse_args
from .engine import Config, Engine


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = Config.resolve(args)
    metrics = None
    if args.enable_metrics:
        from .metrics import Metrics

        metrics = Metrics(cfg.served_model_name)

    async def run() -> int:
        from .server import serve

        return await serve(Engine(cfg, metrics))

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
