"""Testinfra checks of a node provisioned by ansible/site.yml (lab inventory)."""

import json

ENGINE = "http://127.0.0.1:30000"


def test_environment_file_holds_the_tuned_values(host):
    env = host.file("/etc/sglang/sglang.env")
    assert env.exists and env.mode == 0o644
    lines = set(env.content_string.splitlines())
    assert {"SGLANG_MEM_FRACTION_STATIC=0.93", "SGLANG_CHUNKED_PREFILL_SIZE=4096",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"} <= lines


def test_unit_reads_both_environment_files_and_passes_the_flags(host):
    unit = host.file("/etc/systemd/system/sglang.service").content_string
    assert "EnvironmentFile=/etc/sglang/sglang.env" in unit
    assert "EnvironmentFile=-/etc/sglang/override.env" in unit
    assert "--mem-fraction-static ${SGLANG_MEM_FRACTION_STATIC}" in unit
    assert "Restart=always" in unit
    assert host.run("systemd-analyze verify /etc/systemd/system/sglang.service").rc == 0


def test_service_is_enabled_and_active(host):
    service = host.service("sglang")
    assert service.is_enabled
    assert service.is_running


def test_engine_container_runs_from_the_built_image(host):
    inspect = json.loads(host.check_output("docker inspect sglang"))[0]
    assert inspect["State"]["Running"] is True
    assert inspect["Config"]["Image"] == "dflash-lab/sglang-sim:0.5.23"
    image = json.loads(host.check_output("docker image inspect dflash-lab/sglang-sim:0.5.23"))[0]
    assert image["Id"] == inspect["Image"]


def test_build_context_holds_only_what_the_sources_hold(host):
    """prepare.yml left a file the sources do not have; the image role removed it."""
    context = "/opt/dflash/images/dflash-lab_sglang-sim"
    assert host.file(f"{context}/sglang_sim/server.py").exists
    assert not host.file(f"{context}/sglang_sim/removed_module.py").exists


def test_health_and_a_real_generate(host):
    assert host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' {ENGINE}/health") == "200"
    body = json.dumps({"text": "The quick brown fox", "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    answer = json.loads(host.check_output(f"curl -s -X POST {ENGINE}/generate -H 'Content-Type: application/json' -d '{body}'"))
    assert answer["meta_info"]["prompt_tokens"] == 4
    assert answer["meta_info"]["completion_tokens"] == 4


def test_port_is_bound_to_loopback_only(host):
    listening = host.check_output("ss -Hltn 'sport = :30000'")
    addresses = {line.split()[3] for line in listening.splitlines()}
    assert addresses == {"127.0.0.1:30000"}


def test_expandable_segments_reach_the_engine_process(host):
    pid = host.check_output("docker inspect --format '{{.State.Pid}}' sglang")
    # The container runs tini (--init) as PID 1; the engine is its child.
    engine_pid = host.check_output(f"pgrep -P {pid}")
    environ = host.file(f"/proc/{engine_pid.split()[0]}/environ").content_string.split("\0")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in environ


def test_opsctl_is_installed_and_reports_healthy(host):
    result = host.run("opsctl status --json")
    report = json.loads(result.stdout)
    assert result.rc == 0, report["problems"]
    assert report["level"] == "OK"
    assert report["health_generate"]["ok"] is True
    assert report["config"]["mem_fraction_static"]["value"] == "0.93"
    assert report["config"]["mem_fraction_static"]["source"] == "ansible"
