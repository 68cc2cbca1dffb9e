"""Room debug: from a failing output to the layer (`bundlerun debug`) or the delegated node
(`bundlerun bisect`) that went wrong, and their reports.

Imports bundles/, targets/, judging/, history/ (read only), report/, pictures/, writers/html and the
front door's session. See docs/architecture.md."""
