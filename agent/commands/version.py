"""``dra-agent version``."""

from __future__ import annotations

import json
import platform

import click

from agent import __version__
from agent.explain.features import MODELLED_KUBERNETES

#: resource.k8s.io versions the slice controller can publish, in order of preference.
RESOURCE_API_VERSIONS = ("v1", "v1beta2", "v1beta1")
#: kubelet gRPC services served, in the order they are advertised.
KUBELET_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def version_info() -> dict[str, object]:
    return {
        "version": __version__,
        "python": platform.python_version(),
        "resourceAPIVersions": list(RESOURCE_API_VERSIONS),
        "kubeletServices": list(KUBELET_SERVICES),
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
    click.echo(f"kubelet services: {', '.join(KUBELET_SERVICES)}")
    click.echo(f"explain models: kube-scheduler {MODELLED_KUBERNETES} (its DRA feature gate "
               "defaults; --kubernetes-version 1.35 for that release's)")
