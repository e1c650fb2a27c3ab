#!/bin/sh
# Interleaved `specrt bench` runs of two specrt commands (e.g. the code before and after a refactor), on the same
# cached bundles: OLD NEW OLD NEW ... one JSON per run under OUT. Usage:
#   scripts/bench_two_checkouts.sh OLD_SPECRT NEW_SPECRT OUT ROUNDS -- BENCH_ARGS...
# (OLD_SPECRT / NEW_SPECRT: a command that runs that checkout's CLI; compare the runs with
# scripts/bench_two_checkouts_report.py OUT).
set -e
old=$1 new=$2 out=$3 rounds=$4
shift 5
mkdir -p "$out"
grep -o -w 'avx512[a-z_0-9]*\|avx2\|avx_vnni\|amx[a-z_]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$out/cpu_flags.txt"
for r in $(seq 1 "$rounds"); do
  for side in old new; do
    cmd=$old; [ "$side" = new ] && cmd=$new
    echo "round $r: $side" >&2
    $cmd bench "$@" --json "$out/$side-$r.json" > "$out/$side-$r.txt" 2> "$out/$side-$r.log"
  done
done
