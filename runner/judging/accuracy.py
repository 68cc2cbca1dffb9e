"""Dataset accuracy from a run: top-k, agreement and confidence intervals.

Why Newcombe's paired interval (his "method 10", 1998): the target and the
float reference classify the *same* samples, so their correctness is paired and
strongly correlated; an unpaired interval would be far too wide. Wald
intervals collapse at accuracies near 100 % (common here) and at small N;
Newcombe combines two Wilson score intervals with the observed correlation,
keeps close to nominal coverage in both regimes, and is deterministic (a
bootstrap would make the same run give a different interval each time). The
tests check it against a paired bootstrap and by simulated coverage.
"""

from __future__ import annotations

import hashlib
import math
from statistics import NormalDist
from typing import Any, Sequence

import numpy as np

from bundlerun.bundles.manifest_records import DatasetInfo
from bundlerun.bundles.errors import BundlerunError

CI_METHOD = "newcombe-paired-wilson"


def z_value(confidence: float = 0.95) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion."""
    if n <= 0:
        return (0.0, 1.0)
    z = z_value(confidence)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def newcombe_paired(
    a_correct: Sequence[bool], b_correct: Sequence[bool], confidence: float = 0.95
) -> tuple[float, float, float]:
    """(difference, low, high) for accuracy(a) - accuracy(b) on paired samples."""
    a = np.asarray(a_correct, dtype=bool)
    b = np.asarray(b_correct, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in number: {a.size} vs {b.size}")
    n = int(a.size)
    if n == 0:
        return (0.0, -1.0, 1.0)
    both = int(np.sum(a & b))
    only_a = int(np.sum(a & ~b))
    only_b = int(np.sum(~a & b))
    neither = n - both - only_a - only_b
    p1, p2 = (both + only_a) / n, (both + only_b) / n
    l1, u1 = wilson(both + only_a, n, confidence)
    l2, u2 = wilson(both + only_b, n, confidence)
    denom = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = (both * neither - only_a * only_b) / math.sqrt(denom) if denom > 0 else 0.0
    diff = p1 - p2
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    eps = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return (diff, max(-1.0, diff - delta), min(1.0, diff + eps))


def newcombe_unpaired(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """(difference, low, high) for k1/n1 - k2/n2 on independent samples (hybrid score)."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, confidence)
    l2, u2 = wilson(k2, n2, confidence)
    diff = p1 - p2
    return (
        diff,
        diff - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
        diff + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2),
    )


def topk_correct(logits: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """Per-sample bool: is the label among the k largest scores (none when no sample was evaluated:
    every case errored on the target)."""
    if len(labels) == 0:
        return np.zeros(0, dtype=bool)
    logits = np.asarray(logits, dtype=np.float64).reshape(len(labels), -1)
    k = min(k, logits.shape[1])
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return np.any(top == np.asarray(labels).reshape(-1, 1), axis=1)


def labels_digest(labels: Sequence[int]) -> str:
    """Identifies the labelled sample set, so paired comparisons across runs are safe."""
    return hashlib.sha256(",".join(str(int(x)) for x in labels).encode()).hexdigest()[:16]


def dataset_summary(
    actual: np.ndarray,
    reference: np.ndarray,
    labels: Sequence[int],
    name: str,
    num_classes: int | None = None,
    confidence: float = 0.95,
    evaluated: Sequence[bool] | None = None,
) -> dict[str, Any]:
    """The report's `dataset` section.

    `actual`/`reference` are [N, C] scores; rows where `evaluated` is False
    (the case errored on the target) are left out of every number and counted.
    """
    labels = np.asarray(labels, dtype=np.int64)
    keep = np.ones(len(labels), dtype=bool) if evaluated is None else np.asarray(evaluated, dtype=bool)
    act = np.asarray(actual, dtype=np.float64).reshape(len(labels), -1)[keep]
    ref = np.asarray(reference, dtype=np.float64).reshape(len(labels), -1)[keep]
    lab = labels[keep]
    n = int(lab.size)
    t1, r1 = topk_correct(act, lab, 1), topk_correct(ref, lab, 1)
    t5, r5 = topk_correct(act, lab, 5), topk_correct(ref, lab, 5)
    pred, ref_pred = np.argmax(act, axis=1), np.argmax(ref, axis=1)
    agree = pred == ref_pred
    diff, lo, hi = newcombe_paired(t1, r1, confidence)
    diff5, lo5, hi5 = newcombe_paired(t5, r5, confidence)
    full_pred = np.full(len(labels), -1, dtype=np.int64)
    full_pred[keep] = pred
    full_ref = np.full(len(labels), -1, dtype=np.int64)
    full_ref[keep] = ref_pred
    return {
        "name": name,
        "samples": int(len(labels)),
        "evaluated": n,
        "errored": int(len(labels) - n),
        "num_classes": num_classes or int(act.shape[1]) if n else num_classes,
        "top1": float(t1.mean()) if n else None,
        "top5": float(t5.mean()) if n else None,
        "reference_top1": float(r1.mean()) if n else None,
        "reference_top5": float(r5.mean()) if n else None,
        "top1_diff": diff,
        "top1_diff_ci": [lo, hi],
        "top5_diff": diff5,
        "top5_diff_ci": [lo5, hi5],
        "top1_ci": list(wilson(int(t1.sum()), n, confidence)),
        "reference_top1_ci": list(wilson(int(r1.sum()), n, confidence)),
        "agreement": float(agree.mean()) if n else None,
        "agreement_ci": list(wilson(int(agree.sum()), n, confidence)),
        "discordant": {"target_only_correct": int(np.sum(t1 & ~r1)), "reference_only_correct": int(np.sum(~t1 & r1))},
        "confidence": confidence,
        "ci_method": CI_METHOD,
        "labels_sha": labels_digest(labels),
        "labels": [int(x) for x in labels],
        "predictions": [int(x) for x in full_pred],
        "reference_predictions": [int(x) for x in full_ref],
    }


def paired_change(base: dict[str, Any], cur: dict[str, Any], confidence: float = 0.95) -> tuple[float, float, float, str]:
    """(change, low, high, method) of top-1 from a baseline dataset section to a current one.

    Paired when both ran the same labelled samples (same labels digest and
    per-sample predictions); otherwise the unpaired hybrid score interval.
    """
    bp, cp = base.get("predictions"), cur.get("predictions")
    labels = base.get("labels")
    if (
        bp is not None
        and cp is not None
        and labels is not None
        and base.get("labels_sha") == cur.get("labels_sha")
        and len(bp) == len(cp) == len(labels)
    ):
        lab = np.asarray(labels)
        bp_a, cp_a = np.asarray(bp), np.asarray(cp)
        valid = (bp_a >= 0) & (cp_a >= 0)
        d, lo, hi = newcombe_paired((cp_a == lab)[valid], (bp_a == lab)[valid], confidence)
        return d, lo, hi, "paired"
    nb, nc = int(base.get("evaluated") or base.get("samples") or 0), int(cur.get("evaluated") or cur.get("samples") or 0)
    if not nb or not nc or base.get("top1") is None or cur.get("top1") is None:
        return (0.0, -1.0, 1.0, "none")
    d, lo, hi = newcombe_unpaired(round(cur["top1"] * nc), nc, round(base["top1"] * nb), nb, confidence)
    return d, lo, hi, "unpaired"


def dataset_from_outputs(bundle: Any, outputs: dict[str, Any], confidence: float = 0.95) -> dict[str, Any]:
    """The report's `dataset` section of a bundle built with dataset labels.

    `outputs` maps "method/case/0" to the target's first output (as saved in
    outputs.npz); the reference is the bundle's expected output of each case.
    A case without an output (errored on the target) is left out and counted.
    """

    ds = (bundle.manifest.dataset if bundle.manifest else None) or DatasetInfo()
    suites = bundle.method_test_suites
    suite = next((s for s in suites if s.method_name == "forward"), suites[0] if suites else None)
    labels = ds.labels
    if suite is None or labels is None or len(labels) != len(suite.test_cases):
        raise BundlerunError("bundle carries no dataset labels for its test cases (build it with `bundlerun accuracy`)")
    reference = np.stack([tc.expected_outputs[0].to_array().astype(np.float64).reshape(-1) for tc in suite.test_cases])
    actual = np.zeros_like(reference)
    evaluated = np.zeros(len(labels), dtype=bool)
    for i in range(len(labels)):
        arr = outputs.get(f"{suite.method_name}/{i}/0")
        if arr is not None and np.asarray(arr).size == reference.shape[1]:
            actual[i] = np.asarray(arr, dtype=np.float64).reshape(-1)
            evaluated[i] = True
    return dataset_summary(actual, reference, labels, "dataset" if ds.name is None else ds.name, ds.num_classes, confidence, evaluated)
