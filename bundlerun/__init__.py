"""bundlerun: on-device BundleIO validation runner for ExecuTorch.

The code lives in the repository's top-level folders and is installed under this
namespace (pyproject.toml maps them), so it never collides with another
distribution's top-level `runner` package (tosa-tools ships one):

    bundlerun.bundles   build: models -> .bpte with embedded tolerances    (./bundles)
    bundlerun.targets   deploy / run / collect raw outputs                 (./targets)
    bundlerun.runner    compare, judge, report, history, CLI              (./runner)
"""
