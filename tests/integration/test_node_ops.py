"""opsctl on a provisioned lab node: status against healthy, hung and crashed engines, restarts
that succeed, that the planner refuses, and that fail and roll back; overrides vs Ansible."""

import json
import re
import shlex
import shutil
import subprocess
import time

import pytest
from labnode import REPO, LabNode

pytestmark = pytest.mark.lab


def test_status_healthy(lab_node):
    code, report = lab_node.status()
    assert (code, report["level"]) == (0, "OK"), report["problems"]
    assert report["unit"]["active_state"] == "active"
    assert report["health"]["ok"] and report["health_generate"]["ok"]
    assert report["kv_pool"]["max_total_num_tokens"] == 195011
    assert report["config"]["mem_fraction_static"] == {
        "name": "mem_fraction_static", "value": "0.93", "source": "ansible", "ansible_value": "0.93", "drift": False}
    assert report["engine"]["speculative_algorithm"] == "DFLASH"
    assert report["gpus"] == "no GPU (nvidia-smi not found)"
    human = lab_node.opsctl("status")
    assert human.returncode == 0 and "195,011 tokens" in human.stdout


def test_the_engines_start_is_read_from_its_current_run(lab_node):
    """status reads the verify kernel's self-check lines from the start of the engine's current
    run (journald's lines of the unit's InvocationID, up to the ready line), however long the run
    has logged since."""
    code = ("from opsctl import journal, systemd; from opsctl.startup_log import READY_LINE; "
            "run = systemd.unit_state('sglang.service').invocation; "
            "lines = journal.run_start(run, READY_LINE); print(run); print(len(lines)); print(lines[-1])")
    result = lab_node.sh(f"/opt/opsctl/venv/bin/python -c \"{code}\"")
    assert result.returncode == 0, result.stderr
    run, count, last = result.stdout.splitlines()
    assert len(run) == 32 and int(count) > 10
    assert last.endswith("The server is fired up and ready to roll!")


def test_status_hung_engine_is_critical(lab_node):
    lab_node.set_faults(hang_health_generate=True)
    try:
        code, report = lab_node.status()
        assert code == 2 and report["level"] == "CRITICAL"
        assert report["health"]["ok"] is True
        assert report["health_generate"]["ok"] is False
        assert any(problem.startswith("hung: /health answers") for problem in report["problems"])
    finally:
        lab_node.set_faults()
    assert lab_node.status()[0] == 0


def test_status_crashed_engine_is_critical(lab_node):
    # An engine that dies at every start: systemd keeps restarting it, status must say so.
    lab_node.set_faults(crash_at_start=True)
    try:
        lab_node.sh("docker kill sglang", check=True)
        code, report = lab_node.wait_for(lambda: (s := lab_node.status()) and s[1]["unit"]["active_state"] != "active" and s)
        assert code == 2 and report["level"] == "CRITICAL"
        assert not report["health"]["ok"]
    finally:
        lab_node.set_faults()
    result = lab_node.opsctl("restart", "--reason", "recover after crash drill")
    assert result.returncode == 0, result.stderr
    assert lab_node.status()[0] == 0


def test_restart_to_a_new_fraction_then_clear(lab_node):
    result = lab_node.opsctl("restart", "--fraction", "0.94", "--chunked-prefill-size", "4096", "--json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["ok"] and not outcome["rolled_back"]
    assert outcome["to"]["mem_fraction_static"] == 0.94
    assert "SGLANG_MEM_FRACTION_STATIC=0.94" in lab_node.file("/etc/sglang/override.env").splitlines()
    code, report = lab_node.status()
    assert code == 1 and report["level"] == "WARNING"  # an override drifts from Ansible
    assert report["config"]["mem_fraction_static"]["source"] == "override"
    assert report["engine"]["running"]["mem_fraction_static"] == 0.94
    assert report["kv_pool"]["max_total_num_tokens"] > 195011
    history = [json.loads(line) for line in lab_node.file("/var/lib/opsctl/history.jsonl").splitlines()]
    assert [r["outcome"] for r in history[-2:]] == ["started", "ok"]

    cleared = lab_node.opsctl("overrides", "clear")
    assert cleared.returncode == 0, cleared.stderr
    code, report = lab_node.status()
    assert code == 0 and report["engine"]["running"]["mem_fraction_static"] == 0.93


def test_planner_refuses_a_fraction_without_headroom(lab_node):
    before = lab_node.file("/etc/sglang/override.env")
    result = lab_node.opsctl("restart", "--fraction", "0.99")
    assert result.returncode == 2
    assert "the planner refuses this change" in result.stderr and "--force" in result.stderr
    assert lab_node.file("/etc/sglang/override.env") == before


def test_bad_values_are_refused_with_a_clear_message(lab_node):
    result = lab_node.opsctl("restart", "--fraction", "1.3")
    assert result.returncode == 2
    assert "1.3 is not a fraction: use a value strictly between 0 and 1" in result.stderr


def test_restart_the_gpu_cannot_start_with_rolls_back(lab_node):
    before = lab_node.file("/etc/sglang/override.env")
    result = lab_node.opsctl("restart", "--fraction", "0.99", "--force", "--json")
    assert result.returncode == 1, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["rolled_back"] and not outcome["attempt"]["ok"] and outcome["rollback"]["ok"]
    assert "crashed" in outcome["attempt"]["reason"]
    # It says why: the CUDA OOM the failed start logged, found by the same analysis as `opsctl oom`.
    assert [i["kind"] for i in outcome["attempt"]["incidents"]] == ["cuda_oom"]
    assert any("torch.OutOfMemoryError: CUDA out of memory" in line for line in outcome["attempt"]["journal_excerpt"])
    # Nothing lost: the previous override file is back byte for byte, and the engine serves on it.
    assert lab_node.file("/etc/sglang/override.env") == before
    code, report = lab_node.status()
    assert code == 0 and report["engine"]["running"]["mem_fraction_static"] == 0.93
    # status names the crash the failed start left in the journal.
    assert report["last_incident"]["kind"] == "cuda_oom"
    history = [json.loads(line) for line in lab_node.file("/var/lib/opsctl/history.jsonl").splitlines()]
    assert [(r["event"], r["outcome"]) for r in history[-3:]] == [
        ("restart", "started"), ("restart", "failed"), ("rollback", "ok")]


def test_a_second_restart_is_refused_while_the_first_holds_the_lock(lab_node):
    # 4 s more per start (in the lab): the first restart holds the lock well past the time the
    # second one needs to start on a busy machine, not for the lab's 3 s of a start alone.
    lab_node.set_faults(slow_start_seconds=400)
    try:
        lab_node.sh("nohup opsctl restart --reason first >/tmp/first.log 2>&1 &", check=True)
        lab_node.wait_for(lambda: lab_node.sh("test -e /var/lib/opsctl/engine.lock.json").returncode == 0,
                          timeout=10, interval=0.05)
        second = lab_node.opsctl("restart", "--reason", "second")
    finally:
        lab_node.set_faults()
    assert second.returncode == 2
    assert "another engine change is in progress" in second.stderr
    lab_node.wait_for(lambda: lab_node.sh("test -e /var/lib/opsctl/engine.lock.json").returncode != 0, timeout=60)
    assert lab_node.status()[0] == 0


def test_a_restart_whose_stop_step_fails_follows_the_new_run(lab_node):
    """When the restart's stop step fails (here an ExecStop that stops the container, then exits
    1), systemd marks the old run failed, then starts the new one under the same job. The restart
    must follow that new run, not roll back. (Whether a look lands in the moment the old run shows
    "failed" cannot be forced here; tests/unit/test_restart_cli.py replays that moment.)"""
    dropins = "/run/systemd/system/sglang.service.d"
    dropin = f"{dropins}/stop-fails.conf"
    text = "[Service]\nExecStop=\nExecStop=/bin/sh -c 'docker stop --time 10 sglang; exit 1'\n"
    lab_node.sh(f"mkdir -p {dropins} && echo {shlex.quote(text)} > {dropin} && systemctl daemon-reload", check=True)
    since = lab_node.sh("date +%s", check=True).stdout.strip()
    try:
        result = lab_node.opsctl("restart", "--reason", "stop step fails")
    finally:
        lab_node.sh(f"rm -f {dropin} && systemctl daemon-reload", check=True)
    assert result.returncode == 0, result.stderr
    journal = lab_node.sh(f"journalctl -u sglang.service --since @{since} -o cat --no-pager").stdout
    assert "Failed with result 'exit-code'" in journal, journal[-2000:]  # the stop step did fail
    history = [json.loads(line) for line in lab_node.file("/var/lib/opsctl/history.jsonl").splitlines()]
    assert [(r["event"], r["outcome"]) for r in history[-2:]] == [("restart", "started"), ("restart", "ok")]
    assert lab_node.status()[0] == 0


def test_ansible_reports_an_override_and_keeps_it_unless_told(lab_node):
    assert lab_node.opsctl("restart", "--fraction", "0.92", "--force").returncode == 0
    kept = lab_node.provision()
    assert kept.returncode == 0, kept.stdout[-3000:]
    assert "opsctl overrides are in force" in kept.stdout
    assert "SGLANG_MEM_FRACTION_STATIC=0.92" in lab_node.file("/etc/sglang/override.env")
    cleared = lab_node.provision("-e", "sglang_override_policy=clear")
    assert cleared.returncode == 0, cleared.stdout[-3000:]
    assert "SGLANG_MEM_FRACTION_STATIC" not in lab_node.file("/etc/sglang/override.env")
    code, report = lab_node.status()
    assert code == 0 and report["engine"]["running"]["mem_fraction_static"] == 0.93


def test_a_playbook_run_whose_engine_dies_fails_at_once_and_says_why(lab_node):
    """site.yml restarts the engine on a fraction it cannot start with: the play fails when the
    engine logs its CUDA OOM, naming it, instead of polling /health for the whole start budget
    (120 s in the lab, 900 in production). The next run on good values brings it back, past the
    unit's failed state."""
    failed = lab_node.provision("-e", "sglang_mem_fraction_static=0.99", "-e", "sglang_override_policy=clear")
    assert failed.returncode != 0, failed.stdout[-3000:]
    found = re.search(r"sglang.service did not come up on this run's values after ([0-9.]+) s: (.*?)\. Last lines",
                      failed.stdout, re.DOTALL)
    assert found, failed.stdout[-3000:]
    assert float(found[1]) < 60 and "CUDA out of memory" in found[2]
    # the lab's guard is off: the unit is stopped rather than left crash-looping on those values
    assert "The unit was stopped (the guard is off)." in failed.stdout
    lab_node.wait_for(lambda: lab_node.sh("systemctl is-active sglang.service").stdout.strip() in ("inactive", "failed"),
                      timeout=30)
    # the restart is still due on the node until one succeeds
    assert lab_node.sh("test -e /var/lib/sglang-role/restart-due").returncode == 0
    restored = lab_node.provision("-e", "sglang_override_policy=clear")
    assert restored.returncode == 0, restored.stdout[-3000:]
    assert lab_node.sh("test -e /var/lib/sglang-role/restart-due").returncode != 0
    code, report = lab_node.status()
    assert code == 0 and report["engine"]["running"]["mem_fraction_static"] == 0.93


def test_a_check_run_changes_nothing_and_says_what_it_would_do(lab_node):
    """--check --diff on a provisioned, healthy node reports no change; on a node whose engine
    is down (the seed's state after its OOM) it says the engine would start, where it failed
    before with "/health answers but sglang.service is inactive", and starts nothing."""
    clean = lab_node.provision("--check", "--diff")
    assert clean.returncode == 0, clean.stdout[-3000:]
    assert re.search(rf"{lab_node.name}\s*:\s*ok=\d+\s+changed=0\s", clean.stdout), clean.stdout[-3000:]
    lab_node.sh("systemctl stop sglang.service", check=True)
    try:
        down = lab_node.provision("--check", "--diff")
        assert down.returncode == 0, down.stdout[-3000:]
        assert "sglang.service is inactive (dead): it would start" in " ".join(down.stdout.split())
        assert lab_node.sh("systemctl is-active sglang.service").stdout.strip() == "inactive"
    finally:
        assert lab_node.provision().returncode == 0
    assert lab_node.status()[0] == 0


def test_a_check_run_on_a_node_never_provisioned_says_what_it_would_do(tmp_path):
    """--check before the first real run: it reports the Docker engine's install and ends for the
    node with what a real run would do, instead of failing at the first task that asks the
    engine (before: "Could not find the requested service docker")."""
    fresh = LabNode("dflash-chk", tmp_path)
    fresh.destroy()  # (one an earlier run left would not be fresh)
    fresh.create()
    try:
        check = fresh.provision("--check", "--diff")
        assert check.returncode == 0, check.stdout[-3000:]
        assert "dflash-chk has no Docker engine yet: a real run installs it" in " ".join(check.stdout.split())
        assert fresh.sh("command -v docker").returncode != 0  # nothing was installed
    finally:
        fresh.destroy()


def test_a_restart_made_since_a_due_mark_is_not_repeated_by_the_next_run(lab_node):
    """A failed run left a restart due; an operator's `opsctl restart` (or the guard, or a
    rollout) brought the engine up since, on what is on disk. The next site.yml run clears the
    mark instead of restarting the engine again (minutes of model load in production)."""
    lab_node.sh("mkdir -p /var/lib/sglang-role && echo due > /var/lib/sglang-role/restart-due")
    time.sleep(1.2)  # (the mark's mtime and the run's start are compared in whole seconds)
    assert lab_node.opsctl("restart", "--reason", "after a failed playbook run").returncode == 0
    run = lab_node.sh("systemctl show --property=InvocationID --value sglang.service").stdout.strip()
    again = lab_node.provision()
    assert again.returncode == 0, again.stdout[-3000:]
    assert "so it is not restarted again" in " ".join(again.stdout.split())
    assert lab_node.sh("test -e /var/lib/sglang-role/restart-due").returncode != 0
    assert lab_node.sh("systemctl show --property=InvocationID --value sglang.service").stdout.strip() == run
    # a mark newer than the engine's run (a change it has not started on) still restarts it
    lab_node.sh("echo due > /var/lib/sglang-role/restart-due")
    due = lab_node.provision()
    assert due.returncode == 0, due.stdout[-3000:]
    assert lab_node.sh("systemctl show --property=InvocationID --value sglang.service").stdout.strip() != run
    assert lab_node.sh("test -e /var/lib/sglang-role/restart-due").returncode != 0


def test_a_rebuilt_image_reaches_the_engine_and_keeps_the_one_it_replaced(lab_node, tmp_path):
    """A change to the image's sources rebuilds it under the same tag. The first run here fails
    after the build, at the check that a container of the image sees GPUs (the lab node has none):
    the play stops there, with what to do, and the restart the build asked for stays due on the
    node, so the next run restarts the engine on the new image. The image the tag named before
    stays as TAG-previous, and a build that the layer cache answers with the same image moves
    nothing. (On a GPU node the check counts the GPUs the container sees; nothing here runs that.)"""
    image = "dflash-lab/sglang-sim:0.5.23"

    def image_id(ref):
        return lab_node.sh(f"docker image inspect --format '{{{{.Id}}}}' {ref}").stdout.strip()

    def engine_image():
        return lab_node.sh("docker inspect --format '{{.Image}}' sglang").stdout.strip()
    original = image_id(image)
    changed = tmp_path / "engine-sim"
    shutil.copytree(REPO / "images" / "engine-sim", changed)
    with (changed / "Dockerfile").open("a") as dockerfile:
        dockerfile.write('LABEL io.dflash-lab.test="a changed image"\n')
    no_gpus = lab_node.provision("-e", f"engine_image_dockerfile_dir={changed}", "-e", "engine_image_gpu_check=true")
    assert no_gpus.returncode != 0
    assert f"A container of {image} started with --gpus all sees no GPUs (it needs 8)" in no_gpus.stdout
    assert "could not select device driver" in no_gpus.stdout  # docker's own answer to the GPU request
    assert "engine_image_gpu_check=false" in no_gpus.stdout
    assert "TASK [sglang" not in no_gpus.stdout  # it stopped before the engine's role
    new = image_id(image)
    assert new != original and image_id(f"{image}-previous") == original
    assert engine_image() == original  # not restarted yet...
    assert lab_node.sh("test -e /var/lib/sglang-role/restart-due").returncode == 0  # ...but due
    rebuilt = lab_node.provision("-e", f"engine_image_dockerfile_dir={changed}")  # nothing to build now
    assert rebuilt.returncode == 0, rebuilt.stdout[-3000:]
    assert engine_image() == new
    assert lab_node.sh("test -e /var/lib/sglang-role/restart-due").returncode != 0
    back = lab_node.provision()  # the original sources: the layer cache gives the original image
    assert back.returncode == 0, back.stdout[-3000:]
    assert "switches back" in back.stdout
    assert image_id(image) == original and image_id(f"{image}-previous") == new and engine_image() == original
    # (another build argument, which the Dockerfile does not use: a rebuild, the same image)
    args = {"BASE_IMAGE": "dflash-lab/debian-python:bookworm", "UNUSED": "1"}
    again = lab_node.provision("-e", json.dumps({"engine_image_build_args": args}))
    assert again.returncode == 0, again.stdout[-3000:]
    assert image_id(image) == original and image_id(f"{image}-previous") == new  # a no-op build moved nothing
    assert lab_node.sh(f"docker image inspect {image}-prebuild").returncode != 0
    assert lab_node.status()[0] == 0


def test_systemd_hands_free_form_values_to_the_engine_unchanged(lab_node):
    """The unit rendered with values systemd would split or expand if they went in as they are,
    read by the node's own systemd: a copy whose command writes the argv it was given."""
    from opsctl import render
    extra = ["--json-model-override-args", '{"rope_scaling": {"type": "yarn", "factor": 4.0}}',
             "--note", "50% of $HOME; a\\b", "two\nlines"]
    unit = render.render("sglang.service.j2", render.role_settings(
        sglang_extra_args=extra, sglang_served_model_name="kimi k2.6", sglang_docker_extra_args=["--label", "a=b c"]))
    unit = "\n".join(line for line in unit.splitlines() if not line.startswith(("ExecStartPre=", "ExecStartPost=",
                                                                               "ExecStop=", "Restart=")))
    unit = unit.replace("ExecStart=/usr/bin/docker", "ExecStart=/usr/bin/python3 /run/argv-check.py")
    script = "import json, sys; open('/run/argv-check.json', 'w').write(json.dumps(sys.argv[1:]))\n"
    lab_node.sh(f"echo {shlex.quote(script)} > /run/argv-check.py && "
                f"echo {shlex.quote(unit)} > /run/systemd/system/argv-check.service && "
                "systemctl daemon-reload && systemctl start argv-check", check=True)
    try:
        lab_node.wait_for(lambda: lab_node.file("/run/argv-check.json"), timeout=30)
        given = json.loads(lab_node.file("/run/argv-check.json"))
    finally:
        lab_node.sh("rm -f /run/systemd/system/argv-check.service && systemctl daemon-reload")
    environment = {**render.parse_env_file(lab_node.file("/etc/sglang/sglang.env")),
                   **render.parse_env_file(lab_node.file("/etc/sglang/override.env"))}
    assert given == render.exec_start_argv(unit, environment)[2:]  # opsctl reads the unit as systemd does
    assert given[given.index("--log-level") - len(extra):given.index("--log-level")] == extra
    assert given[given.index("--served-model-name") + 1] == "kimi k2.6"
    assert given[given.index("--label") + 1] == "a=b c"
    assert given[given.index("--mem-fraction-static") + 1] == environment["SGLANG_MEM_FRACTION_STATIC"]


def _engine_role_with_a_package(lab_node, tmp_path, package):
    """The docker_engine role run on the lab node with an empty package named `package` forced
    into dpkg's database beside the lab's docker.io (its name is what the role reads)."""
    control = (f"Package: {package}\nVersion: 5:27.0.0\nArchitecture: all\nMaintainer: lab\n"
               "Description: stands for a package of Docker's repository\n")
    folder = f"/tmp/fake-{package}"
    lab_node.sh(f"mkdir -p {folder}/DEBIAN && echo {shlex.quote(control)} > {folder}/DEBIAN/control && "
                f"dpkg-deb --build {folder} {folder}.deb && dpkg --force-conflicts -i {folder}.deb", check=True)
    playbook = tmp_path / "engine.yml"
    playbook.write_text("- hosts: dflash\n  roles: [docker_engine]\n")
    try:
        return subprocess.run([str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(lab_node.inventory),
                               str(playbook), "-l", lab_node.name], cwd=REPO / "ansible",
                              capture_output=True, text=True, check=False, timeout=300)
    finally:
        lab_node.sh(f"dpkg --remove {package}")


def test_a_node_with_docker_ce_keeps_its_engine(lab_node, tmp_path):
    """Installing docker.io beside Docker's own docker-ce makes apt remove docker-ce, and the
    engine with it (dpkg: "docker.io conflicts with docker-ce"): the role leaves it alone."""
    result = _engine_role_with_a_package(lab_node, tmp_path, "docker-ce")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "docker-ce installed: the node keeps that engine" in result.stdout
    installing = result.stdout.split("Ensure the Docker engine packages are installed.", 1)[1]
    assert installing.split("TASK [", 1)[0].count("skipping:") == 1
    assert lab_node.sh("docker info --format '{{.ServerVersion}}'").returncode == 0


def test_a_node_with_docker_containerd_alone_is_refused(lab_node, tmp_path):
    """docker.io's containerd would replace Docker's containerd.io under whatever uses it."""
    result = _engine_role_with_a_package(lab_node, tmp_path, "containerd.io")
    assert result.returncode != 0
    assert "containerd.io (Docker's repository) is installed" in result.stdout
