"""Per layer in a graph of eight, the shipped config with bf16 partial outputs merged with the
float32 table's tiles and with the bf16 table's (MERGE_TILE_BY_PARTIALS_BF16), two interleaved
runs each, on the GPU machine:

    python kernels/bench/merge_table_ab.py

merge_tiles.py times the merge alone; this shows whether a tile's gain holds inside a layer's
graph (RESULTS.md, session 32: 128 x 32 was faster alone and slower per layer).
"""
from __future__ import annotations

import os
import sys

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import layers_graph  # noqa: E402
import sweep_verify  # noqa: E402

va = layers_graph.va
TABLES = {"f32-table": va.MERGE_TILE_BY_PARTIALS, "bf16-table": va.MERGE_TILE_BY_PARTIALS_BF16}
POINTS = {"sm90": "131072+131072:16,131072+131072+131072:16,32768+32768+32768+32768:16,131072:64,32768:64,131072:16",
          "sm120": "131072:16,32768:16,131072+131072:16,131072+131072+131072:16"}


def main():
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, flush=True)
    torch.manual_seed(0)
    shipped = va.MERGE_TILE_BY_PARTIALS_BF16
    for key, points in POINTS.items():
        cfg = va.CONFIGS[key]
        for lens, t in sweep_verify.parse_points(points):
            # the launcher's split count for this batch (a query of the shape is all plan reads)
            q = torch.empty(len(lens) * t, 8, va.D_LATENT, dtype=torch.bfloat16, device="cuda")
            _, ns, _ = va.plan(q, len(lens), t, None, cfg)
            tiles, times = {}, {name: [] for name in TABLES}
            for _ in range(2):
                for name, table in TABLES.items():
                    va.MERGE_TILE_BY_PARTIALS_BF16 = table  # merge_tile reads the table at each call
                    tiles[name] = tuple(va.merge_tile(cfg, ns, len(lens)))
                    times[name].append(layers_graph.per_layer_us(lens, t, 8, 8, cfg)[1])
            va.MERGE_TILE_BY_PARTIALS_BF16 = shipped
            print(f"{key} L={'+'.join(map(str, lens))}:{t}: " + ", ".join(
                f"{name} {tiles[name]} " + " / ".join(f"{v:.1f}" for v in times[name]) for name in TABLES)
                + " us per layer", flush=True)


if __name__ == "__main__":
    main()
