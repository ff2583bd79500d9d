#!/bin/bash
# ncu profile of the split kernel for a few variants (run on the GPU machine from the repo root).
# Usage: kernels/bench/profile_split.sh OUTDIR VARIANT [VARIANT ...]
out=$1; shift
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in "$@"; do
  $NCU --kernel-name regex:_verify_split --launch-skip 2 --launch-count 1 --clock-control none \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --section SourceCounters --section InstructionStats \
    -f -o /tmp/prof_$v python kernels/bench/profile_split.py $v > /tmp/ncu_$v.log 2>&1 || tail -20 /tmp/ncu_$v.log
  $NCU --import /tmp/prof_$v.ncu-rep --page details > $out/ncu_details_$v.txt 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Shared|Executed Ipc|Issue Slots|Stall|Warp Cycles|Registers|Dynamic Shared" $out/ncu_details_$v.txt | head -60
done
v=$1
$NCU --import /tmp/prof_$v.ncu-rep --page source --csv --print-source sass > $out/ncu_source_$v.csv 2>&1 || true
ls -la $out
