"""CDI (Container Device Interface) for dra-agent: spec model and files, container edits.

Modules, by concept (nothing is imported here, so ``import cdi`` costs nothing):

* ``spec`` / ``parse`` / ``version`` / ``names``: the spec model, strict parsing, the lowest
  cdiVersion a spec needs, vendor/class/device name rules;
* ``files``: spec files written durably, removed idempotently, read back; ``annotations``:
  the ``cdi.k8s.io/`` container annotations;
* ``atomicfile``: the project's one atomic durable file write (temp file, fsync, rename),
  which the agent's checkpoint and metadata files use too: it lives here because cdi imports
  nothing of the agent;
* ``edits``: ``EditsProvider``, the container edits per device kind, built on ``nvidia`` /
  ``nvidia_driver`` (driver files, hooks, MIG caps), ``nic`` (RDMA, netdev, VFIO), ``dri``
  (AMD/Intel), ``host`` (device nodes, procfs), ``ldcache`` and ``elf`` (library lookup).
"""
