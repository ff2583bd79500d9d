"""The guard: auto-remediation of engine deaths (policy, state and audit log, alerts, the loop)."""
