"""The ds_io peer of `strata bench io`: DeepSpeed's aio_handle (what ZeRO-Infinity
swaps through), on the bench's own file, block size and queue depth.

Usage: PYTHON ds_io_peer.py --file PATH --io-size BYTES

Serves requests on stdin, one per line, so the bench can alternate it with its
own runs without paying for `import deepspeed` and loading the op each time:

    read|write BLOCK_SIZE QUEUE_DEPTH RUNTIME_S

For each it makes aio_handle(block_size, queue_depth, single_submit=False,
overlap_events=True, intra_op_parallelism=1) -- DeepSpeed's "aio" defaults but
the block size and depth asked for -- and repeats what DeepSpeed's own
benchmark (deepspeed/nvme, ds_io) times: one pread/pwrite of --io-size bytes
from offset 0 into a page-locked tensor (handle.new_cpu_locked_tensor), then
wait(), until RUNTIME_S has passed. Prints one JSON line per request:
{"mbps": 10^6 bytes/s over the whole time, "ops", "bytes", "seconds"} or
{"error": ...}. The first line printed, before any request, says whether the
op loaded: {"ready": true, "deepspeed": version} or {"error": ...} (exit 3).

The op is JIT-built on first use (needs libaio-dev; about 6 minutes with
MAX_JOBS=1 on 2 cores; cached in ~/.cache/torch_extensions). DS_ACCELERATOR=cpu.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--io-size", type=int, required=True)
    args = ap.parse_args()
    try:
        import torch
        import deepspeed
        from deepspeed.ops.op_builder import AsyncIOBuilder
        aio = AsyncIOBuilder().load(verbose=False)
    except Exception as e:  # noqa: BLE001 -- any failure means "no ds_io here"
        say({"error": f"cannot load DeepSpeed's async_io op with {sys.executable}: "
                      f"{type(e).__name__}: {e}"})
        sys.exit(3)
    if not os.path.isfile(args.file) or os.path.getsize(args.file) < args.io_size:
        say({"error": f"{args.file} is missing or smaller than --io-size {args.io_size}"})
        sys.exit(3)
    # One page-locked buffer for every request, allocated through the first
    # handle as DeepSpeed's benchmark does (any handle can free it).
    first = aio.aio_handle(1 << 20, 8, False, True, 1)
    try:
        buf = first.new_cpu_locked_tensor(args.io_size, torch.empty(0, dtype=torch.uint8))
    except Exception as e:  # noqa: BLE001 -- e.g. mlock refused
        say({"error": f"aio_handle.new_cpu_locked_tensor({args.io_size}) failed: {type(e).__name__}: {e}"})
        sys.exit(3)
    buf.fill_(7)  # fault the pages in before any timing
    say({"ready": True, "deepspeed": deepspeed.__version__, "torch": torch.__version__})
    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        try:
            op, bs, qd, runtime = parts[0], int(parts[1]), int(parts[2]), float(parts[3])
            if op not in ("read", "write"):
                raise ValueError(f"op '{op}'")
        except (ValueError, IndexError) as e:
            say({"error": f"bad request '{line.strip()}': {e}"})
            continue
        handle = aio.aio_handle(bs, qd, False, True, 1)
        ops = 0
        start = time.perf_counter()
        while True:
            if op == "read":
                ret = handle.pread(buf, args.file, False, True)
            else:
                ret = handle.pwrite(buf, args.file, False, True)
            if ret == -1 or handle.wait() < 0:
                say({"error": f"aio_handle {op} of {args.file} failed"})
                break
            ops += 1
            if time.perf_counter() - start >= runtime:
                seconds = time.perf_counter() - start
                say({"mbps": ops * args.io_size / seconds / 1e6, "ops": ops,
                     "bytes": ops * args.io_size, "seconds": seconds})
                break
        del handle
    first.free_cpu_locked_tensor(buf)


if __name__ == "__main__":
    main()
