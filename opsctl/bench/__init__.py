"""Long-context benchmark of an SGLang server: sweep, concurrency, compare, report, plot.

The library (`runner.run_sweep`, `runner.run_concurrency`) returns dataclass records and
knows nothing of the CLI; `opsctl.commands.bench` draws progress and prints them.
"""
