"""The typed records of a manifest's `model`, `build` and `dataset` sections.

`Manifest.from_dict` reads each section once into these dataclasses; `to_dict` writes it back as it
was read: the keys in the order read, keys no field holds kept with their values, every value as
read (an int stays an int). So a manifest written by another bundlerun version (a record with a
field this one does not know, such as an LLM build's `kv_io`) round-trips byte-identical, and a
section built here from a dict (`BuildInfo.from_dict({...})`, as the builders do) writes exactly
that dict. A record made with its constructor writes its fields in declaration order, leaving out
optional ones that are None. Nothing here judges: every field is provenance, shown by `inspect`
and the reports; the criteria live in `manifest.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from bundlerun.bundles.kept_shape import Shape, field_default

R = TypeVar("R", bound="Record")


def _written(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_written(v) for v in value]
    return value


class Record:
    """A manifest section read into a dataclass that remembers the shape it was read in."""

    KEYS: ClassVar[dict[str, str]] = {}  # field -> JSON key, where they differ ("from" is a keyword)
    NESTED: ClassVar[dict[str, type["Record"]]] = {}  # field -> record, for an object value
    LISTS: ClassVar[dict[str, type["Record"]]] = {}  # field -> record, for a list of objects
    ALWAYS: ClassVar[tuple[str, ...]] = ()  # fields a record made here writes even when None
    _shape: Shape | None = None  # set by from_dict

    @classmethod
    def _key(cls, name: str) -> str:
        return cls.KEYS.get(name, name)

    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        """The record of `data` (an object already checked by `validate_manifest`), keeping its shape.
        A value of another kind than its field expects (a list where an object was expected) is kept
        as read: the schema check decides what is valid, the record only carries it."""
        by_key = {cls._key(f.name): f.name for f in fields(cls)}  # type: ignore[arg-type]
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            name = by_key.get(key)
            if name is None:
                extra[key] = value
                continue
            if name in cls.NESTED and isinstance(value, dict):
                value = cls.NESTED[name].from_dict(value)
            elif name in cls.LISTS and isinstance(value, list):
                value = [cls.LISTS[name].from_dict(v) if isinstance(v, dict) else v for v in value]
            kw[name] = value
        record = cls(**kw)
        record._shape = Shape(tuple(data), extra)
        return record

    @property
    def extra(self) -> dict[str, Any]:
        """The keys of what was read that no field holds (a newer version's), with their values."""
        return dict(self._shape.extra) if self._shape is not None else {}

    def to_dict(self) -> dict[str, Any]:
        own = {self._key(f.name): _written(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
        if self._shape is None:
            return {key: value for (key, value), f in zip(own.items(), fields(self))  # type: ignore[arg-type]
                    if value is not None or f.name in self.ALWAYS}
        out = {key: self._shape.extra[key] if key in self._shape.extra else own[key] for key in self._shape.keys}
        for (key, value), f in zip(own.items(), fields(self)):  # type: ignore[arg-type]
            if key not in out and getattr(self, f.name) != field_default(f):  # set since it was read
                out[key] = value
        return out


@dataclass
class ModelWeights(Record):
    """`model.weights`: an et: model's weights, seeded random or the user's state dict."""

    kind: str | None = None  # "seeded-random" | "state-dict"
    seed: int | None = None
    how: str | None = None
    file: str | None = None
    sha256: str | None = None


@dataclass
class ModelInfo(Record):
    """`model`: which model the bundle holds."""

    id: str = ""
    source: str | None = None
    description: str | None = None
    weights: ModelWeights | None = None
    NESTED: ClassVar[dict[str, type[Record]]] = {"weights": ModelWeights}


@dataclass
class BuildInput(Record):
    """One of `build.inputs`: a model input's shape, dtype and the distribution its cases came from."""

    shape: list[int] = field(default_factory=list)
    dtype: str | None = None
    distribution: str | None = None
    distribution_from: str | None = None  # "example": read from the model's example inputs


@dataclass
class InputSource(Record):
    """`build.input_source`: real inputs (`--inputs images|mnist|FOLDER`, bundles/real_inputs.py)."""

    kind: str | None = None  # "images" | "mnist" | "folder"
    origin: str | None = None  # JSON key "from": where the inputs were read
    files: list[str] | None = None
    indices: list[int] | None = None
    labels: list[int] | None = None
    resize: str | None = None
    normalize: str | None = None
    KEYS: ClassVar[dict[str, str]] = {"origin": "from"}

    @property
    def count(self) -> int:
        return len(self.files or self.indices or [])


@dataclass
class EtrecordInfo(Record):
    """`build.etrecord`: the ETRecord written beside the bundle (bundles/etrecord.py)."""

    path: str | None = None
    sha256: str | None = None
    bytes: int | None = None
    debug_handles: int | None = None
    graphs: list[str] | None = None
    delegate_graphs: dict[str, Any] | None = None


@dataclass
class LlmBuild(Record):
    """`build.llm`: the export_llama configuration of an LLM bundle (bundles/llm_build.py); shown,
    never used to judge, except `kv_io`, which threads a QNN static llama's KV cache from step to step.
    Open: a field another version adds is kept as read."""

    arch: str | None = None
    size: str | None = None
    params: dict[str, Any] | None = None
    dtype: str | None = None
    quantization: str | None = None
    max_seq_len: int | None = None
    dynamic_shape: bool | None = None
    use_kv_cache: bool | None = None
    weights: str | None = None
    tokenizer: str | None = None
    export_s: float | None = None
    model_class: str | None = None
    reference: str | None = None
    # QNN's static llama (bundles/llm_qnn.py): its KV cache as program I/O, threaded by bundlerun
    kv_io: list[dict[str, Any]] | None = None  # [{"output", "input", "axis"}] (bundles/sequence.py KvLink)
    kv_update: str | None = None
    exporter: str | None = None


@dataclass
class BuildInfo(Record):
    """`build`: how the bundle was built (backend, target, dtype, reference, inputs, lowering)."""

    backend: str | None = None
    target: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    reference: str | None = None
    inputs: list[BuildInput] = field(default_factory=list)
    input_source: InputSource | None = None
    input_structure: str | None = None
    dynamic_shapes: dict[str, Any] | None = None  # {"dims": [...], "cases": [...]} (bundles/dynamic_shapes.py)
    seed: int | None = None
    cases: int | None = None
    lowering: dict[str, Any] | None = None  # the recipe's own record (delegate, partitioner, ...)
    ops: list[str] | None = None
    overrides: dict[str, Any] | None = None
    cache_key: str | None = None
    etrecord: EtrecordInfo | None = None
    llm: LlmBuild | None = None
    NESTED: ClassVar[dict[str, type[Record]]] = {"input_source": InputSource, "etrecord": EtrecordInfo,
                                                 "llm": LlmBuild}
    LISTS: ClassVar[dict[str, type[Record]]] = {"inputs": BuildInput}
    ALWAYS: ClassVar[tuple[str, ...]] = ("quantization",)


@dataclass
class DatasetInfo(Record):
    """`dataset`: the labelled dataset a bundle's cases are samples of (`bundlerun accuracy`)."""

    name: str | None = None
    labels: list[int] | None = None
    num_classes: int | None = None
    source: str | None = None

    def __bool__(self) -> bool:  # an empty `dataset: {}` records none, as the dict it was read from said
        return bool(self.to_dict())
