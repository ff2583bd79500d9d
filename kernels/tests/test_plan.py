"""CPU: the plan kernel, through Triton's interpreter. Its slices must cover every prefix once, in
slots the merge can find, and fit one wave of programs where that costs at most PLAN_FIT_PCT."""
import importlib
import random

from cases import interpreted_json

va = importlib.import_module("dflash_kernels.verify_attention")
MIXED = [1024, 3000, 8192, 20000, 50000, 100000, 131072, 200000]  # bench_verify.py's batch of 8


def run_plans(cases):
    return interpreted_json("interp_check.py", cases)


def slices_of(plan, lens, ns):
    """Each request's slices [(lo, hi)] in slot order, checked against the merge's (first, n)."""
    batch = len(lens)
    slots = ns + batch
    out = []
    for i in range(batch):
        first, n = plan[slots + i][:2]
        rows = plan[first:first + n]
        assert all(r[0] == i for r in rows), (i, rows)
        out.append([(r[1], r[2]) for r in rows])
    used = sum(len(s) for s in out)
    assert all(plan[p][0] == batch for p in range(used, slots)), "a slot past the last slice is not marked unused"
    return out


def chunk_of(slices):
    return max(hi - lo for s in slices for lo, hi in s)


def test_slices_cover_every_prefix_once():
    rng = random.Random()
    cases = []
    for _ in range(12):
        batch = rng.randint(1, 20)
        lens = [rng.choice([0, rng.randint(1, 300), rng.randint(1, 5000)]) for _ in range(batch)]
        cases.append(dict(lens=lens, num_splits=rng.randint(1, 40), block_n=rng.choice([16, 32]),
                          min_chunk=rng.choice([16, 64, 256])))
    for case, plan in zip(cases, run_plans(cases), strict=True):
        lens, ns, bn = case["lens"], case["num_splits"], case["block_n"]
        slices = slices_of(plan, lens, ns)
        assert sum(len(s) for s in slices) <= ns + len(lens), case
        chunk0 = max(-(-sum(lens) // ns), case["min_chunk"])
        chunk0 = -(-chunk0 // bn) * bn
        for L, s in zip(lens, slices, strict=True):
            # contiguous, from 0 to L, every slice but the last one chunk long
            assert [lo for lo, _ in s] == [0, *(hi for _, hi in s[:-1])][:len(s)], (case, s)
            assert (s[-1][1] if s else 0) == L, (case, s)
            if len(s) > 1:
                chunk = s[0][1] - s[0][0]
                assert chunk % bn == 0 and chunk0 <= chunk <= chunk0 * va.PLAN_FIT_PCT / 100, (case, chunk, chunk0)
                assert all(hi - lo == chunk for lo, hi in s[:-1]), (case, s)


def test_slices_fit_one_wave_where_it_pays():
    """The H200's batches of session 23, planned for 132 SMs."""
    cases = [
        dict(lens=[32768] * 8, num_splits=66, block_n=32, min_chunk=64),  # 72 slices of 4000 -> 64 of 4096
        dict(lens=MIXED, num_splits=66, block_n=32, min_chunk=64),  # 70 -> 64 (8352, 7% longer)
        dict(lens=[1024] * 48, num_splits=66, block_n=32, min_chunk=64),  # 96 of 768 -> 48 of 1024 (33%)
        dict(lens=MIXED, num_splits=16, block_n=32, min_chunk=64),  # t = 64: one wave needs 56%: unchanged
        dict(lens=[131072], num_splits=66, block_n=32, min_chunk=64),  # one request: always one wave
        dict(lens=[1024] * 48, num_splits=33, block_n=32, min_chunk=256),  # more requests than columns
    ]
    got = [slices_of(plan, c["lens"], c["num_splits"]) for c, plan in zip(cases, run_plans(cases), strict=True)]
    assert [sum(len(s) for s in sl) for sl in got] == [64, 64, 48, 22, 66, 48]
    assert [chunk_of(sl) for sl in got] == [4096, 8352, 1024, 32096, 2016, 1024]
