"""CPU: ahead-of-time build for sm_120 and sm_90 with no GPU, and what the cubins contain."""
import dataclasses
import glob
import json
import os
import re
import subprocess
import sys

import pytest
import triton
from dflash_kernels import aot
from dflash_kernels import verify_teams as teams
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

va = aot.va

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
SM120_SMEM_LIMIT = 101376  # 99 KB per block on sm_120 (RTX PRO 6000 / RTX 50xx)
SM90_SMEM_LIMIT = 227 * 1024  # per block on the H100 / H200
SMEM_LIMITS = {120: SM120_SMEM_LIMIT, 90: SM90_SMEM_LIMIT}
# the launcher picks a merge tile from the split count and the batch (from the table of its
# config's partial type): all are built
MERGE_NAMES = {arch: {aot.merge_name(tile, lse) for lse in (True, False) for tile in va.merge_tiles(aot._config(arch))}
               for arch in (120, 90)}
# the split kernel for each pool dtype (bf16, fp8 e4m3, fp8 e5m2) and kv_indices dtype (int32, int64)
SPLIT_NAMES = {"verify_split" + suffix + idx for suffix in aot.KV_POOL_TYPES for idx in aot.INDEX_TYPES}
# the plugin's tree-mask kernel (1 and 2 words), per batch bucket; DFlash's chains need none
MASK_NAMES = {f"draft_mask_w{w}_tree" for w in (1, 2)}
# (mbarrier instructions, SYNCS.*, are sm_90's and sm_120's: the two-team kernel waits on them)
HOPPER_ONLY = re.compile(r"\b(HGMMA|WGMMA|UTMALDG|UTMASTG|UTMAPF|UBLKCP)\b")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot")
    manifest = aot.build((120, 90), str(out), heads=(8,), bs_pads=(8,))
    return out, manifest


def _spec(arch, name):
    """(name, fn, signature, constexprs, options) of one kernel of the AOT build (h = 8)."""
    return next(spec for spec in aot.kernel_specs(arch, 8) if spec[0] == name)


def _sass(path):
    r = subprocess.run([CUOBJDUMP, "--dump-sass", str(path)], capture_output=True, text=True, check=True)
    return r.stdout


def _res_usage(path):
    """cuobjdump's resource usage of a cubin (registers, stack frame, local memory)."""
    return subprocess.run([CUOBJDUMP, "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout


def test_manifest(built):
    out, manifest = built
    with open(os.path.join(out, "manifest.json")) as f:
        on_disk = json.load(f)
    assert on_disk == json.loads(json.dumps(manifest))
    assert manifest["triton_version"] == triton.__version__
    assert manifest["archs"] == [120, 90]
    names = {(k["arch"], k["name"]) for k in manifest["kernels"]}
    for arch in (120, 90):
        for name in {"verify_plan"} | MASK_NAMES | SPLIT_NAMES | MERGE_NAMES[arch]:
            assert (arch, name) in names
    assert len(names) == len(manifest["kernels"]) == sum(1 + len(MASK_NAMES) + len(SPLIT_NAMES) + len(MERGE_NAMES[arch])
                                                         for arch in (120, 90))
    # every pool's split kernel and the plan kernel, which rounds slices to its tile, share a config
    # (fp8 pools among them: on sm_90 they run the bf16 pools' 64-latent tiles since session 29)
    tiles = {(k["arch"], k["name"]): k["constexprs"]["BLOCK_N"] for k in manifest["kernels"]
             if k["name"].startswith(("verify_split", "verify_plan"))}
    assert any("fp8" in name for name in SPLIT_NAMES)
    for arch, key in ((120, "sm120"), (90, "sm90")):
        assert {tiles[arch, name] for name in {"verify_plan"} | SPLIT_NAMES} == {va.CONFIGS[key].block_n}
    for k in manifest["kernels"]:
        assert os.path.getsize(os.path.join(out, k["cubin"])) > 0
        assert k["symbol"].startswith(("tree_mask_kernel",) if k["name"] in MASK_NAMES
                                      else "_verify_")


def test_sm120_cubin_is_sm120_mma_sync_only(built):
    out, manifest = built
    cubins = sorted(glob.glob(os.path.join(out, "sm_120", "*.cubin")))
    # plan, draft masks, split for three pool and two index dtypes, merge with and without LSE a tile
    assert len(cubins) == 1 + len(MASK_NAMES) + len(SPLIT_NAMES) + len(MERGE_NAMES[120])
    for c in cubins:
        sass = _sass(c)
        assert re.search(r"code for sm_120a?\b", sass), f"{c}: not sm_120 code"
        bad = set(HOPPER_ONLY.findall(sass))
        assert not bad, f"{c}: Hopper-only instructions {bad}"
    for name in SPLIT_NAMES:  # mma.sync tensor-core path; an fp8 pool is widened to bf16 first
        assert "HMMA.16816.F32.BF16" in _sass(os.path.join(out, "sm_120", name + "_h8.cubin")), name
    # every pool runs a Gluon kernel over S^T with a warp's 36 mma.sync of S^T and 32 of O^T a
    # tile, none repeated, each twice in the SASS: a bf16 pool's two-team kernel holds each
    # team's code, an fp8 pool's 8-warp kernel its draft blocks' loop and its pool's (and it
    # widens its tiles)
    symbols = {k["name"]: k["symbol"] for k in manifest["kernels"] if k["arch"] == 120}
    for name in SPLIT_NAMES:
        sass = _sass(os.path.join(out, "sm_120", name + "_h8.cubin"))
        bf16 = name.removesuffix("_i64") == "verify_split"
        assert symbols[name] == ("_verify_split_kernel_teams" if bf16 else "_verify_split_kernel_mma2"), name
        assert sass.count("HMMA.16816.F32.BF16") == (36 + 32) * 2, name
        assert ("F2FP.F16.E" in sass) != bf16, name
    for k in manifest["kernels"]:  # every kernel fits a block of its arch (fp8 splits take more)
        assert k["shared_bytes"] <= SMEM_LIMITS[k["arch"]], k


def test_split_kernels_do_not_spill(built):
    """Every split kernel, of each pool and kv_indices dtype, for both archs, keeps its loop state
    in registers: no stack frame. SGLang passes int64 kv_indices, and sm_120's kernels spilled
    for them until the slots were narrowed to int32 (_tile_slots)."""
    out, _ = built
    for arch in (120, 90):
        for name in SPLIT_NAMES:
            cubin = os.path.join(out, f"sm_{arch}", name + "_h8.cubin")
            usage = _res_usage(cubin)
            assert re.search(r"STACK:0 .*LOCAL:0", usage), f"sm_{arch} {name}: {usage}"


def test_merge_issues_its_first_loads_before_its_early_return(built):
    """Every merge tile's six first loads (its rows' two qo_indptr entries, the plan's pair, a
    lone request's kv_indptr pair) are in flight together before a program past its request's
    rows returns, so its partials' loads wait one memory round trip, not two: until session 33
    the compiler moved the plan's loads past that return."""
    out, _ = built
    for arch in (120, 90):
        for name in MERGE_NAMES[arch]:
            sass = _sass(os.path.join(out, f"sm_{arch}", name + "_h8.cubin"))
            assert sass[:sass.index("EXIT")].count("LDG") == 6, f"sm_{arch} {name}"


def test_sm90_cubin_uses_wgmma(built):
    """The same check finds Hopper instructions where they are expected, so a clean sm_120
    result above means something."""
    out, _ = built
    sass = _sass(os.path.join(out, "sm_90", "verify_split_h8.cubin"))
    assert re.search(r"code for sm_90a?\b", sass)
    assert "HGMMA" in sass


def test_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "dflash_kernels.aot", "--arch", "120", "--out", str(tmp_path),
                        "--heads", "16", "--batch-pad", "2"],
                       capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr[-2000:]
    with open(tmp_path / "manifest.json") as f:
        m = json.load(f)
    assert {k["name"] for k in m["kernels"]} == {"verify_plan"} | MASK_NAMES | SPLIT_NAMES | MERGE_NAMES[120]


def _run_module(module, *args, **env):
    """`python -m module args` in a clean process (no TRITON_INTERPRET: the JIT's own path), with
    env added to this one's environment."""
    env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, **env}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(__file__)))


def _aot_check(tmp_path, *args):
    """`aot --triton-cache --check` in a clean process."""
    return _run_module("dflash_kernels.aot", "--out", str(tmp_path / "out"), "--triton-cache", str(tmp_path / "cache"),
                       "--check", *args)


def test_the_launchers_calls_find_the_prebuilt_binaries(tmp_path):
    """The image fills a Triton cache with the AOT build and points TRITON_CACHE_DIR at it: the
    launcher's calls (SGLang's argument types, batches 1 to 48, t = 16 and 64, with and without
    LSE, bf16 and fp8 pools, int64 and int32 kv_indices, chain and tree masks) and the plugin's
    draft-block mask kernels must find every kernel there, on sm_120 (Triton kernel) and sm_90
    (Gluon split kernel, for every pool), instead of compiling at first use."""
    r = _aot_check(tmp_path, "--arch", "120", "--arch", "90", "--heads", "8")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "every launcher call finds its prebuilt binary" in r.stdout
    # the image's runtime stage checks the copied cache the same way, with the runtime's Triton
    r = _run_module("dflash_kernels.prebuilt", "--arch", "120", "--arch", "90", "--heads", "8",
                    TRITON_CACHE_DIR=str(tmp_path / "cache"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"every launcher call finds its prebuilt binary in {tmp_path / 'cache'}" in r.stdout


def test_the_check_reports_a_missing_binary(tmp_path):
    """Batch 3 pads to a plan bucket of 4, which this build leaves out: the check says so, for the
    plan and the mask kernels (each kernel's first miss: the check's compile fills the cache)."""
    r = _aot_check(tmp_path, "--arch", "120", "--heads", "8", "--batch-pad", "2", "--batch-pad", "8",
                   "--batch-pad", "64")
    assert r.returncode == 1
    case = "(h=8, batch=3, t={}, lse=False, pool=bfloat16, kv_indices=int64, mask={})"
    assert "MISS: sm_120 tree_mask_kernel " + case.format(16, "tree") in r.stderr
    assert "MISS: sm_120 _verify_plan_kernel " + case.format(16, "chain") in r.stderr
    assert "would compile at first use instead of loading a prebuilt binary" in r.stderr


def _assert_wgmma_stays_async(ptx, tmp_path):
    """ptxas keeps the MMAs asynchronous: an accumulator read while its wgmma may be in flight
    makes it serialise every wgmma of the kernel (info C7514), which cost 1.7x on the H200
    (RESULTS.md)."""
    (tmp_path / "k.ptx").write_text(ptx)
    ptxas = os.path.join(os.path.dirname(CUOBJDUMP), "ptxas")
    info = subprocess.run([ptxas, "-arch=sm_90a", "-v", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "again.cubin")],
                          capture_output=True, text=True, check=True)
    assert "C7514" not in info.stdout + info.stderr, info.stderr


def _build_warp_specialised(kernel, sig, const, opts, tmp_path):
    """(SASS, PTX, the partitions' register counts) of a warp-specialised sm_90 build, once it is
    checked for what every layout holds: 12 warps, 227 KB, the launch's 168 registers and no spill."""
    from dflash_kernels import verify_gluon as vg
    assert kernel is vg._verify_split_kernel_gluon_ws
    k = aot.compile_one(kernel, sig, const, 90, opts)
    assert k.metadata.num_warps == 4 + 4 + vg.WS_LOADER_WARPS.value
    assert k.metadata.shared <= SM90_SMEM_LIMIT
    cubin = tmp_path / "ws.cubin"
    cubin.write_bytes(k.asm["cubin"])
    usage = _res_usage(cubin)
    assert re.search(r"REG:168 STACK:0 .*LOCAL:0", usage), usage  # the launch limit, nothing spilled
    ptx = k.asm["ptx"]
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))
    return _sass(cubin), ptx, regs


def test_warp_specialised_sm90_kernel_builds_as_designed(tmp_path):
    """The kernel sm_90 runs (session 28): the warp-specialised Gluon kernel over 64-latent tiles
    in two K buffers, S_j issued in its own iteration. It compiles for sm_90 into three partitions
    with reallocated registers and no spill; the S group computes a tile's whole S in 36 wgmma of
    64 x 64 and P.V over its 256 output columns, the V group the other 256, and the loader's copies
    are counted on an mbarrier; Q, two K buffers of 64 latents and P fit in the 227 KB of a block."""
    from dflash_kernels import verify_gluon as vg
    _, kernel, sig, const, opts = _spec(90, "verify_split")  # what the launcher runs for a bf16 pool
    assert (const["BLOCK_N"], const["NUM_STAGES"], const["S_AHEAD"]) == (64, 2, False)
    sass, ptx, regs = _build_warp_specialised(kernel, sig, const, opts, tmp_path)
    assert {"256", str(vg.WS_V_REGS.value), str(vg.WS_LOADER_REGS.value)} <= regs, regs
    # S once per tile (no S of the next tile ahead of the loop): (256 + 256 + 64) / 16 = 36
    # instructions over 64 latents; P.V, 64 / 16 steps, 256 columns for each group
    assert sass.count("HGMMA.64x64x16.F32.BF16") == 36 and "HGMMA.64x32x16" not in sass
    assert sass.count("HGMMA.64x256x16.F32.BF16") == 2 * 4
    assert "LDGSTSBAR.64.ARVCNT" in sass  # cp.async.mbarrier.arrive.noinc
    _assert_wgmma_stays_async(ptx, tmp_path)


def test_warp_specialised_q_in_registers_layout_builds_as_designed(tmp_path):
    """The layout sm_90 ran before session 28, kept as a candidate: 32-latent tiles in four K
    buffers with S_{j+1} issued ahead, the S group computing a whole 64 x 32 tile per instruction
    with Q's first 384 columns in registers (the loader in 24 registers leaves it 248), the V
    group its 384 columns of P.V, both groups' P.V taking P from registers; Q, four K buffers of
    32 latents and P fit in the 227 KB of a block."""
    from dflash_kernels import verify_gluon as vg
    va = aot.va
    _, _, sig, const, _ = _spec(90, "verify_split")
    cfg = va.VerifyConfig(64, 32, 4, 4, 64, gluon=True, warp_specialized=True, s_cols=128, q_regs=3, p_regs=True)
    kernel, ws_const, opts = va.split_kernel(cfg, 8)
    sass, ptx, regs = _build_warp_specialised(kernel, sig, {**const, **ws_const}, opts, tmp_path)
    assert {"256", str(vg.WS_V_WIDE_REGS.value), str(vg.WS_LOADER_NARROW_REGS.value)} <= regs, regs
    # S of tile 0 and of tile j + 1: (256 + 256 + 64) / 16 = 36 instructions each, of which the
    # 24 over Q's first 384 columns take Q from registers (an R operand before the descriptor)
    assert sass.count("HGMMA.64x32x16.F32.BF16") == 2 * 36
    assert len(re.findall(r"HGMMA\.64x32x16\.F32\.BF16 R\d+, R\d+, gdesc", sass)) == 2 * 24
    # P.V, 32 / 16 steps: the S group's 128 columns; the V group's 256 and 128 columns, all with P
    # from registers (p_regs: the V group reads it from shared memory once for both chains)
    assert sass.count("HGMMA.64x256x16.F32.BF16") == 2
    assert sass.count("HGMMA.64x128x16.F32.BF16") == 2 * 2
    assert len(re.findall(r"HGMMA\.64x(?:256|128)x16\.F32\.BF16 R\d+, R\d+, gdesc", sass)) == 2 + 2 * 2
    assert "LDGSTSBAR.64.ARVCNT" in sass  # cp.async.mbarrier.arrive.noinc
    _assert_wgmma_stays_async(ptx, tmp_path)


def test_warp_specialised_sm90_kernel_builds_for_fp8_pools(tmp_path):
    """The shipped kernel for an fp8 pool (sessions 8 and 29): the bf16 pools' tiles (two K buffers
    of 64 latents, S_j in its own iteration), MMA groups of 256 columns each, and a loader that
    stages the pool's rows inside the buffers (cp.async, not counted on the barrier: it arrives
    once its widened stores are in) and copies a draft block's bf16 rows as before; it spills
    nothing and widens with full-rate instructions (no F2F, the conversion pipe of the softmax's
    exponentials)."""
    from dflash_kernels import verify_gluon as vg
    _, kernel, sig, const, opts = _spec(90, "verify_split_fp8e4m3")
    assert sig["KV"] == "*fp8e4nv" and "k_scale" in sig
    assert (const["BLOCK_N"], const["NUM_STAGES"], const["S_AHEAD"]) == (64, 2, False)
    assert (const["S_COLS"], const["Q_REGS"], const["P_REGS"]) == (256, 0, False)
    sass, ptx, regs = _build_warp_specialised(kernel, sig, const, opts, tmp_path)
    assert {"256", str(vg.WS_V_REGS.value), str(vg.WS_FP8_LOADER_REGS.value)} <= regs, regs
    assert sass.count("HGMMA.64x64x16.F32.BF16") == 36 and sass.count("HGMMA.64x256x16.F32.BF16") == 2 * 4
    assert "LDGSTSBAR.64.ARVCNT" in sass  # the draft block's copies, as in the bf16 kernel
    assert "F2FP.F16.E4M3.UNPACK_B" in sass and "F2F.BF16" not in sass
    _assert_wgmma_stays_async(ptx, tmp_path)


def test_two_team_kernel_builds_for_sm120(tmp_path):
    """sm_120's kernel for bf16 pools (verify_teams.py, session 12): 4 + 4 warps and a loader
    warpgroup, registers reallocated (team 1 232, the loader 56, team 0 the rest), nothing
    spilled, within the 99 KB of a block; mma.sync only, the copies counted on mbarriers."""
    from dflash_kernels import verify_teams as vt
    _, kernel, sig, const, opts = _spec(120, "verify_split")
    assert kernel is vt._verify_split_kernel_teams and opts["num_warps"] == vt.TEAM_WARPS
    k = aot.compile_one(kernel, sig, const, 120, opts)
    assert k.metadata.num_warps == 12  # (the loader's 2 warps padded to a warpgroup)
    assert k.metadata.shared <= SM120_SMEM_LIMIT
    regs = set(re.findall(r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", k.asm["ptx"]))
    assert {str(vt.TEAMS_REGS.value), str(vt.LOADER_REGS.value)} <= regs, regs
    cubin = tmp_path / "teams.cubin"
    cubin.write_bytes(k.asm["cubin"])
    usage = _res_usage(cubin)
    assert re.search(r"STACK:0 .*LOCAL:0", usage), usage
    sass = _sass(cubin)
    assert "HMMA.16816.F32.BF16" in sass and not HOPPER_ONLY.search(sass)
    assert "LDGSTSBAR.64.ARVCNT" in sass  # cp.async.mbarrier.arrive.noinc


@pytest.mark.parametrize("arch", [90, 120])
def test_programmatic_dependent_launch_builds_into_both_kernels(arch, monkeypatch):
    """VerifyConfig.pdl = 3: the split kernel waits for the kernel before it, then lets the merge
    launch, before any load; the merge loads its request's rows and slots, then waits once before
    its partials' loads; both carry Triton's launch attribute. The shipped configs (pdl 0) hold
    neither instruction."""
    key = va.config_key(arch // 10)
    shipped = {spec[0]: spec for spec in aot.kernel_specs(arch, 8)}
    monkeypatch.setitem(va.CONFIGS, key, dataclasses.replace(va.CONFIGS[key], pdl=3))
    specs = {spec[0]: spec for spec in aot.kernel_specs(arch, 8)}
    merge = aot.merge_name(va.merge_tiles(va.CONFIGS[key])[-1], False)
    for name in ("verify_split", merge):
        _, fn, sig, const, opts = specs[name]
        ptx = aot.compile_one(fn, sig, const, arch, opts).asm["ptx"]
        assert opts["launch_pdl"] and ptx.count("griddepcontrol.wait") == 1
        wait, first_load = ptx.index("griddepcontrol.wait"), ptx.index("ld.global")
        if name == merge:
            assert "griddepcontrol.launch_dependents" not in ptx
            assert first_load < wait and "ld.global" in ptx[wait:]
        else:
            assert wait < ptx.index("griddepcontrol.launch_dependents") < first_load
        _, fn, sig, const, opts = shipped[name]
        assert "launch_pdl" not in opts and "griddepcontrol" not in aot.compile_one(fn, sig, const, arch, opts).asm["ptx"]


@gluon.jit
def _epilogue_stage_banks(STAGE: gl.constexpr, ROW_MAJOR: gl.constexpr):
    """Compiles only if a team's O^T block goes through a stage of layout STAGE (held [rows,
    columns] if ROW_MAJOR, else [columns, rows]) with no bank conflict, stores and row reads."""
    if ROW_MAJOR:
        view = gl.allocate_shared_memory(gl.float32, [16, 128], STAGE).permute((1, 0))
    else:
        view = gl.allocate_shared_memory(gl.float32, [128, 16], STAGE)
    gl.static_assert(gl.bank_conflicts(gl.zeros([128, 16], gl.float32, teams.OT_L).type, view.type) == 0)
    gl.static_assert(gl.bank_conflicts(gl.zeros([128, 16], gl.float32, teams.ST_BL).type, view.type) == 0)


def test_two_team_epilogue_meets_no_bank_twice():
    """The teams' epilogue stage (session 13): Gluon's own bank-conflict count is 0 for the O^T
    fragments' stores and the row reads; the stage of session 12 ([columns, rows], as the
    partial sums are held) fails the same check (its row reads took 16 wavefronts under ncu)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    def build(stage, row_major):
        src = GluonASTSource(fn=_epilogue_stage_banks, signature={"STAGE": "constexpr", "ROW_MAJOR": "constexpr"},
                             constexprs={"STAGE": stage, "ROW_MAJOR": row_major})
        return triton.compile(src, target=GPUTarget("cuda", 120, 32), options={"num_warps": teams.TEAM_WARPS})

    build(teams.STAGE_SH, True)
    with pytest.raises(Exception, match="static_assert|Assert"):
        build(teams.SP_SH, False)


def _swizzled_offset(layout, row, col, row_len):
    """Element offset of (row, col) in a 2-D SwizzledSharedLayout, by Triton's definition: the
    vec-element piece p of row r sits at p ^ ((r // per_phase) % max_phase)."""
    piece = (col // layout.vec) ^ ((row // layout.per_phase) % layout.max_phase)
    return row * row_len + piece * layout.vec + col % layout.vec


@pytest.mark.parametrize("rows", [16, 32])
def test_rope_lines_view_reads_the_copied_bytes(rows):
    """The teams' S^T view of a rope part held as lines (verify_teams.py, rope_lines_layout:
    [4, rows, 16], a linear layout) finds value 16g + c of row r where the loader's copy into the
    swizzled [rows, 64] buffer (KPL_SH) put it, for every element; 16 rows is a team's Q view."""
    bases = teams.rope_lines_layout(rows).offset_bases
    assert len(bases) == (rows * 64).bit_length() - 1
    seen = set()
    for offset in range(rows * 64):
        g, r, c = 0, 0, 0
        for bit, (bg, br, bc) in enumerate(bases):
            if offset >> bit & 1:
                g, r, c = g ^ bg, r ^ br, c ^ bc
        assert _swizzled_offset(teams.KPL_SH.value, r, 16 * g + c, 64) == offset
        seen.add((g, r, c))
    assert len(seen) == rows * 64


@gluon.jit
def _teams_layout_banks(SUMS: gl.constexpr):
    """Compiles only if the teams' layouts meet no bank twice: S^T's and Q's loads through
    the rope lines' views; the partial sums' stores from the mma fragments and the softmax's
    loads, in layout SUMS."""
    buf = gl.allocate_shared_memory(gl.bfloat16, [32, 64], teams.KPL_SH)
    gl.static_assert(gl.bank_conflicts(gl.zeros([4, 32, 16], gl.bfloat16, teams.K3_A).type,
                                       teams._rope_view(buf, True).type) == 0)
    q_view = teams._team_rope_view(buf, 1, True).permute((0, 2, 1))
    gl.static_assert(gl.bank_conflicts(gl.zeros([4, 16, 16], gl.bfloat16, teams.Q3_B).type, q_view.type) == 0)
    sums = gl.allocate_shared_memory(gl.float32, [4, 32, 16], SUMS)
    gl.static_assert(gl.bank_conflicts(gl.zeros([4, 32, 16], gl.float32, teams.ST3_L).type, sums.type) == 0)
    gl.static_assert(gl.bank_conflicts(gl.zeros([4, 16, 32], gl.float32, teams.S4_L).type,
                                       sums.permute((0, 2, 1)).type) == 0)


def test_teams_layouts_meet_no_bank_twice():
    """The teams' rope lines and XOR partial sums (session 14), by Gluon's own count; session
    13's partial sums (SP3_SH) fail it: their stores took 2 wavefronts where 1 would do under
    ncu."""
    from triton.experimental.gluon._runtime import GluonASTSource

    def build(sums):
        src = GluonASTSource(fn=_teams_layout_banks, signature={"SUMS": "constexpr"}, constexprs={"SUMS": sums})
        return triton.compile(src, target=GPUTarget("cuda", 120, 32), options={"num_warps": teams.TEAM_WARPS})

    build(teams.SP_XOR)
    with pytest.raises(Exception, match="static_assert|Assert"):
        build(teams.SP3_SH)


def test_teams_layouts_build_alike_for_sm120(tmp_path):
    """Each combination of the teams' layouts (rope lines, XOR partial sums) builds for sm_120a
    as session 13's teams kernel does: no spill, the same shared memory, the same counts of
    shared-memory loads and stores, ldmatrix, copies and mma (they move bytes, not work)."""
    counts = {}
    for lines, xor in ((False, False), (True, False), (False, True), (True, True)):
        cfg = va.VerifyConfig(32, 32, 8, 2, mma2=True, teams=True, rope_lines=lines, sums_xor=xor)
        fn, const, opts = va.split_kernel(cfg, 8)
        assert (const["ROPE_LINES"], const["SUMS_XOR"]) == (lines, xor)
        k = aot.compile_one(fn, aot.split_signature(fn), const, 120, opts)
        cubin = tmp_path / f"teams{int(lines)}{int(xor)}.cubin"
        cubin.write_bytes(k.asm["cubin"])
        usage = _res_usage(cubin)
        assert re.search(r"STACK:0 .*LOCAL:0", usage), usage
        sass = _sass(cubin)
        ops = [len(re.findall(rf"\b{op}\b", sass)) for op in (r"LDS(\.\w+)?", r"STS(\.\w+)?", r"LDSM\.\S+",
                                                                  r"LDGSTS\.\S+", r"HMMA\.\S+")]
        assert all(ops), ops
        counts[lines, xor] = (k.metadata.shared, *ops)
    assert len(set(counts.values())) == 1, counts


def test_archs_before_sm89_build_no_fp8_kernels():
    """Triton has no e4m3 before sm_89, and the launcher refuses fp8 pools there: an sm_80 build
    and its check leave them out instead of failing."""
    from dflash_kernels import prebuilt
    names = {spec[0] for spec in aot.kernel_specs(80, 8)}
    assert "verify_split" in names and not any("fp8" in name for name in names)
    assert [str(d) for d in prebuilt._pool_dtypes(80)] == ["torch.bfloat16"]
    assert len(prebuilt._pool_dtypes(120)) == 3
