"""The manifest's `model`, `build` and `dataset` sections as typed records (bundles/manifest_records.py).

A manifest is read into records once and written back byte-identical: the keys in the order read,
keys no field holds kept (a newer version's, where the schema leaves a record open), every value
as read. Real bundles built here (tiny-cnn in fp32, fp16 and int8) and every bundle in the build
cache round-trip; `build.input_source` and `build.etrecord` are schema-checked, fuzzed below.
No test double: real manifests, the real schema check.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from bundlerun.bundles.bpte import read_bundle
from bundlerun.bundles.cache_dirs import cache_dir
from bundlerun.bundles.errors import ManifestError
from bundlerun.bundles.manifest import (BuildInfo, Criteria, EtrecordInfo, InputSource, LlmBuild, Manifest,
                                        MethodManifest, ModelInfo, OutputSpec, TensorSpec, describe_inputs)


def _dumps(data: dict) -> str:
    return json.dumps(data)  # key order kept: the round trip must keep it too


def _sample() -> dict:
    """A valid manifest with every typed section, as a builder writes it (then read back as a dict)."""
    m = Manifest(
        model={"id": "tiny-cnn", "source": "zoo", "description": "d",
               "weights": {"kind": "seeded-random", "seed": 3, "how": "torch.manual_seed"}},
        build={"backend": "xnnpack", "target": "host://xnnpack", "dtype": "int8", "quantization": None,
               "reference": "eager-fp32", "inputs": [{"shape": [1, 3, 8, 8], "dtype": "float32",
                                                      "distribution": "randn", "distribution_from": "example"}],
               "input_source": {"kind": "folder", "from": "/data/imgs", "files": ["a.png", "b.png"],
                                "normalize": "imagenet"},
               "seed": 0, "cases": 2, "lowering": {"delegate": "xnnpack"}, "ops": ["aten.conv2d"],
               "overrides": {}, "cache_key": "k" * 64,
               "etrecord": {"path": "m.etrecord", "sha256": "0" * 64, "bytes": 10, "debug_handles": 4,
                            "graphs": ["fp32/forward"]}},
        versions={"bundlerun": "0"},
        methods={"forward": MethodManifest("forward", [TensorSpec("in0", "float32", [1, 3, 8, 8])],
                                           [OutputSpec("out0", "float32", [1, 10], Criteria(atol=0.1))])},
        dataset={"name": "digits", "labels": [1, 2], "num_classes": 10, "source": "sklearn"},
    )
    return json.loads(json.dumps(m.to_dict()))


def test_sections_are_typed_records():
    m = Manifest.from_dict(_sample())
    assert isinstance(m.model, ModelInfo) and m.model.id == "tiny-cnn" and m.model.weights.seed == 3
    assert isinstance(m.build, BuildInfo) and m.build.dtype == "int8" and m.build.inputs[0].shape == [1, 3, 8, 8]
    assert isinstance(m.build.input_source, InputSource) and m.build.input_source.origin == "/data/imgs"
    assert isinstance(m.build.etrecord, EtrecordInfo) and m.build.etrecord.debug_handles == 4
    assert m.dataset.labels == [1, 2] and m.dataset.num_classes == 10
    assert describe_inputs(m.model, m.build) == [
        "weights: seeded random (seed 3): torch.manual_seed",
        "inputs: folder from /data/imgs, 2 cases, normalized by imagenet"]


def test_round_trip_keeps_order_unknown_keys_and_value_kinds():
    data = _sample()
    # another version's manifest: keys in another order, a key this one has no field for, 1.0 kept a float
    data["build"] = dict(reversed(list(data["build"].items())))
    data["build"]["input_source"]["camera"] = {"exposure": 1.0}
    data["model"] = {"description": "d", "id": "tiny-cnn", "source": "zoo"}
    m = Manifest.from_dict(data)
    assert _dumps(m.to_dict()) == _dumps(data)
    assert m.build.input_source.extra == {"camera": {"exposure": 1.0}}


def test_an_llm_build_round_trips_with_its_kv_io():
    """QNN's static llama records its KV cache as I/O in build.llm.kv_io (bundles/llm_qnn.py): typed,
    read by bundles/sequence.py `kv_links`, written back as read."""
    from bundlerun.bundles.sequence import kv_links

    data = _sample()
    data["build"]["llm"] = {"arch": "llama3", "dtype": "fp16", "max_seq_len": 32, "weights": "random",
                            "exporter": "qnn static llama", "kv_update": "shift",
                            "kv_io": [{"output": 1, "input": 3, "axis": 3}]}
    m = Manifest.from_dict(data)
    assert isinstance(m.build.llm, LlmBuild) and m.build.llm.max_seq_len == 32 and m.build.llm.kv_update == "shift"
    assert [(k.output, k.input, k.axis) for k in kv_links(m)] == [(1, 3, 3)] == [
        (k.output, k.input, k.axis) for k in kv_links(data)]
    assert _dumps(m.to_dict()) == _dumps(data)


def test_a_field_set_after_reading_is_written_after_the_rest():
    """As the LLM builder adds build.etrecord once export_llama wrote it: appended, as a dict key would be."""
    build = BuildInfo.from_dict({"backend": "xnnpack", "cases": 3, "future": [1]})
    build.etrecord = EtrecordInfo(path="x.etrecord", sha256="ab")
    assert _dumps(build.to_dict()) == _dumps({"backend": "xnnpack", "cases": 3, "future": [1],
                                              "etrecord": {"path": "x.etrecord", "sha256": "ab"}})
    assert BuildInfo(backend="mlx").to_dict() == {"backend": "mlx", "quantization": None, "inputs": []}
    assert ModelInfo(id="m").to_dict() == {"id": "m"}


def test_an_empty_dataset_reads_as_none_recorded():
    data = _sample()
    data["dataset"] = {}
    m = Manifest.from_dict(data)
    assert not m.dataset and _dumps(m.to_dict()) == _dumps(data)


_HOSTILE = [None, True, 0, -1, 2**70, 1.5, "", "x" * 70000, [], [1, "a"], {}, {"a": 1}, ["a"], [[1]], [None]]
_FIELDS = {"input_source": ("kind", "from", "files", "indices", "labels", "resize", "normalize", "extra_key"),
           "etrecord": ("path", "sha256", "bytes", "debug_handles", "graphs", "delegate_graphs", "extra_key")}


def test_input_source_and_etrecord_fuzz():
    """1,000 seeded mutations of build.input_source and build.etrecord: each manifest is refused with a
    one-line ManifestError, or read into records that write it back byte-identical and describe it
    without an error; never an internal error."""
    base = _sample()
    rng = random.Random(34)
    refused = accepted = 0
    for _ in range(1000):
        data = copy.deepcopy(base)
        section = rng.choice(list(_FIELDS))
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.1:
                data["build"][section] = rng.choice(_HOSTILE)
                break
            target = data["build"][section]
            target[rng.choice(_FIELDS[section])] = copy.deepcopy(rng.choice(_HOSTILE))
        try:
            m = Manifest.from_dict(data, "fuzz")
        except ManifestError as exc:
            assert str(exc).startswith("fuzz: invalid bundlerun manifest: ") and "\n" not in str(exc)
            refused += 1
            continue
        accepted += 1
        assert _dumps(m.to_dict()) == _dumps(data)
        describe_inputs(m.model, m.build)
    assert refused > 200 and accepted > 100, (refused, accepted)


def _cached_bundles() -> list[Path]:
    root = cache_dir("builds")
    return sorted(root.glob("*/*.bpte")) if root.is_dir() else []


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "int8"])
def test_real_bundles_round_trip_byte_identical(bundle_cache, dtype):
    """tiny-cnn built for host://xnnpack in each dtype, and every bundle in the build cache: the manifest
    read into records writes back the bytes the bundle holds (sorted keys, as write_bundle serialises)."""
    paths = [bundle_cache("tiny-cnn", dtype, cases=2), *(_cached_bundles() if dtype == "fp32" else [])]
    for path in paths:
        bundle = read_bundle(path)
        raw = bundle.manifest_json
        if raw is None:  # a stock BundledProgram (no bundlerun manifest) in the cache: nothing to round-trip
            continue
        again = Manifest.from_dict(raw).to_dict()
        assert json.dumps(again, sort_keys=True, separators=(",", ":")) == json.dumps(raw, sort_keys=True,
                                                                                       separators=(",", ":")), path
    built = read_bundle(paths[0]).manifest
    assert built.build.dtype == dtype and built.build.backend == "xnnpack" and built.model.id == "tiny-cnn"
    assert built.build.inputs and built.build.inputs[0].shape == [1, 3, 32, 32]
