"""Installed package versions for provenance records (a bundle's manifest, the build cache's key,
a worker's hello): below builder.py and build_cache.py, which both ask."""

from __future__ import annotations

from importlib import metadata


def package_versions(dists: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of `dists` ('unknown' when absent), for provenance records."""
    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out
