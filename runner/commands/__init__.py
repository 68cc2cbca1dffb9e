"""Subcommands of the CLI, each a module exposing `command` and loaded on use (runner/cli.py)."""
