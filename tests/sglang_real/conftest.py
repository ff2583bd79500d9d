def pytest_configure(config):
    markers = config.getini("markers")
    if not any(str(m).startswith("sglang_real") for m in markers):
        config.addinivalue_line(
            "markers", "sglang_real: checks against the real SGLang parser (needs .venv-sglang)"
        )
