"""A NIC's interface configured inside the pod: the ``netdev:`` opaque config's addresses,
MTU, hardware address, routes, ethtool features and RDMA namespace (docs/netdev.md).

Everything here uses the standard library alone and imports nothing else of the agent: the
OCI hook (``agent.netdev.hook``) runs once per container start, so its import cost is the
container's start-up cost, and the hook's bundle (``agent.netdev.install``) carries only
this package.
"""
