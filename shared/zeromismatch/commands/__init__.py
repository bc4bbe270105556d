"""Subcommands of ``zm``; each module exposes ``register(subparsers)``."""
