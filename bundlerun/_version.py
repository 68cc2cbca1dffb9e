"""Single source of the version: read by pyproject (setuptools dynamic) and the CLI
without importlib.metadata, which costs ~0.1 s at start-up."""

__version__ = "0.1.0"
