"""Room debug: from a failing output to the layer (debug) or delegated node (bisect) that
went wrong, and their reports.

May import bundles/, targets/, judging/, history/ (read only), pictures/ and report/.
See docs/architecture.md."""
