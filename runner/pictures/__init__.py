"""Room pictures: the HUD site (hud, hud_grid, hud_page) and the PNG plots of the HTML report,
the debug report and `trend`.

Imports bundles/, judging/, history/, report/ and writers/html (a HUD page renders a run's report).
See docs/architecture.md."""
