"""opsctl: operate an SGLang DFlash/DDTree server (status, restarts, OOM analysis, planning)."""

__version__ = "0.1.0"
