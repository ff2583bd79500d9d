"""The unit and environment templates, rendered as Ansible renders them."""

import re

from opsctl import render


def test_env_file_holds_the_tuned_values_and_allocator_config():
    env = render.parse_env_file(render.render("sglang.env.j2", render.role_settings()))
    assert env == {
        "SGLANG_MEM_FRACTION_STATIC": "0.93",
        "SGLANG_CHUNKED_PREFILL_SIZE": "4096",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
    }


def test_engine_env_lines_follow_the_allocator_lines():
    text = render.render("sglang.env.j2", render.role_settings(sglang_engine_env={"DFLASH_VERIFY_KERNEL": "1"}))
    env = render.parse_env_file(text)
    assert env["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert env["DFLASH_VERIFY_KERNEL"] == "1"


def test_expandable_segments_off_is_explicit():
    # `-e sglang_expandable_segments=false` arrives as a string: it must still mean off.
    for off in (False, "false", "no"):
        env = render.parse_env_file(render.render("sglang.env.j2", render.role_settings(sglang_expandable_segments=off)))
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False", off


def test_engine_argv_takes_the_tuned_values_from_the_environment_file():
    argv = render.engine_argv(sglang_mem_fraction_static=0.9, sglang_chunked_prefill_size=2048)
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.9"
    assert argv[argv.index("--chunked-prefill-size") + 1] == "2048"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # loopback unless configured
    assert "--speculative-algorithm" in argv and argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"


def test_unit_service_settings():
    unit = render.render("sglang.service.j2", render.role_settings())
    assert re.search(r"^Restart=always$", unit, re.M)
    assert re.search(r"^StartLimitBurst=5$", unit, re.M)
    assert re.search(r"^TimeoutStartSec=930$", unit, re.M)  # a 10-minute load fits the 900 s budget
    assert re.search(r"^ExecStop=/usr/bin/docker stop --time 60 sglang$", unit, re.M)
    assert "EnvironmentFile=-/etc/sglang/override.env" in unit
    # The allocator config reaches the container from the unit's environment.
    assert "--env PYTORCH_CUDA_ALLOC_CONF" in unit


def test_api_key_never_lands_in_the_unit():
    unit = render.render("sglang.service.j2", render.role_settings(sglang_api_key_file="/etc/sglang/api-key.yaml"))
    assert "--config /run/secrets/sglang-api-key.yaml" in unit
    assert "--volume /etc/sglang/api-key.yaml:/run/secrets/sglang-api-key.yaml:ro" in unit
    assert "--api-key" not in unit


def test_override_template_renders_only_what_is_overridden():
    text = render.render("sglang-override.env.j2", {
        "mem_fraction_static": 0.94, "chunked_prefill_size": None, "expandable_segments": None,
        "env_file": "/etc/sglang/sglang.env", "written_at": "now", "written_by": "ops", "reason": ""})
    assert render.parse_env_file(text) == {"SGLANG_MEM_FRACTION_STATIC": "0.94"}


def test_wildcard_bind_is_probed_on_loopback():
    unit = render.render("sglang.service.j2", render.role_settings(sglang_host="0.0.0.0"))
    assert "--host 0.0.0.0" in unit
    assert "sglang-wait-healthy http://127.0.0.1:30000/health 900" in unit


def test_extra_vars_given_as_strings_render_as_their_values():
    """`-e sglang_disable_radix_cache=false` gives the string 'false', which Jinja takes as true:
    before, it added --disable-radix-cache, and `-e sglang_start_timeout_s=1200` failed in the
    unit after the env file was written."""
    unit = render.render("sglang.service.j2", render.role_settings(
        sglang_disable_radix_cache="false", sglang_enable_metrics="false", sglang_trust_remote_code="false",
        sglang_start_timeout_s="1200", sglang_stop_grace_s="45"))
    for flag in ("--disable-radix-cache", "--enable-metrics", "--trust-remote-code"):
        assert flag not in unit
    assert "TimeoutStartSec=1230" in unit and "TimeoutStopSec=75" in unit
    on = render.render("sglang.service.j2", render.role_settings(sglang_disable_radix_cache="true"))
    assert "--disable-radix-cache" in on
