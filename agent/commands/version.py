"""``dra-agent version``."""

from __future__ import annotations

import json
import platform

import click

from agent import __version__
from agent.explain.features import MODELLED_KUBERNETES

#: resource.k8s.io versions the slice controller can publish, in order of preference.
RESOURCE_API_VERSIONS = ("v1", "v1beta2", "v1beta1")
#: kubelet gRPC services served, in the order they are advertised (agent.plugin.registration's
#: DRA_SERVICES and HEALTH_SERVICES; not imported from there, which would load grpc for this).
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
#: The Kubernetes releases the real-Kubernetes suite runs the agent against (hack/realk8s).
TESTED_KUBERNETES = ("1.37", "1.35")


def version_info() -> dict[str, object]:
    return {
        "version": __version__,
        "python": platform.python_version(),
        "resourceAPIVersions": list(RESOURCE_API_VERSIONS),
        "kubeletServices": list(KUBELET_SERVICES),
        "healthServices": list(HEALTH_SERVICES),
        "testedKubernetes": list(TESTED_KUBERNETES),
        "explainModelsKubernetes": MODELLED_KUBERNETES,
    }


@click.command()
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text")
def command(output: str) -> None:
    """Print the version and the API versions served."""
    info = version_info()
    if output == "json":
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"dra-agent {info['version']} (python {info['python']})")
    click.echo(f"resource.k8s.io: {', '.join(RESOURCE_API_VERSIONS)}")
    click.echo(f"kubelet services: {', '.join(KUBELET_SERVICES)}; "
               f"health: {', '.join(HEALTH_SERVICES)} (with --health)")
    click.echo(f"tested against Kubernetes: {', '.join(TESTED_KUBERNETES)} (real kube-apiserver "
               "and the kubelet's own DRA manager)")
    click.echo(f"explain models: kube-scheduler {MODELLED_KUBERNETES} (its DRA feature gate "
               "defaults; --kubernetes-version 1.35 for that release's)")
