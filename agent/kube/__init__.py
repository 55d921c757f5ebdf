"""Talking to the API server: one JSON-over-HTTP transport (``transport``; its error type in
``errors``, a watch's line stream in ``stream``), its backends (``lean``: no ``kubernetes``
import; ``official``: over ``kubernetes.client``), building a client from the agent's
configuration (``client``) and the resource.k8s.io version the server serves (``apiversions``).

Nothing is imported here: ``discover`` and ``cdi generate`` never talk to an API server and must
not pay for any of it.
"""
