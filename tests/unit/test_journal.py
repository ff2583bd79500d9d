"""The journal follower's records: journald's JSON as the short-iso lines the OOM analyzer reads,
with the unit run each belongs to."""

import json

from opsctl import journal, oom

# Two records as journalctl -o json gives them on a lab node: a line of the engine (from the
# unit's stdout) and one of systemd about the unit.
ENGINE_RECORD = {"__REALTIME_TIMESTAMP": "1764571933000000", "_HOSTNAME": "dflash-train",
                 "SYSLOG_IDENTIFIER": "sglang", "_PID": "7130", "_SYSTEMD_UNIT": "sglang.service",
                 "_SYSTEMD_INVOCATION_ID": "bec742d942474ce5bcc140a4049cb6ac",
                 "MESSAGE": "[2026-12-01 06:52:13 TP0] Scheduler hit an exception: Traceback (most recent call last):"}
SYSTEMD_RECORD = {"__REALTIME_TIMESTAMP": "1764571934000000", "_HOSTNAME": "dflash-train",
                  "SYSLOG_IDENTIFIER": "systemd", "_PID": "1", "UNIT": "sglang.service",
                  "INVOCATION_ID": "bec742d942474ce5bcc140a4049cb6ac",
                  "MESSAGE": "sglang.service: Main process exited, code=killed, status=9/KILL"}


def test_an_engine_line_keeps_its_run_and_the_short_iso_shape():
    entry = journal.entry_from_json(json.dumps(ENGINE_RECORD))
    assert entry.invocation == "bec742d942474ce5bcc140a4049cb6ac"
    stamp, host, rest = entry.text.split(" ", 2)
    assert host == "dflash-train" and rest.startswith("sglang[7130]: [2026-12-01 06:52:13 TP0] Scheduler hit")
    # the OOM analyzer takes the journal prefix off as it does for journalctl's own short-iso
    record = next(iter(oom.iter_log_lines([entry.text])))
    assert record.pid == 7130 and record.journal_time and record.msg.startswith("Scheduler hit an exception")


def test_systemds_line_about_the_unit_names_the_run_it_ended():
    entry = journal.entry_from_json(json.dumps(SYSTEMD_RECORD))
    assert entry.invocation == "bec742d942474ce5bcc140a4049cb6ac"
    assert entry.text.endswith("systemd[1]: sglang.service: Main process exited, code=killed, status=9/KILL")


def test_a_message_that_is_not_utf8_is_read_not_dropped():
    record = {**ENGINE_RECORD, "MESSAGE": list(b"bad byte \xff here")}
    assert "bad byte \ufffd here" in journal.entry_from_json(json.dumps(record)).text


def test_a_field_set_twice_or_cut_by_journald_is_text_not_a_lost_entry():
    twice = journal.entry_from_json(json.dumps({**ENGINE_RECORD, "MESSAGE": ["first", list(b"second \xff")]}))
    assert twice.text.endswith("sglang[7130]: first second \ufffd")
    long_line = journal.entry_from_json(json.dumps({**ENGINE_RECORD, "MESSAGE": None}))
    assert long_line.text.endswith("sglang[7130]: ") and "None" not in long_line.text
