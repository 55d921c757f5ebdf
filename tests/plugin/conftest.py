"""The plugin node's fixtures (tests/plugnode.py), found by pytest through this conftest."""

from tests.plugnode import node, short_root

__all__ = ["node", "short_root"]
