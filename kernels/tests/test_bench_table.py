"""CPU: bench_verify.py's results table, rendered from a run's saved JSON (--table-from)."""
import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "bench_verify.py")
HEAD = dict(device="NVIDIA H200", copy_bw_TBs=4.24, mm_TFLOPs=686.0, triton="3.6.0", torch="2.11.0", date="2026-12-04")


def _row(lens, t, eager_us, graph_us, peer_us, floor_us):
    return dict(bs=len(lens), lens=lens, t=t, h=8, ours_us=eager_us, ours_graph_us=graph_us, peer_us=peer_us,
                floor_us=floor_us, bound="compute", ours_GBs=1.0, ours_TFLOPs=1.0, ours_pct_floor=100 * floor_us / eager_us,
                peer_pct_floor=100 * floor_us / peer_us, speedup=peer_us / eager_us)


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_table_from_a_saved_run_gives_the_graph_calls_share_of_the_floor(tmp_path):
    """The eager call's share and the graph replay's share each come from their own time: a slow
    eager call (host cost) must not lower the graph figure, which is what SGLang runs."""
    run = dict(head=HEAD, rows=[_row([131072], 16, 100.0, 80.0, 17440.0, 53.2),
                                _row([200000, 1000], 64, 400.0, 500.0, 25000.0, 325.0)])
    path = tmp_path / "bench_verify.json"
    path.write_text(json.dumps(run))
    out = subprocess.run([sys.executable, BENCH, "--table-from", str(path)], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("NVIDIA H200  copy 4.24 TB/s  matmul 686 TFLOP/s  triton 3.6.0")
    cols = _cells(lines[1])
    row = dict(zip(cols, _cells(lines[3]), strict=True))
    assert (row["ours % floor"], row["graph % floor"], row["speedup"]) == ("53.2%", "66.5%", "174x")
    mixed = dict(zip(cols, _cells(lines[4]), strict=True))
    assert (mixed["L (max)"], mixed["ours % floor"], mixed["graph % floor"]) == ("mix 200000", "81.2%", "65.0%")
