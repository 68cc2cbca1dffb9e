"""The manifest bundlerun embeds in every `.bpte` (root slot 3, JSON).

It records, per method and output, the *resolved* criteria the output is judged
by (with the trail of where each number came from), plus provenance: model,
target, backend, dtype, quantization, reference kind, input distribution, seed,
dataset labels and tool versions. `bundlerun run` judges with these numbers,
never with whatever registry is installed on the judging machine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from bundlerun.bundles.manifest_records import (BuildInfo, BuildInput, DatasetInfo, EtrecordInfo, InputSource,
                                                LlmBuild, ModelInfo, ModelWeights)
from bundlerun.bundles.sequence import SequenceSpec
from bundlerun.bundles.manifest_schema import (CRITERIA_FIELDS, MANIFEST_SCHEMA, RULE_DEFAULTS, RULE_FIELDS,
                                               validate_manifest)

__all__ = ["CRITERIA_FIELDS", "MANIFEST_SCHEMA", "RULE_DEFAULTS", "RULE_FIELDS", "BuildInfo", "BuildInput", "Criteria",
           "DatasetInfo", "EtrecordInfo", "InputSource", "LlmBuild", "Manifest", "MethodManifest", "ModelInfo",
           "ModelWeights", "OutputSpec", "TensorSpec", "validate_manifest"]


@dataclass
class Criteria:
    """What an output must satisfy. Every criterion that is set must hold.

    Element-wise: |a - r| <= atol + qtol*scale + rtol*|r| (NaN matches NaN).
    For integer outputs `scale` is 1 so qtol counts integer steps.
    `exact` (bool outputs, or explicitly requested): values must be equal.
    """

    atol: float | None = None
    rtol: float | None = None
    qtol: float | None = None
    scale: float | None = None  # quantization scale of the output (from the lowered graph)
    zero_point: int | None = None
    sqnr_min_db: float | None = None
    cosine_min: float | None = None
    rel_frobenius_max: float | None = None
    exact: bool = False
    trail: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Rules some backends' tests judge by (docs/tolerances.md "Rules"). Their defaults are the
    # judging of bundles made before they existed, and `to_dict` leaves them out at those defaults,
    # so an old manifest reads, judges and re-serialises exactly as before.
    mse_max: float | None = None  # ceiling on mean((a - r)^2) (NXP NumericalStatsOutputComparator)
    top1: bool = False  # argmax of the flattened output must equal the reference's (Cortex-M model tests)
    top_k: int | None = None  # per row of the last axis, the reference's argmax is among the output's k largest
    nan: str = "match"  # "match": NaN matches NaN (shared Tester, equal_nan=True); "fail": any NaN fails
    sqnr_reference: str = "actual"  # whose norm is the signal: "actual" (ErrorStatistics) | "reference" (compute_error)
    sqnr_strict: bool = False  # SQNR must exceed the floor (`error > threshold`) instead of reaching it
    cast_float: bool = False  # outputs of different dtypes are compared as float32, not failed (MLX)
    arm_analysis: bool = False  # Frobenius/cosine as Arm's compare_rel_frobenius_and_cosine_similarity
    reference_nonzero: bool = False  # an all-zero reference fails (NXP: "contains only zeros")
    # Token-level rules of LLM logits (runner/judging/token_metrics.py), per row of the last axis' last row:
    argmax_match: bool = False  # the greedy token must be the reference's: "argmax: expected 17 -> got 212"
    kl_max: float | None = None  # ceiling on KL(reference || target) of the softmax, in nats
    top_k_overlap_min: float | None = None  # floor on the share of the reference's top-5 tokens in the output's

    @property
    def elementwise(self) -> bool:
        return self.atol is not None or self.rtol is not None or self.qtol is not None

    @property
    def effective_atol(self) -> float:
        """atol + qtol * scale (scale 1.0 when the output carries no quantization)."""
        atol = self.atol or 0.0
        if self.qtol:
            atol += self.qtol * (self.scale if self.scale is not None else 1.0)
        return atol

    def to_dict(self, copy_trail: bool = True) -> dict[str, Any]:
        # asdict's generic deep copy, field by field, cost ~1 ms per output (192-step LLM runs write it per
        # step): the fields are scalars but `trail`, plain JSON data copied here the direct way.
        # copy_trail=False: the trail itself, for a reader that leaves it out (the history's criteria digest)
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["trail"] = _json_copy(self.trail) if copy_trail else self.trail
        for key, default in RULE_DEFAULTS.items():
            if out.get(key) == default:
                del out[key]
        return out

    @property
    def has_any(self) -> bool:
        """False when nothing would be checked: such an output must not be judged at all."""
        return self.elementwise or self.exact or self.top1 or self.argmax_match or self.top_k is not None or any(
            getattr(self, k) is not None for k in ("sqnr_min_db", "cosine_min", "rel_frobenius_max", "mse_max",
                                                   "kl_max", "top_k_overlap_min"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Criteria":
        """From a dict already checked by `validate_manifest` (unknown keys are rejected there)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _json_copy(value: Any) -> Any:
    """A deep copy of JSON-shaped data (dicts, lists, tuples of scalars); anything else deep-copied."""
    if isinstance(value, dict):
        return {k: _json_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_json_copy(v) for v in value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    import copy

    return copy.deepcopy(value)


@dataclass
class TensorSpec:
    name: str
    dtype: str
    shape: list[int]  # with `dynamic` dims: the largest size any case has
    dynamic: list[int] = field(default_factory=list)  # dims whose size differs between cases

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.dynamic:  # a static tensor's record reads as before dynamic dims existed
            del d["dynamic"]
        return d


@dataclass
class OutputSpec:
    name: str
    dtype: str
    shape: list[int]  # with `dynamic` dims: the largest size any case has
    criteria: Criteria = field(default_factory=Criteria)
    quantized: bool = False  # produced by a dequantize of a quantized tensor, or an integer tensor
    dynamic: list[int] = field(default_factory=list)  # dims whose size differs between cases

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["criteria"] = self.criteria.to_dict()
        if not self.dynamic:
            del d["dynamic"]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "OutputSpec":
        return cls(
            name=data["name"],
            dtype=data["dtype"],
            shape=list(data["shape"]),
            criteria=Criteria.from_dict(data.get("criteria", {})),
            quantized=bool(data.get("quantized", False)),
            dynamic=list(data.get("dynamic", [])),
        )


@dataclass
class MethodManifest:
    name: str
    inputs: list[TensorSpec]
    outputs: list[OutputSpec]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inputs": [i.to_dict() for i in self.inputs],
            "outputs": [o.to_dict() for o in self.outputs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MethodManifest":
        return cls(
            name=data["name"],
            inputs=[TensorSpec(**i) for i in data.get("inputs", [])],
            outputs=[OutputSpec.from_dict(o) for o in data.get("outputs", [])],
        )


@dataclass
class Manifest:
    model: ModelInfo  # id, source, description, weights (bundles/manifest_records.py)
    build: BuildInfo  # backend, target, dtype, quantization, reference, inputs, seed, cases, lowering, ...
    versions: dict[str, str]  # bundlerun, torch, executorch, python, host
    methods: dict[str, MethodManifest]
    dataset: DatasetInfo | None = None  # name, labels, num_classes
    created: str = ""
    schema: str = MANIFEST_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict)
    integrity: dict[str, Any] | None = None  # sha256 of program, cases, manifest (bundles/integrity.py)
    sequences: list[SequenceSpec] = field(default_factory=list)  # stateful LLM sequences (bundles/sequence.py)

    def __post_init__(self) -> None:
        # sections given as the dicts they are written as (a caller's own manifest, a test's) read as records
        if isinstance(self.model, dict):
            self.model = ModelInfo.from_dict(self.model)
        if isinstance(self.build, dict):
            self.build = BuildInfo.from_dict(self.build)
        if isinstance(self.dataset, dict):
            self.dataset = DatasetInfo.from_dict(self.dataset)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": self.schema,
            "model": self.model.to_dict(),
            "build": self.build.to_dict(),
            "versions": self.versions,
            "methods": {k: m.to_dict() for k, m in self.methods.items()},
            "dataset": self.dataset.to_dict() if self.dataset is not None else None,
            "created": self.created,
            "extra": self.extra,
        }
        if self.integrity is not None:
            out["integrity"] = self.integrity
        if self.sequences:  # written only when there are some: every other manifest stays byte-identical
            out["sequences"] = [s.to_dict() for s in self.sequences]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "bundle") -> "Manifest":
        """Strictly validated (ManifestError, one line) before anything is built from it."""
        validate_manifest(data, source)
        schema = data["schema"]
        return cls(
            schema=schema,
            model=ModelInfo.from_dict(data.get("model", {})),
            build=BuildInfo.from_dict(data.get("build", {})),
            versions=data.get("versions", {}),
            methods={k: MethodManifest.from_dict(m) for k, m in data.get("methods", {}).items()},
            dataset=DatasetInfo.from_dict(data["dataset"]) if data.get("dataset") is not None else None,
            created=data.get("created", ""),
            extra=data.get("extra", {}),
            integrity=data.get("integrity"),
            sequences=[SequenceSpec.from_dict(s) for s in data.get("sequences") or []],
        )

    def output_spec(self, method: str, index: int) -> OutputSpec | None:
        m = self.methods.get(method)
        if m is None or index >= len(m.outputs):
            return None
        return m.outputs[index]


def describe_inputs(model: ModelInfo, build: BuildInfo) -> list[str]:
    """Lines saying which weights and which inputs a bundle was built with (inspect and reports)."""
    lines = []
    weights = model.weights
    if isinstance(weights, ModelWeights):
        if weights.kind == "state-dict":
            lines.append(f"weights: the user's state dict {weights.file} (sha256 {str(weights.sha256)[:12]})")
        else:
            lines.append(f"weights: seeded random (seed {weights.seed}): {weights.how}")
    source = build.input_source
    if isinstance(source, InputSource):
        lines.append(f"inputs: {source.kind} from {source.origin}, {source.count} cases"
                     + (f", normalized by {source.normalize}" if source.normalize else ""))
    else:
        inferred = [i for i in build.inputs or [] if isinstance(i, BuildInput) and i.distribution_from]
        if inferred:
            lines.append("inputs: generated, distribution read from the model's example inputs")
    dyn = build.dynamic_shapes
    if isinstance(dyn, dict):
        dims = ", ".join(f"in{d.get('input')}[{d.get('dim')}] {d.get('name')} {d.get('min')}..{d.get('max')}"
                         for d in dyn.get("dims", []) if isinstance(d, dict))
        points = dyn.get("cases", [])
        lines.append(f"dynamic dims {dims}: cases at " + ", ".join(f"{i} {p}" for i, p in enumerate(points)))
    if build.input_structure:
        lines.append(f"inputs flattened from the nested structure {build.input_structure}")
    return lines
