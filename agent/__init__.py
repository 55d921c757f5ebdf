"""dra-agent: the node agent (CLI, daemon wiring, slice controller, kubelet plugin)."""

__version__ = "0.1.0"
