"""Lab simulator of an SGLang 0.5.23 server (Kimi K2.6, DFlash, TP8); not an inference engine."""

SIMULATED_SGLANG_VERSION = "0.5.23"
__version__ = "0.1.0"
