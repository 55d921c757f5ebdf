"""A fake kube-apiserver for tests: a real HTTP server the official `kubernetes` client talks to.

It serves core `nodes` and `namespaces` and resource.k8s.io `resourceslices`, `deviceclasses`,
`resourceclaims` (+ `/status`) and `resourceclaimtemplates` in v1, v1beta2 and v1beta1 (stored
once as v1, converted per request), and fails where a 1.36 kube-apiserver fails: 409 on stale
writes and failed preconditions, 410 Expired in a watch stream, 422 with field causes, 400 on
unsupported field selectors, 404, 415. README.md beside this file says what it does not do.

    with FakeAPIServer() as srv:
        api = kubernetes.client.ResourceV1Api(srv.api_client())
"""

from .engine import RequestRecord
from .errors import APIError, FieldError
from .server import FakeAPIServer

__all__ = ["APIError", "FakeAPIServer", "FieldError", "RequestRecord"]
