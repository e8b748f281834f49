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

# The ZeRO paper's stages and DeepSpeed's runtime buffers, sized from a config.
seven=(--params 7B --gpus-per-node 8 --gpu-mem 80GB --cpu-mem 1TB --nvme 8TB --json)
base=$("$strata" plan "${seven[@]}") || fail "7B exited $?"
z2=$("$strata" plan "${seven[@]}" --deepspeed-config "$data/ds_zero2_buckets.json") || fail "zero2 config exited $?"
z3=$("$strata" plan "${seven[@]}" --deepspeed-config "$data/ds_zero3_prefetch.json") || fail "zero3 config exited $?"
/usr/bin/python3 - "$base" "$z2" "$z3" <<'PY' || fail "7B json check"
import json, sys
base, z2, z3 = (json.loads(a) for a in sys.argv[1:4])
row = lambda plan, name: next(s for s in plan["strategies"] if s["name"] == name)
p, n = 7e9, 8
assert base["data_parallel"] == n and base["tensor_parallel"] == 1
# The paper: ZeRO-1 4P + 12P/N, ZeRO-2 2P + 14P/N, ZeRO-3 16P/N.
assert row(base, "zero1")["gpu_model_state_bytes"] == int(4 * p + 12 * p / n)
assert row(base, "zero2")["gpu_model_state_bytes"] == int(2 * p + 14 * p / n)
assert row(base, "zero3")["gpu_model_state_bytes"] == int(16 * p / n)
g = [row(base, s)["gpu_bytes"] for s in ("ddp", "zero1", "zero2", "zero3")]
assert g[0] > g[1] > g[2] > g[3], g
for s in base["strategies"]:
    b = s["gpu_buffers"]
    assert s["gpu_buffer_bytes"] == sum(b.values()), s
# Default reduce bucket 5e8 x 2 bytes; the config's 1e8 with overlap_comm: two buffers of 1e8.
assert row(base, "zero2")["gpu_buffers"]["reduce_buckets"] == 10**9
assert row(z2, "zero2")["gpu_buffers"]["reduce_buckets"] == 4 * 10**8
assert row(base, "zero2")["gpu_bytes"] - row(z2, "zero2")["gpu_bytes"] == 6 * 10**8
# Stage 3: the config's prefetch bucket (2e8 instead of 5e7) and sub-group (1e8).
d = row(z3, "zero3")["gpu_buffers"]["gathered_params"] - row(base, "zero3")["gpu_buffers"]["gathered_params"]
assert d == 2 * (2 * 10**8 - 5 * 10**7), d
assert row(z3, "zero3")["gpu_buffers"]["fp32_gradients"] == 4 * 10**8
assert z3["deepspeed_config"]["strategy"] == "zero3"
PY

if [ "$failures" -eq 0 ]; then echo "cli_plan_test: all checks passed"; fi
exit "$failures"
