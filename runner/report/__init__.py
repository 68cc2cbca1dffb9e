"""The report of record: `model` (the typed Report and its records), `check` (the field-by-field
check of a report.json read from disk), `record` (the sections of a run and the atomic write of
report.json). Derived formats (JUnit, Markdown, HTML, the GitHub summary) live in runner/writers/.
"""
