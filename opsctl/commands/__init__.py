"""One module per command group; `opsctl.cli` registers them."""
