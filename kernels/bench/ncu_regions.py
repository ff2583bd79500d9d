"""Warp-stall samples of an ncu source page (profile_split.sh's ncu_source_*.csv), summed per
block of SASS addresses, with each block's most executed opcodes and top stall reasons: enough
to tell the partitions of the warp-specialised kernel apart (the loader's LDGSTS, the V group's
64x256 HGMMA, the S group's 64x32 HGMMA and MUFU) and to see where each one waits.

    python kernels/bench/ncu_regions.py ncu_source_VARIANT.csv [--block 0x400] [--min 0.3]
"""
from __future__ import annotations

import argparse
import csv
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def number(row, col):
    try:
        return float(row[col] or 0)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--block", type=lambda s: int(s, 0), default=0x400, help="bytes of SASS per block")
    ap.add_argument("--min", type=float, default=0.3, help="leave out blocks under this %% of samples")
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    head = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    cols = {name: i for i, name in enumerate(rows[head])}
    data = [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    stalls = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    base = int(data[0][cols["Address"]], 16)
    total = sum(number(r, cols[SAMPLES]) for r in data)
    blocks: dict[int, list] = {}
    for r in data:
        b = (int(r[cols["Address"]], 16) - base) // a.block
        entry = blocks.setdefault(b, [0.0, Counter(), Counter()])
        entry[0] += number(r, cols[SAMPLES])
        words = r[cols["Source"]].split()
        op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "?")
        entry[1][op.split(".")[0]] += int(number(r, cols["Instructions Executed"]))
        for s in stalls:
            entry[2][s[len("stall_"):]] += number(r, cols[s])
    print(f"{int(total)} samples; blocks of {a.block:#x} bytes of SASS")
    for b, (samples, ops, why) in sorted(blocks.items()):
        if 100 * samples / total < a.min:
            continue
        top_ops = " ".join(f"{k}:{v}" for k, v in ops.most_common(5))
        top_why = ", ".join(f"{k} {100 * v / total:.1f}" for k, v in why.most_common(3) if v)
        print(f"{b * a.block:#07x} {100 * samples / total:5.1f}%  {top_ops}  | {top_why}")


if __name__ == "__main__":
    main()
