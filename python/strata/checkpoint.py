"""stratad checkpoints as one torch state dict: `strata checkpoint export`.

    python -m strata.checkpoint export DIR [DIR ...] --to FILE.pt
    strata checkpoint export DIR --to FILE.pt          # the CLI runs the line above

A checkpoint (stratad's SaveCheckpoint) is a directory: manifest.json (the
job's settings, its tensors, step counts and, per file, the shard's layout)
and one file per rank and shard holding the fp32 master, the optimizer
streams and the working params. The ranks' shards are the daemon's partition;
this module puts every element back where it belongs and writes

    {"format": "strata-consolidated-v1",
     "params":      [fp32 tensor per registered param, in registration order],
     "param_names": [the names the trainer registered],
     "optimizer":   torch's optimizer state dict (state[i] = {"step", "exp_avg", "exp_avg_sq"} for
                    AdamW; param_groups with params = the indices of their tensors),
     "optimizer_type": "AdamW" | "Adam" | "Adagrad" | "Lion",
     "step": optimizer steps taken, "world_size": the job's, "loss_scaler": {...}}

with torch.save; it holds only tensors, lists, dicts, strings and numbers, so
`torch.load(FILE, weights_only=True)` reads it without strata installed and
`torch.optim.AdamW(params, ...).load_state_dict(d["optimizer"])` takes the
optimizer part. A job of several daemons (one per node) has one directory
per daemon; pass them all.

The files are not trusted: the manifest is size-capped, every number in it is
checked (file names are rebuilt from rank and index, ranges must lie inside
their tensor and shard, every element of every tensor must be owned exactly
once across the files) and every file's size must be exactly what its layout
says, before anything large is allocated. Errors are CheckpointError naming
the file and the problem.
"""
import argparse
import json
import os
import re
import stat
import sys

_FORMAT = "strata-checkpoint-v1"
_OUT_FORMAT = "strata-consolidated-v1"
_MAX_MANIFEST_BYTES = 64 << 20          # the daemon's own cap (job_checkpoint.cc)
_MAX_TENSORS = 1 << 22
_MAX_NUMEL = 1 << 48
_MAX_WORLD = 1 << 16
_KNOWN_STREAMS = ("master", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
_READ_CHUNK = 64 << 20                  # bytes per read of a stream


class CheckpointError(ValueError):
    """A checkpoint that cannot be exported: names the file and what is wrong."""


# ----- reading files safely ------------------------------------------------------------------

def _open_regular(path):
    """An existing regular file, never through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except OSError as e:
        if e.errno == 40:   # ELOOP
            raise CheckpointError(f"{path} is a symbolic link; refused") from None
        raise CheckpointError(f"cannot open {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CheckpointError(f"{path} is not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb", buffering=0), st.st_size


def _read_exact(f, n, path):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            raise CheckpointError(f"{path} ended early (it changed while being read?)")
        got += k
    return buf


def _int(value, what, lo=0, hi=_MAX_NUMEL):
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CheckpointError(f"{what} is {value!r}; expected an integer in [{lo}, {hi}]")
    return value


def _num(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"{what} is {value!r}; expected a number")
    return float(value)


# ----- the manifest ---------------------------------------------------------------------------

def _optimizer_of(settings, where):
    """(torch name, hyperparameter defaults, amsgrad) from the job's DeepSpeed config."""
    text = settings.get("deepspeedConfigJson", "{}")
    if not isinstance(text, str):
        raise CheckpointError(f"{where}: settings.deepspeedConfigJson is not a string")
    try:
        config = json.loads(text) if text else {}
    except ValueError as e:
        raise CheckpointError(f"{where}: the job's DeepSpeed config is not JSON ({e})") from None
    opt = config.get("optimizer") or {}
    if not isinstance(opt, dict):
        raise CheckpointError(f"{where}: the job's optimizer config is not an object")
    params = opt.get("params") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"{where}: the job's optimizer params are not an object")
    kind = str(opt.get("type", "Adam")).lower()
    if kind in ("adam", "adamw"):
        # DeepSpeed's Adam is AdamW unless adam_w_mode is false (as the daemon reads it).
        name = "AdamW" if kind == "adamw" or params.get("adam_w_mode", True) else "Adam"
    elif kind == "adagrad":
        name = "Adagrad"
    elif kind == "lion":
        name = "Lion"
    else:
        raise CheckpointError(f"{where}: optimizer '{opt.get('type')}' has no torch state dict format "
                              "(exported: Adam, AdamW, Adagrad, Lion)")
    betas = params.get("betas", [0.9, 0.999])
    defaults = {"lr": params.get("lr", 1e-3), "beta1": betas[0], "beta2": betas[1],
                "eps": params.get("eps", 1e-10 if name == "Adagrad" else 1e-8),
                "weight_decay": params.get("weight_decay", 0.0), "lr_decay": params.get("lr_decay", 0.0),
                "initial_accumulator_value": params.get("initial_accumulator_value", 0.0)}
    return name, defaults, bool(params.get("amsgrad", False))


def read_manifest(directory):
    """The parsed, checked manifest of one checkpoint directory."""
    path = os.path.join(directory, "manifest.json")
    f, size = _open_regular(path)
    with f:
        if size > _MAX_MANIFEST_BYTES:
            raise CheckpointError(f"{path} is {size} bytes; at most {_MAX_MANIFEST_BYTES} are read")
        raw = _read_exact(f, size, path)
    try:
        m = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(m, dict) or m.get("format") != _FORMAT:
        raise CheckpointError(f"{path} is not a {_FORMAT} manifest")
    if "files" not in m or "streams" not in m:
        raise CheckpointError(f"{path} lists no file layouts: it was written by a stratad older than "
                              "`strata checkpoint export`; load it into a current stratad and save it again")
    settings = m.get("settings")
    if not isinstance(settings, dict):
        raise CheckpointError(f"{path}: 'settings' is not an object")
    world = _int(settings.get("worldSize", 0), f"{path}: settings.worldSize", 1, _MAX_WORLD)
    tensors = m.get("tensors")
    if not isinstance(tensors, list) or not 1 <= len(tensors) <= _MAX_TENSORS:
        raise CheckpointError(f"{path}: 'tensors' must be a list of 1 to {_MAX_TENSORS} entries")
    names, numels, groups = [], [], []
    for i, t in enumerate(tensors):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise CheckpointError(f"{path}: tensor {i} has no name")
        names.append(t["name"])
        numels.append(_int(t.get("numel"), f"{path}: tensor {i} ('{t['name']}') numel", 1))
        groups.append(_int(t.get("group", 0), f"{path}: tensor {i} group", 0, 4095))
    total = sum(numels)
    if total > _MAX_NUMEL:
        raise CheckpointError(f"{path}: the tensors hold {total} elements in all; at most {_MAX_NUMEL}")
    streams = m["streams"]
    if (not isinstance(streams, list) or not streams or streams[0] != "master"
            or any(s not in _KNOWN_STREAMS for s in streams) or len(set(streams)) != len(streams)):
        raise CheckpointError(f"{path}: 'streams' is {streams!r}; expected 'master' then optimizer streams "
                              f"from {_KNOWN_STREAMS}")
    param_bytes = _int(m.get("param_bytes"), f"{path}: param_bytes", 2, 4)
    if param_bytes == 3:
        raise CheckpointError(f"{path}: param_bytes is 3; expected 2 or 4")
    opt_name, defaults, amsgrad = _optimizer_of(settings, path)
    hparams = []
    for g, h in enumerate(m.get("group_hyperparams") or []):
        if not isinstance(h, dict):
            raise CheckpointError(f"{path}: group_hyperparams[{g}] is not an object")
        hparams.append({k: _num(h.get(k, defaults[k]), f"{path}: group_hyperparams[{g}].{k}")
                        for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "lr_decay")})
    files = m["files"]
    if not isinstance(files, list):
        raise CheckpointError(f"{path}: 'files' is not a list")
    layouts = []
    for j, e in enumerate(files):
        where = f"{path}: files[{j}]"
        if not isinstance(e, dict):
            raise CheckpointError(f"{where} is not an object")
        rank = _int(e.get("rank"), f"{where}.rank", 0, world - 1)
        index = _int(e.get("index"), f"{where}.index", 0, _MAX_TENSORS)
        name = f"rank{rank}-shard{index}.bin"
        if e.get("file") != name:
            raise CheckpointError(f"{where}: file {e.get('file')!r} is not {name!r}")
        padded = _int(e.get("padded_numel"), f"{where}.padded_numel", 0)
        tile = _int(e.get("tile_numel"), f"{where}.tile_numel", 1 if padded else 0, max(padded, 0))
        ranges = e.get("ranges")
        if not isinstance(ranges, list):
            raise CheckpointError(f"{where}.ranges is not a list")
        checked = []
        end = 0
        for k, r in enumerate(ranges):
            if not isinstance(r, list) or len(r) != 4:
                raise CheckpointError(f"{where}.ranges[{k}] is not [tensor, tensor_offset, numel, shard_offset]")
            t = _int(r[0], f"{where}.ranges[{k}] tensor", 0, len(numels) - 1)
            t_off = _int(r[1], f"{where}.ranges[{k}] tensor_offset")
            n = _int(r[2], f"{where}.ranges[{k}] numel", 1)
            s_off = _int(r[3], f"{where}.ranges[{k}] shard_offset")
            if t_off + n > numels[t]:
                raise CheckpointError(f"{where}.ranges[{k}]: elements [{t_off}, {t_off + n}) lie outside tensor "
                                      f"{t} of {numels[t]}")
            if s_off < end or s_off + n > padded:
                raise CheckpointError(f"{where}.ranges[{k}]: shard elements [{s_off}, {s_off + n}) overlap the "
                                      f"previous range or leave the shard of {padded}")
            end = s_off + n
            checked.append((t, t_off, n, s_off))
        layouts.append({"file": name, "rank": rank, "index": index, "padded": padded, "tile": tile,
                        "ranges": checked})
    return {"path": path, "dir": directory, "world_size": world, "names": names, "numels": numels,
            "groups": groups, "streams": streams, "param_bytes": param_bytes, "optimizer": opt_name,
            "defaults": defaults, "amsgrad": amsgrad, "hparams": hparams, "files": layouts,
            "optimizer_steps": _int(m.get("optimizer_steps"), f"{path}: optimizer_steps"),
            "next_step": _int(m.get("next_step"), f"{path}: next_step"),
            "loss_scaler": m.get("loss_scaler") if isinstance(m.get("loss_scaler"), dict) else {}}


def _check_coverage(manifests):
    """Every element of every tensor owned by exactly one range across all files."""
    first = manifests[0]
    runs = [[] for _ in first["numels"]]
    seen = set()
    for m in manifests:
        for key in ("world_size", "names", "numels", "groups", "streams", "param_bytes", "optimizer",
                    "optimizer_steps"):
            if m[key] != first[key]:
                raise CheckpointError(f"{m['path']} and {first['path']} disagree on {key}: they are not one "
                                      "job's checkpoint")
        for e in m["files"]:
            if (e["rank"], e["index"]) in seen:
                raise CheckpointError(f"rank {e['rank']} shard {e['index']} is in more than one checkpoint "
                                      f"({m['path']})")
            seen.add((e["rank"], e["index"]))
            for (t, t_off, n, _) in e["ranges"]:
                runs[t].append((t_off, n, e["file"]))
    for t, tensor_runs in enumerate(runs):
        tensor_runs.sort()
        at = 0
        for (t_off, n, name) in tensor_runs:
            if t_off != at:
                what = "twice" if t_off < at else "by no file"
                lo, hi = (t_off, at) if t_off < at else (at, t_off)
                raise CheckpointError(f"elements [{lo}, {hi}) of tensor {t} ('{first['names'][t]}') are owned "
                                      f"{what} ({name}); the checkpoint is incomplete or inconsistent "
                                      "(a job of several daemons needs every daemon's directory)")
            at += n
        if at != first["numels"][t]:
            raise CheckpointError(f"tensor {t} ('{first['names'][t]}') has {first['numels'][t]} elements; the "
                                  f"files hold {at} (a job of several daemons needs every daemon's directory)")


# ----- consolidation --------------------------------------------------------------------------

def _shape_of(name, numel):
    """strata.torch registers 'p<i>.<d0>x<d1>...' ('scalar' for 0-d): the shape, when it fits."""
    m = re.fullmatch(r"p\d+\.((?:\d+x)*\d+|scalar)", name)
    if not m:
        return (numel,)
    if m.group(1) == "scalar":
        return () if numel == 1 else (numel,)
    dims = tuple(int(d) for d in m.group(1).split("x"))
    prod = 1
    for d in dims:
        prod *= d
    return dims if prod == numel else (numel,)


def _torch_keys(optimizer, streams):
    """The daemon's streams (after 'master') under torch's state names."""
    names = {"Adagrad": {"exp_avg": "sum"}}.get(optimizer, {})
    return [names.get(s, s) for s in streams[1:]]


def _param_groups(m):
    first = m
    n_groups = max(first["groups"]) + 1
    n_groups = max(n_groups, len(first["hparams"]))
    d = first["defaults"]
    out = []
    for g in range(n_groups):
        h = first["hparams"][g] if g < len(first["hparams"]) else {
            k: float(d[k]) for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "lr_decay")}
        params = [i for i, gi in enumerate(first["groups"]) if gi == g]
        if first["optimizer"] in ("Adam", "AdamW"):
            group = {"lr": h["lr"], "betas": (h["beta1"], h["beta2"]), "eps": h["eps"],
                     "weight_decay": h["weight_decay"], "amsgrad": first["amsgrad"], "maximize": False,
                     "foreach": None, "capturable": False, "differentiable": False, "fused": None}
        elif first["optimizer"] == "Adagrad":
            group = {"lr": h["lr"], "lr_decay": h["lr_decay"], "weight_decay": h["weight_decay"],
                     "initial_accumulator_value": float(d["initial_accumulator_value"]), "eps": h["eps"],
                     "foreach": None, "maximize": False, "differentiable": False, "fused": None}
        else:
            group = {"lr": h["lr"], "betas": (h["beta1"], h["beta2"]), "weight_decay": h["weight_decay"]}
        group["params"] = params
        out.append(group)
    return out


def consolidate(directories):
    """One torch state dict (see the module's doc) from a job's checkpoint
    directories (one per daemon)."""
    import torch

    if isinstance(directories, (str, os.PathLike)):
        directories = [directories]
    if not directories:
        raise CheckpointError("no checkpoint directory given")
    manifests = [read_manifest(os.fspath(d)) for d in directories]
    _check_coverage(manifests)
    first = manifests[0]
    streams = first["streams"]
    n_streams = len(streams)
    # Each file must be exactly its layout's size before anything is read.
    opened = []
    try:
        for m in manifests:
            for e in m["files"]:
                path = os.path.join(m["dir"], e["file"])
                f, size = _open_regular(path)
                opened.append((f, path, e))
                expected = e["padded"] * (n_streams * 4 + m["param_bytes"])
                if size != expected:
                    raise CheckpointError(f"{path} holds {size} bytes; its layout says {expected} "
                                          f"({e['padded']} elements x ({n_streams} fp32 streams + "
                                          f"{m['param_bytes']}-byte params))")
        # Coverage held, so these are exactly the owned elements the files hold.
        full = {s: [torch.empty(n, dtype=torch.float32) for n in first["numels"]] for s in streams}
        for f, path, e in opened:
            _read_shard(f, path, e, streams, full)
    finally:
        for f, _, _ in opened:
            f.close()
    shapes = [_shape_of(name, n) for name, n in zip(first["names"], first["numels"])]
    keys = _torch_keys(first["optimizer"], streams)
    step = float(first["optimizer_steps"])
    state = {}
    for i, shape in enumerate(shapes):
        entry = {"step": torch.tensor(step, dtype=torch.float32)}
        for s, key in zip(streams[1:], keys):
            entry[key] = full[s][i].reshape(shape)
        state[i] = entry
    return {"format": _OUT_FORMAT,
            "params": [full["master"][i].reshape(shape) for i, shape in enumerate(shapes)],
            "param_names": list(first["names"]),
            "optimizer": {"state": state, "param_groups": _param_groups(first)},
            "optimizer_type": first["optimizer"],
            "step": first["optimizer_steps"],
            "next_step": first["next_step"],
            "world_size": first["world_size"],
            "loss_scaler": {k: v for k, v in first["loss_scaler"].items()
                            if isinstance(v, (int, float, bool))}}


def _tiles(e):
    """A shard file's tiles, in file order: (begin, count, pieces) per tile of `count` elements
    from shard element `begin`, where each piece (t, t_at, lo, hi) says shard elements [lo, hi) of
    the tile are tensor t's from element t_at on. Streams are interleaved by tile: tile k of every
    stream, then tile k+1."""
    padded, tile = e["padded"], e["tile"]
    if padded == 0:
        return                  # no tiles (its tile is 0)
    for begin in range(0, padded, tile):
        count = min(tile, padded - begin)
        pieces = [(t, t_off + max(begin - s_off, 0), max(s_off, begin), min(s_off + n, begin + count))
                  for (t, t_off, n, s_off) in e["ranges"] if s_off < begin + count and s_off + n > begin]
        yield begin, count, pieces


def _read_shard(f, path, e, streams, full):
    import torch

    for begin, count, overlapping in _tiles(e):
        for s in streams:
            # Read in chunks of the tile so a hostile tile size cannot make one huge read.
            done = 0
            while done < count:
                k = min(count - done, _READ_CHUNK // 4)
                chunk = torch.frombuffer(_read_exact(f, k * 4, path), dtype=torch.float32)
                lo_c, hi_c = begin + done, begin + done + k
                for (t, t_at, lo, hi) in overlapping:
                    a, b = max(lo, lo_c), min(hi, hi_c)
                    if a < b:
                        dst = t_at + (a - lo)
                        full[s][t][dst:dst + (b - a)].copy_(chunk[a - lo_c:b - lo_c])
                done += k


def _replace_file(path, data):
    """`path` (an existing regular file, not a link) replaced by `data`, atomically."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def write_optimizer_states(directory, states, step, masters=None, param_dtype=None):
    """Rewrites the optimizer streams of one checkpoint directory (every stream but 'master') from
    `states`, {tensor index: {stream name: 1-D float32 tensor of the tensor's numel}}, each file by
    its own layout (ranges, NVMe tiles), and sets the manifest's optimizer step count to `step`.
    The fp32 masters and the params stay as saved, unless `masters` ({tensor index: 1-D float32
    tensor}) is given: then the 'master' stream is written from it and the params section from it
    rounded to `param_dtype` (a torch dtype of the manifest's param_bytes). Each element is written by the rank file that
    owns it, so a directory of a multi-daemon job needs only its own tensors' elements; a tensor
    missing from `states` is a CheckpointError. stratad's LoadCheckpoint then loads the directory
    (what ZeRO-3's load_state_dict does)."""
    import torch

    m = read_manifest(os.fspath(directory))
    streams = m["streams"]
    n_streams = len(streams)
    for e in m["files"]:
        for (t, _, _, _) in e["ranges"]:
            for s in streams[1:]:
                v = states.get(t, {}).get(s)
                if v is None or v.dtype != torch.float32 or v.dim() != 1 or v.numel() != m["numels"][t]:
                    raise CheckpointError(f"no float32 '{s}' of {m['numels'][t]} elements given for tensor {t} "
                                          f"('{m['names'][t]}')")
            if masters is not None:
                v = masters.get(t)
                if v is None or v.dtype != torch.float32 or v.dim() != 1 or v.numel() != m["numels"][t]:
                    raise CheckpointError(f"no float32 master of {m['numels'][t]} elements given for tensor {t} "
                                          f"('{m['names'][t]}')")
    if masters is not None and (param_dtype is None or
                                torch.empty(0, dtype=param_dtype).element_size() != m["param_bytes"]):
        raise CheckpointError(f"param_dtype {param_dtype} does not match the checkpoint's {m['param_bytes']}-byte "
                              "params")
    for e in m["files"]:
        path = os.path.join(m["dir"], e["file"])
        f, size = _open_regular(path)
        with f:
            expected = e["padded"] * (n_streams * 4 + m["param_bytes"])
            if size != expected:
                raise CheckpointError(f"{path} holds {size} bytes; its layout says {expected}")
            raw = _read_exact(f, size, path)
        if e["padded"] == 0:
            continue
        floats = torch.frombuffer(raw, dtype=torch.float32, count=n_streams * e["padded"])   # writes through
        for begin, count, pieces in _tiles(e):
            for k, s in enumerate(streams):
                if s == "master" and masters is None:
                    continue
                source = masters if s == "master" else {t: states[t][s] for (t, _, _, _) in pieces}
                base = begin * n_streams + k * count    # tile `begin` of stream k
                for (t, t_at, lo, hi) in pieces:
                    floats[base + lo - begin:base + hi - begin].copy_(source[t][t_at:t_at + hi - lo])
        if masters is not None:
            # The params section follows the streams: the shard's padded elements, untiled.
            params = torch.frombuffer(raw, dtype=param_dtype, count=e["padded"],
                                      offset=n_streams * 4 * e["padded"])
            for (t, t_off, n, s_off) in e["ranges"]:
                params[s_off:s_off + n].copy_(masters[t][t_off:t_off + n].to(param_dtype))
        _replace_file(path, raw)
    manifest_path = os.path.join(m["dir"], "manifest.json")
    with open(manifest_path) as f:
        manifest = json.load(f)
    manifest["optimizer_steps"] = int(step)
    _replace_file(manifest_path, json.dumps(manifest, indent=2).encode())


def export(directories, to):
    """consolidate() written with torch.save to `to` (a new file: an existing one is refused)."""
    import torch

    state = consolidate(directories)
    if os.path.lexists(to):
        raise CheckpointError(f"{to} exists; choose a new file")
    tmp = f"{to}.tmp-{os.getpid()}"
    try:
        torch.save(state, tmp)
        os.link(tmp, to)        # fails if `to` appeared meanwhile: never replaces a file
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return state


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="strata checkpoint",
        description="Write a stratad checkpoint as one torch state dict (fp32 params and optimizer state).")
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("export", help="DIR [DIR ...] --to FILE.pt (one DIR per daemon of the job)")
    ex.add_argument("dirs", nargs="+", metavar="DIR", help="checkpoint directory (one per daemon of the job)")
    ex.add_argument("--to", required=True, metavar="FILE.pt")
    args = parser.parse_args(argv)
    try:
        state = export(args.dirs, args.to)
    except (CheckpointError, OSError, RuntimeError) as e:
        # OSError/RuntimeError: the output cannot be written (torch.save names the path).
        print(f"strata checkpoint export: {e}", file=sys.stderr)
        return 1
    numel = sum(p.numel() for p in state["params"])
    print(f"wrote {args.to}: {len(state['params'])} tensors, {numel} params, {state['optimizer_type']} state "
          f"after {state['step']} steps (world size {state['world_size']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
