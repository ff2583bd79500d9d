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
    assert re.search(r"^ExecStop=-/usr/bin/docker stop --time 60 sglang$", unit, re.M)
    assert "EnvironmentFile=-/etc/sglang/override.env" in unit
    # The allocator config reaches the container from the unit's environment.
    assert "--env PYTORCH_CUDA_ALLOC_CONF" in unit
    # Only an image already on the node runs: a missing tag fails the start, nothing is pulled.
    argv = render.exec_start_argv(unit, {"SGLANG_MEM_FRACTION_STATIC": "0.93", "SGLANG_CHUNKED_PREFILL_SIZE": "4096"})
    assert argv[:5] == ["/usr/bin/docker", "run", "--rm", "--pull", "never"]


def test_api_key_never_lands_in_the_unit():
    unit = render.render("sglang.service.j2", render.role_settings(sglang_api_key_file="/etc/sglang/api-key.yaml"))
    assert "--config /run/secrets/sglang-api-key.yaml" in unit
    assert '--volume "/etc/sglang/api-key.yaml:/run/secrets/sglang-api-key.yaml:ro"' in unit
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


# Values systemd would change or split if they went into ExecStart as they are: a JSON with
# spaces and quotes, a % (a unit specifier), a $ (an expansion), a backslash, a newline, a ;
TRICKY_ARGS = ["--json-model-override-args", '{"rope_scaling": {"type": "yarn", "factor": 4.0}}',
               "--served-model-name", "kimi 50% $HOME", "a\\b", "two\nlines", ";", "'single'"]


def test_free_form_values_reach_the_engine_unchanged():
    """Before, each extra argument went into ExecStart as it was: systemd split the JSON at its
    spaces, took % as a specifier and $HOME as an expansion."""
    argv = render.engine_argv(sglang_extra_args=TRICKY_ARGS, sglang_model_path="/models/Kimi K2.6",
                              sglang_docker_extra_args=["--label", "note=a b"])
    assert argv[argv.index("--log-level") - len(TRICKY_ARGS):argv.index("--log-level")] == TRICKY_ARGS
    assert argv[argv.index("--model-path") + 1] == "/models/Kimi K2.6"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.93"  # the environment's values still expand
    unit = render.render("sglang.service.j2", render.role_settings(sglang_docker_extra_args=["--label", "note=a b"]))
    whole = render.exec_start_argv(unit, {})
    assert whole[whole.index("--label") + 1] == "note=a b"


def test_the_unit_parser_follows_systemds_rules():
    """The parser the test above relies on, on lines whose meaning systemd.service(5) gives."""
    unit = 'ExecStart=/bin/x "a b" \'a"b\' c\\ d 100%% $$HOME ${ONE} $MANY "${ONE}x" "q\\"q" "t\\tu"\n'
    assert render.exec_start_argv(unit, {"ONE": "1", "MANY": "m n"}) == [
        "/bin/x", "a b", 'a"b', "c d", "100%", "$HOME", "1", "m", "n", "1x", 'q"q', "t\tu"]


def test_a_gpu_device_list_reaches_docker_as_one_quoted_value():
    """Docker wants --gpus '"device=0,1,2,3"' (its parser splits an unquoted list at the commas
    and refuses it); unquoted in ExecStart, systemd dropped the quotes, so the GPU check (which
    passes the value as it is) passed and the unit never started."""
    from opsctl import render

    settings = render.role_settings(sglang_gpus='"device=0,1,2,3"')
    argv = render.exec_start_argv(render.render("sglang.service.j2", settings),
                                  render.parse_env_file(render.render("sglang.env.j2", settings)))
    assert argv[argv.index("--gpus") + 1] == '"device=0,1,2,3"'


def test_an_ipv6_engine_address_is_bracketed_in_the_health_url():
    from opsctl import render

    unit = render.render("sglang.service.j2", render.role_settings(sglang_host="::1"))
    assert "sglang-wait-healthy http://[::1]:30000/health" in unit
    assert "--host ::1 " in unit
