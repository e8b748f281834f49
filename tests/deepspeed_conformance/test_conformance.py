"""Differential conformance: strata's DeepSpeed config reader against DeepSpeed's.

For every config of the corpus (gen_corpus.py, generated; configs/, written in
the shapes users publish) both parsers read it: DeepSpeed 0.19.8's
DeepSpeedConfig (ds_reference.py) and strata's ParseDeepSpeedConfig (through
strata-dsconfig-dump). strata must accept a config if and only if DeepSpeed
does, and read the values that matter equal. A difference passes only when an
entry of ALLOWED below names it; each entry is listed, with its reason, in
docs/DEEPSPEED_CONFIG.md, and an entry that no case needs any more fails the
test too, so the list stays true.

Run: STRATA_DSCONFIG_DUMP=build/bin/strata-dsconfig-dump python -m pytest tests/deepspeed_conformance
"""
import collections
import json
import math
import os
import pathlib
import subprocess

import pytest

import ds_reference
import gen_corpus

HERE = pathlib.Path(__file__).resolve().parent
DOC = HERE.parent.parent / "docs" / "DEEPSPEED_CONFIG.md"


def _tagged(prefix):
    return lambda c, ds_err, st: any(t.startswith(prefix) for t in c["tags"])


def _strata_warned(text):
    return lambda c, ds_err, st: st["ok"] and any(text in w for w in st["warnings"])


# id -> (direction, reason, predicate). direction: "strata-accepts" (DeepSpeed
# refuses, strata accepts), "strata-refuses" (the other way), "values".
ALLOWED = {
    "no-batch-size": ("strata-accepts",
                      "a config naming neither train_batch_size nor train_micro_batch_size_per_gpu: stratad gets "
                      "partial configs (the trainer owns batching; CreateJob's default config is {}), so strata warns",
                      lambda c, ds_err, st: "Either train_batch_size or train_micro_batch_size_per_gpu" in ds_err
                      and _strata_warned("train_batch_size")(c, ds_err, st)),
    "unvalidated-section": ("strata-accepts",
                            "sections strata does not act on (monitors, profilers, compile, checkpoint engines, "
                            "data efficiency, ZenFlow, leaf modules, ...) are not checked inside",
                            _tagged("unvalidated:")),
    "unchecked-by-deepspeed": ("strata-refuses",
                               "values DeepSpeed's parser stores unchecked and its engine trips over later "
                               "(gradient_clipping that is not a finite number, batch sizes that are booleans "
                               "or fractions): strata needs a number and says so at parse time",
                               _tagged("unchecked:")),
    "int-range": ("strata-refuses",
                  "Python ints are unbounded; strata holds int64 (uint32 for buffer counts and autotp_size, the "
                  "loss scaler's types for fp16): a value beyond is refused, or kept at the default when "
                  "DeepSpeed would not use it", _tagged("int-range")),
    "depth": ("strata-refuses",
              "nesting deeper than 100 objects/arrays: strata's cap (Python's json stops near 1000)",
              _tagged("depth")),
    "accelerator": ("strata-accepts",
                    "aio.use_gds: DeepSpeed refuses it unless the accelerator is CUDA; the harness runs DeepSpeed "
                    "on CPU, strata does not know the accelerator", _tagged("accelerator")),
}


# Value differences a field may show, each with its reason (also in the doc):
# id -> (reason, predicate(raw config, field, deepspeed value, strata value, strata output)).
ALLOWED_VALUES = {
}


def load_cases():
    cases = gen_corpus.generate()
    for path in sorted((HERE / "configs").glob("*.json")):
        cases.append({"name": f"configs/{path.name}", "text": path.read_text(), "tags": []})
    return cases


def run_strata(cases, tmp_path):
    dump = os.environ.get("STRATA_DSCONFIG_DUMP")
    if not dump:
        pytest.fail("set STRATA_DSCONFIG_DUMP to build/bin/strata-dsconfig-dump")
    files = []
    for i, c in enumerate(cases):
        p = tmp_path / f"case{i}.json"
        p.write_text(c["text"])
        files.append(str(p))
    out = []
    for start in range(0, len(files), 400):
        res = subprocess.run([dump] + files[start:start + 400], capture_output=True, text=True, check=True)
        out += [json.loads(line) for line in res.stdout.splitlines()]
    assert len(out) == len(cases)
    return out


def run_deepspeed(c):
    try:
        d = ds_reference.load_text(c["text"])
    except Exception as e:
        return None, f"load: {type(e).__name__}: {e}"
    cfg, err = ds_reference.parse(ds_reference.fill_hf_auto(d))
    return (cfg, d), err


def _eq(a, b):
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-12) or (math.isnan(float(a)) and math.isnan(float(b)))
        except (TypeError, ValueError):
            return False
    return a == b


def _usable_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def compare(raw, ds_cfg, st):
    """Differences in the values that matter, as (field, deepspeed, strata)."""
    v = ds_reference.view(ds_cfg, raw)
    s = st["config"]
    diffs = []

    def check(field, a, b):
        if not _eq(a, b):
            diffs.append((field, a, b))

    for k, a in v["zero"].items():
        if isinstance(a, dict):
            for kk, aa in a.items():
                bb = s["zero"][k].get(kk)
                if kk == "nvme_path":
                    if not ds_reference.same_path(aa, bb):
                        diffs.append((f"zero.{k}.{kk}", aa, bb))
                elif kk in s["zero"][k]:
                    check(f"zero.{k}.{kk}", aa, bb)
        else:
            check(f"zero.{k}", int(a) if k == "stage" else a, s["zero"][k])
    for k, a in v["fp16"].items():
        narrow = gen_corpus.NARROW.get(f"fp16.{k}")
        if narrow and not narrow[0] <= a <= narrow[1]:
            continue  # int-range: strata keeps its default where DeepSpeed would not use the value
        check(f"fp16.{k}", a, s["fp16"][k])
    check("bf16_enabled", v["bf16_enabled"], s["bf16_enabled"])
    if _usable_number(v["gradient_clipping"]):
        check("gradient_clipping", v["gradient_clipping"], s["gradient_clipping"])
    for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if raw.get(k) not in (None, "auto"):
            check(k, v[k], s[k])
    check("tensor_parallel_autotp_size", v["tensor_parallel_autotp_size"], s["tensor_parallel_autotp_size"])
    name, params = v["optimizer_name"], v["optimizer_params"]
    o = s["optimizer"]
    if name is None:
        check("optimizer", None, o)
    elif o is None:
        diffs.append(("optimizer", name, None))
    else:
        lower = o["type"].lower()
        check("optimizer.type", name, lower if lower in ds_reference.DEEPSPEED_OPTIMIZERS else o["type"])
        params = params or {}
        kind = {"adam": "adamw" if params.get("adam_w_mode", True) is not False else "adam"}.get(lower, lower)
        if kind not in ("adam", "adamw", "adagrad", "lion", "lamb"):
            kind = "other"
        check("optimizer.kind", kind, o["kind"])
        for k in ("lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value"):
            if k in params and params[k] != "auto":
                if _usable_number(params[k]):
                    check(f"optimizer.{k}", params[k], o[k])
                elif not any(f"optimizer.params.{k}" in u for u in o["unusable"]):
                    diffs.append((f"optimizer.{k} unusable", params[k], o["unusable"]))
        b = params.get("betas")
        if b is not None and b != "auto":
            if isinstance(b, list) and len(b) == 2 and all(_usable_number(x) for x in b):
                check("optimizer.betas", list(b), o["betas"])
            elif not any("betas" in u for u in o["unusable"]):
                diffs.append(("optimizer.betas unusable", b, o["unusable"]))
        if isinstance(params.get("amsgrad"), bool):
            check("optimizer.amsgrad", params["amsgrad"], o["amsgrad"])
    for k in ("block_size", "queue_depth", "intra_op_parallelism"):
        a = v["aio"][k]
        if type(a) is int and a >= 1 and a <= 2**30 and not any(f"aio.{k}" in w for w in st["warnings"]):
            check(f"aio.{k}", a, s["aio"][k])
    for k in ("single_submit", "overlap_events"):
        check(f"aio.{k}", bool(v["aio"][k]), s["aio"][k])
    return diffs


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cases = load_cases()
    strata = run_strata(cases, tmp_path_factory.mktemp("corpus"))
    rows = []
    for c, st in zip(cases, strata):
        ds, ds_err = run_deepspeed(c)
        rows.append((c, ds, ds_err, st))
    return rows


def classify(c, ds, ds_err, st):
    """None when the two agree; else (allowed id or None, description)."""
    ds_ok = ds_err is None
    if ds_ok != st["ok"]:
        direction = "strata-accepts" if st["ok"] else "strata-refuses"
        desc = (f"DeepSpeed {'accepts' if ds_ok else 'refuses: ' + ds_err}; strata "
                f"{'accepts' if st['ok'] else 'refuses: ' + st.get('error', '')}")
        for aid, (adir, _, pred) in ALLOWED.items():
            if adir in (direction, "both") and pred(c, ds_err or "", st):
                return aid, desc
        return None, desc
    if not ds_ok:
        return None if st["code"] == "INVALID_ARGUMENT" else (None, f"strata refuses with {st['code']}")
    raw = ds[1] if isinstance(ds[1], dict) else {}
    diffs = compare(raw, ds[0], st)
    excused = set()
    for f, a, b in diffs:
        for vid, (_, pred) in ALLOWED_VALUES.items():
            if pred(raw, f, a, b, st):
                excused.add(vid)
                break
        else:
            desc = "values differ: " + "; ".join(f"{f}: DeepSpeed {a!r}, strata {b!r}" for f, a, b in diffs[:5])
            return None, desc
    if not excused:
        return None
    return sorted(excused)[0], "values differ only where allowed"


def test_strata_reads_what_deepspeed_reads(results):
    failures, used = [], collections.Counter()
    agree = 0
    for c, ds, ds_err, st in results:
        verdict = classify(c, ds, ds_err, st)
        if verdict is None:
            agree += 1
        elif verdict[0] is None:
            failures.append(f"{c['name']}: {verdict[1]}")
        else:
            used[verdict[0]] += 1
    hand = sum(1 for c, *_ in results if c["name"].startswith("configs/"))
    summary = {"cases": len(results), "hand_written": hand, "agree": agree, "allowed": dict(used),
               "failures": len(failures),
               "deepspeed_accepts": sum(1 for _, _, e, _ in results if e is None)}
    print("conformance:", json.dumps(summary))
    if os.environ.get("STRATA_CONFORMANCE_REPORT"):
        pathlib.Path(os.environ["STRATA_CONFORMANCE_REPORT"]).write_text(json.dumps(summary, indent=1) + "\n")
    assert not failures, f"{len(failures)} differences not in the allow-list:\n" + "\n".join(failures[:40])
    stale = sorted((set(ALLOWED) | set(ALLOWED_VALUES)) - set(used))
    assert not stale, f"allow-list entries no case needs any more (remove them and their doc line): {stale}"


def test_hand_written_configs_agree_exactly(results):
    """The configs users publish must be accepted or refused exactly as DeepSpeed
    does; only a listed value difference (ALLOWED_VALUES, none today) may show."""
    bad = []
    for c, ds, ds_err, st in results:
        if c["name"].startswith("configs/"):
            verdict = classify(c, ds, ds_err, st)
            if verdict is not None and verdict[0] not in ALLOWED_VALUES:
                bad.append(f"{c['name']}: {verdict[1]}")
    assert not bad, "\n".join(bad)


def test_every_allowed_difference_is_documented():
    doc = DOC.read_text()
    missing = [aid for aid in list(ALLOWED) + list(ALLOWED_VALUES) if f"`{aid}`" not in doc]
    assert not missing, f"docs/DEEPSPEED_CONFIG.md does not list: {missing}"


def test_the_corpus_covers_every_field_of_deepspeeds_models():
    names = {c["name"].split("=")[0] for c in gen_corpus.generate()}
    for section, model in (("zero_optimization", gen_corpus.DeepSpeedZeroConfig),
                           ("zero_optimization.offload_optimizer", gen_corpus.DeepSpeedZeroOffloadOptimizerConfig),
                           ("zero_optimization.offload_param", gen_corpus.DeepSpeedZeroOffloadParamConfig),
                           ("fp16", gen_corpus.DeepSpeedFP16Config), ("bf16", gen_corpus.DeepSpeedBF16Config),
                           ("tensor_parallel", gen_corpus.TPTrainingConfig)):
        for field, alias in gen_corpus.field_names(model):
            if field in ("offload_param", "offload_optimizer"):
                continue
            assert f"{section}.{field}" in names, f"{section}.{field}"
            if alias:
                assert f"{section}.{alias}" in names, f"{section}.{alias}"
