#!/usr/bin/env bash
# Issue 7: DFlash beside EAGLE-3 on the same bundle (both drafters converted in), fp32 and int4, three prompt sets.
set -euo pipefail
OUT=${1:-docs/bench}
H3=drafters/eagle3/heads/smollm2-135m-instruct
HD=${HD:-drafters/dflash/heads/smollm2-135m-instruct}
for p in fp32 int4; do
    B=/tmp/issue7-$p
    [ -f $B/specrt.json ] || specrt convert smollm2-135m-instruct --precision $p --drafter eagle3:$H3 --drafter dflash:$HD -o $B --force
    specrt bench $B --dataset mt-bench --dataset humaneval --dataset gsm8k --limit 10 --max-new-tokens 128 \
        --drafter eagle3 --drafter dflash --json $OUT/issue7-$p.json --markdown $OUT/issue7-$p.md --plot $OUT/issue7-$p.png
done
