"""Simulated device faults from outside the agent's process (``dra-agent simulate fault``).

A ``--simulate`` agent's GPUs are a ``FakeNvml``, whose fault hooks exist only inside its
process. ``FaultInbox`` makes them reachable from outside: the agent watches
``<plugin dir>/simulated-faults/`` (beside the checkpoint and the simulated GPUs' other state;
the DaemonSet mounts that directory, so ``kubectl exec`` into the agent's container reaches it),
and every file there is one request, a JSON object of at most ``MAX_REQUEST_BYTES``::

    {"device": "gpu-3", "fault": "xid", "xid": 79}
    {"device": "gpu-3", "fault": "ecc"}        a double-bit (uncorrectable) ECC error
    {"device": "gpu-3", "fault": "lost"}       the GPU falls off the bus (NVML: GPU_IS_LOST)
    {"device": "gpu-3", "fault": "recover"}    the GPU answers NVML again

``device`` is a published device name: a GPU, or a MIG device (an Xid or ECC error then names
its instance; ``lost`` and ``recover`` act on its whole GPU). The health monitor sees the fault
as it would a real one: the taints that follow are its (``--health-taint-effects``), and an
Xid or ECC error clears by itself once the quiet period passes without another.

While it runs, a simulated agent holds a shared flock on ``<plugin dir>/simulated-faults.lock``
(``agent_problem`` tells a writer whether one does: a lock nobody holds is a simulated agent
gone). The inbox itself is made by its first writer, so an agent nobody sends faults to leaves
nothing but that lock beside its checkpoint.

A request delivered is deleted, with one log line naming the device. One that cannot be (bad
JSON, an unknown device, a NIC, over the size cap, a symlink, a directory, a FIFO) is one
warning line and is moved aside to ``.rejected/``, with ``<name>.reason`` beside it saying why
(the newest ``MAX_REJECTED`` entries are kept). Names starting with a dot are never requests:
the writer's temporary files, ``.rejected``, ``.lock``.

``write_request`` is the writer's side: a temporary file renamed into place, so the agent never
reads half a request. Every poll of the agent holds the inbox's ``.lock`` (flock), so the two
agents of a rolling update never both deliver one request, and a writer that gives up waiting
withdraws its request without racing a delivery (``withdraw``).

The modules: ``request`` (what a request is, and its parsing), ``layout`` (the names and the
locks both sides share), ``writer`` (``dra-agent simulate fault``'s side), ``inbox`` (the agent's
side, ``FaultInbox``) and ``plan`` (what a request does to the simulated GPUs). Nothing is
imported here: the writer's side never loads the agent's.
"""
