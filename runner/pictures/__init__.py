"""Room pictures: the HUD site (hud, hud_grid, hud_page) and the PNG plots of the HTML
report, the debug report and `trend`.

May import bundles/, judging/, history/ and report/. See docs/architecture.md."""
