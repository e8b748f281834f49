#!/usr/bin/env python3
# Regenerates corpus/service_rpc (needs protoc):
#   python3 daemon/fuzz/make_rpc_seeds.py proto daemon/fuzz/corpus/service_rpc
# Writes the service_rpc_fuzz seeds: each a session of calls encoded with protoc.
import json, struct, subprocess, sys
proto_dir, out = sys.argv[1], sys.argv[2]
RPCS = ["GetStatus","Noop","CreateJob","ListJobs","DeleteJob","AttachRank","Heartbeat","DetachRank",
        "RegisterTensors","InitParams","GradReady","WaitStep","BeginStep","PrepareStep","CommitStep",
        "Acquire","Release","IterationBoundary","SaveCheckpoint","LoadCheckpoint","GetStats",
        "ParkJob","ResumeJob"]
def enc(rpc, text):
    data = subprocess.run(["protoc", f"--encode=strata.v1.{rpc}Request", "-I", proto_dir, "strata/v1/strata.proto"],
                          input=text.encode(), capture_output=True, check=True).stdout
    return bytes([RPCS.index(rpc)]) + struct.pack("<H", len(data)) + data
def q(s): return json.dumps(s)
ds_off = q(json.dumps({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}))
ds_inf = q(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"},
                       "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}, "optimizer": {"type": "Adam", "params": {"lr": 0.01}}}))
seeds = {
 "status": [("GetStatus",""),("Noop",""),("ListJobs",""),("GetStats","")],
 "offload_step_checkpoint": [
   ("CreateJob", f'name: "a" world_size: 1 mode: MODE_OFFLOAD deepspeed_config_json: {ds_off} param_dtype: "fp32" grad_dtype: "fp32"'),
   ("AttachRank", 'job: "a" rank: 0'),
   ("RegisterTensors", 'session_id: 0 tensors { name: "w" numel: 100 } tensors { name: "b" numel: 7 group: 0 }'),
   ("InitParams", 'session_id: 0'),
   ("BeginStep", 'session_id: 0 step: 0 groups { lr: 0.1 beta1: 0.9 beta2: 0.99 eps: 1e-8 }'),
   ("GradReady", 'session_id: 0 index: 0 step: 0'),
   ("WaitStep", 'session_id: 0 step: 0'),
   ("SaveCheckpoint", 'job: "a" directory: "c1"'),
   ("LoadCheckpoint", 'directory: "c1" job_name: "b"'),
   ("ListJobs", ""),
   ("DeleteJob", 'job: "a"')],
 "infinity_pins": [
   ("CreateJob", f'name: "inf" world_size: 1 mode: MODE_INFINITY deepspeed_config_json: {ds_inf} param_dtype: "fp32" grad_dtype: "fp32" pinned_budget_bytes: 65536'),
   ("AttachRank", 'job: "inf" rank: 0'),
   ("RegisterTensors", 'session_id: 0 tensors { name: "w" numel: 300 } tensors { name: "b" numel: 20 }'),
   ("InitParams", 'session_id: 0 shard_indices: 1'),
   ("InitParams", 'session_id: 0 shard_indices: 0 shard_indices: 0'),
   ("InitParams", 'session_id: 0 shard_indices: 0 shard_indices: 4294967295'),
   ("InitParams", 'session_id: 0 shard_indices: 0'),
   ("Acquire", 'session_id: 0 indices: 0 indices: 1'),
   ("Release", 'session_id: 0 indices: 0 indices: 1'),
   ("IterationBoundary", 'session_id: 0'),
   ("Heartbeat", 'session_id: 0'),
   ("GradReady", 'session_id: 0 index: 0 step: 0'),
   ("GradReady", 'session_id: 0 index: 1 step: 0'),
   ("PrepareStep", 'session_id: 0 step: 0'),
   ("CommitStep", 'session_id: 0 step: 0 overflow: false squared_norm: 1.5'),
   ("DetachRank", 'session_id: 0')],
 "external_agreement": [
   ("CreateJob", f'name: "e" world_size: 1 mode: MODE_OFFLOAD deepspeed_config_json: {ds_off} external_step_agreement: true local_ranks: 0'),
   ("AttachRank", 'job: "e" rank: 0'),
   ("RegisterTensors", 'session_id: 0 tensors { name: "w" numel: 64 }'),
   ("InitParams", 'session_id: 0'),
   ("GradReady", 'session_id: 0 index: 0 step: 0'),
   ("PrepareStep", 'session_id: 0 step: 0'),
   ("CommitStep", 'session_id: 0 step: 0 overflow: true squared_norm: 4'),
   ("WaitStep", 'session_id: 0 step: 0'),
   ("GetStats", "")],
 "device_park": [
   ("CreateJob", f'name: "d" world_size: 1 mode: MODE_INFINITY deepspeed_config_json: {ds_inf} param_dtype: "fp32" grad_dtype: "fp32" device_budget_bytes: 65536'),
   ("CreateJob", f'name: "h" world_size: 1 mode: MODE_INFINITY deepspeed_config_json: {ds_inf} device_budget_bytes: 18446744073709551615'),
   ("AttachRank", 'job: "d" rank: 0'),
   ("RegisterTensors", 'session_id: 0 tensors { name: "w" numel: 300 }'),
   ("InitParams", 'session_id: 0'),
   ("Acquire", 'session_id: 0 indices: 0 tier: TIER_DEVICE'),
   ("Acquire", 'session_id: 0 indices: 0 tier: TIER_NVME'),
   ("Release", 'session_id: 0 indices: 0'),
   ("ParkJob", 'job: "d" tier: TIER_NVME'),
   ("ResumeJob", 'job: "d"'),
   ("ParkJob", 'job: "d" tier: TIER_DEVICE'),
   ("ResumeJob", 'job: "nope"')],
 "hostile_issue30": [
   # LAMB named by the request (the config names AdamW), an unknown type, a budget near 2^64.
   ("CreateJob", f'name: "l" world_size: 1 mode: MODE_OFFLOAD deepspeed_config_json: {ds_off} optimizer {{ type: "lamb" lr: 0.01 }}'),
   ("CreateJob", f'name: "u" world_size: 1 mode: MODE_OFFLOAD deepspeed_config_json: {ds_off} optimizer {{ type: "sgd" lr: 0.01 }}'),
   ("CreateJob", f'name: "w" world_size: 1 mode: MODE_INFINITY deepspeed_config_json: {ds_inf} pinned_budget_bytes: 18446744073709551516'),
   ("CreateJob", f'name: "c" world_size: 1 mode: MODE_OFFLOAD deepspeed_config_json: {ds_off}'),
   ("AttachRank", 'job: "c" rank: 0'),
   ("RegisterTensors", 'session_id: 0 tensors { name: "w" numel: 64 }'),
   ("InitParams", 'session_id: 0'),
   # Checkpoint names reaching for another user's home, the root's own and "users" itself.
   ("SaveCheckpoint", 'job: "c" directory: "users/0/x"'),
   ("SaveCheckpoint", 'job: "c" directory: "../../users/1/x"'),
   ("SaveCheckpoint", 'job: "c" directory: "a/b/c"'),
   ("LoadCheckpoint", 'directory: "users" job_name: "q"'),
   ("GetStatus", "")],
 "partition": [
   ("CreateJob", f'name: "p" world_size: 2 mode: MODE_OFFLOAD deepspeed_config_json: {ds_off}'),
   ("AttachRank", 'job: "p" rank: 1'),
   ("RegisterTensors", 'session_id: 0 tensors { name: "w" numel: 10 } partition { index: 0 padded_numel: 8 ranges { tensor: 0 tensor_offset: 5 numel: 5 shard_offset: 0 } }'),
   ("SaveCheckpoint", 'job: "p" directory: "../x"'),
   ("LoadCheckpoint", 'directory: "/etc" job_name: "q"')],
}
for name, calls in seeds.items():
    with open(f"{out}/seed_{name}", "wb") as f:
        f.write(b"".join(enc(r, t) for r, t in calls))
