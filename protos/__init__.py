"""Our .proto files for the kubelet plugin protocols and the modules generated from them.

Wire-identical to the kubelet's own definitions (package names, service names, field numbers,
types and labels). Regenerate with ``hack/gen-protos.sh``; the tests fail on any drift.

- ``protos.pluginregistration.api_pb2``: plugin registration (package ``pluginregistration``)
- ``protos.dra.v1.api_pb2``: DRA node service v1 (kubelet 1.34+)
- ``protos.dra.v1beta1.api_pb2``: DRA node service v1beta1 (kubelet 1.32+)
- ``protos.drahealth.v1alpha1.api_pb2``: device health stream (package ``v1alpha1``)
"""
