#!/usr/bin/env bash
# `strata plan` as a user runs it: the issue's example in text and JSON, a
# DeepSpeed config, and bad input (exit 2, one line on stderr naming the flag).
set -u
strata=$1
data=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

example=(--params 1e9 --gpus-per-node 1 --gpu-mem 16GB --cpu-mem 64GB --nvme 1TB)
out=$("$strata" plan "${example[@]}") || fail "example exited $?"
grep -q '^recommended: zero2_offload$' <<<"$out" || fail "text does not recommend zero2_offload: $out"
grep -Eq '^ddp +.* no \(gpu\)' <<<"$out" || fail "ddp should not fit on the GPU"
grep -Eq '^zero_infinity +.* yes' <<<"$out" || fail "zero_infinity should fit"

json=$("$strata" plan "${example[@]}" --json) || fail "json exited $?"
/usr/bin/python3 - "$json" <<'PY' || fail "json check"
import json, sys
plan = json.loads(sys.argv[1])
names = [s["name"] for s in plan["strategies"]]
assert names == ["ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload_optimizer",
                 "zero3_offload_all", "zero_infinity"], names
fits = {s["name"]: s["fits"] for s in plan["strategies"]}
for n in ["ddp", "zero1", "zero2", "zero3"]:
    assert not fits[n], n
assert fits["zero2_offload"] and fits["zero_infinity"]
assert plan["recommended"] == "zero2_offload"
for s in plan["strategies"]:
    assert isinstance(s["gpu_bytes"], int) and isinstance(s["cpu_bytes"], int)
    assert (s["overflow"] is None) == s["fits"]
PY

out=$("$strata" plan "${example[@]}" --deepspeed-config "$data/ds_zero2_offload.json") || fail "config exited $?"
grep -q 'your DeepSpeed config (\*) selects zero2_offload: it fits' <<<"$out" || fail "config row: $out"

check_usage_error() {
  local expect=$1; shift
  local err rc
  err=$("$strata" plan "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || fail "plan $* exited $rc, expected 2"
  [ "$(wc -l <<<"$err")" -eq 1 ] || fail "plan $* printed more than one line: $err"
  grep -q -- "$expect" <<<"$err" || fail "plan $*: '$err' does not mention '$expect'"
}
check_usage_error "--params" --params -5
check_usage_error "--gpu-mem" --params 1e9 --gpu-mem 12XB
check_usage_error "--tp 3" --params 1e9 --gpus-per-node 8 --tp 3
check_usage_error "--deepspeed-config" --params 1e9 --deepspeed-config /nonexistent/ds.json
check_usage_error "zero_optimization.stage" --params 1e9 --deepspeed-config "$data/ds_bad_stage.json"
check_usage_error "--heads" --layers 24 --hidden 1000 --heads 3

# Hostile configs (issue 11): 200k levels of nesting and a number beyond a
# double are exit 2 with one line naming the problem, never 134 or 139.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
/usr/bin/python3 -c "import sys; sys.stdout.write('{\"a\": ' + '['*200000 + ']'*200000 + '}')" >"$tmp/deep.json"
/usr/bin/python3 -c "import sys; sys.stdout.write('{\"zero_optimization\": ' + '{\"a\": '*200000 + '1' + '}'*200000 + '}')" >"$tmp/deep_obj.json"
echo '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "reduce_bucket_size": 1e400}}' >"$tmp/big.json"
echo '{"train_micro_batch_size_per_gpu": 1, "gradient_clipping": -1e400}' >"$tmp/big_clip.json"
check_usage_error "deeper than 100 levels" --params 1e9 --deepspeed-config "$tmp/deep.json"
check_usage_error "deeper than 100 levels" --params 1e9 --deepspeed-config "$tmp/deep_obj.json"
check_usage_error "zero_optimization.reduce_bucket_size: 1e400" --params 1e9 --deepspeed-config "$tmp/big.json"
check_usage_error "gradient_clipping: -1e400" --params 1e9 --deepspeed-config "$tmp/big_clip.json"
# Configs DeepSpeed accepts that strata refused before (issue 13): planned,
# with a warning where DeepSpeed ignores a setting.
echo '{"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "OneBitLamb"},
  "zero_optimization": {"stage": 2, "sub_group_size": 0, "offload_param": {"device": "cpu"},
                        "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}}' >"$tmp/accepted.json"
out=$("$strata" plan --params 1e9 --gpu-mem 16GB --cpu-mem 64GB --nvme 1TB \
      --deepspeed-config "$tmp/accepted.json" 2>"$tmp/err") || fail "accepted config exited $?: $(cat "$tmp/err")"
grep -q 'selects zero2_offload' <<<"$out" || fail "nvme at stage 2 should plan as zero2_offload: $out"
grep -q 'offload_param' "$tmp/err" || fail "no warning about offload_param at stage 2: $(cat "$tmp/err")"

out=$("$strata" plan --layers 24 --hidden 2048 --heads 16 --seq 2048 --micro-batch 4 --gpu-mem 80GB) \
  || fail "shape exited $?"
grep -q 'activations per GPU' <<<"$out" || fail "shape output lacks activations: $out"

if [ "$failures" -eq 0 ]; then echo "cli_plan_test: all checks passed"; fi
exit "$failures"
