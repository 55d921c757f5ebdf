"""``dra-agent explain``: would this claim fit on this node, and why not.

Thin: read the files (or discovery, or the cluster), call ``agent.explain.explain``, render.
Exit 0 fits, 1 does not fit, 2 bad input (one line, pointing at the file and line when known).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from agent.commands.options import pop_config, shared_options
from agent.explain.docs import Doc, InputError, decode, load_file, load_text, packaged_classes
from agent.explain.features import DEFAULTS, MODELLED_KUBERNETES, parse_gates
from agent.explain.pods import claims_of_pod
from agent.explain.render import to_json, to_table, to_table_pod, to_yaml


@click.command()
@click.option("-f", "--filename", "claim_files", required=True, multiple=True,
              type=click.Path(dir_okay=False),
              help="ResourceClaim (or ResourceClaimTemplate) YAML/JSON; '-' for stdin. Several "
                   "(or a file of several): one pod's claims, allocated together. A Pod: "
                   "its claims, from the other files or the cluster.")
@click.option("--class", "class_files", multiple=True, type=click.Path(dir_okay=False),
              help="DeviceClass file(s); several classes per file are fine "
                   "[default: the agent's own classes, as deploy/base installs them; the "
                   "cluster's with --slices from-cluster].")
@click.option("--slices", "slices_from", default="from-discovery", show_default=True,
              help="from-cluster, from-discovery (this node, or --simulate PROFILE) or a FILE.")
@click.option("--allocated", "allocated_files", multiple=True,
              type=click.Path(dir_okay=False),
              help="Claims already allocated (their status.allocation holds devices).")
@click.option("--feature-gates", default="", metavar="NAME=BOOL,...",
              help="kube-scheduler feature gates (DRAListTypeAttributes=true, ...) on top of "
                   "--kubernetes-version's defaults.")
@click.option("--kubernetes-version", default=MODELLED_KUBERNETES, show_default=True,
              type=click.Choice(sorted(DEFAULTS)),
              help="Whose scheduler gate defaults to start from.")
@click.option("--node-labels", default="", metavar="KEY=VALUE,...",
              help="The Node's labels, for slices and devices selected by nodeSelector "
                   "[default: kubernetes.io/hostname=NODE; the Node's own with from-cluster].")
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table",
              show_default=True)
@shared_options("driver_name", "node_name", "kubeconfig", "sysfs_root", "simulate",
                "device_types", "numa_node_attribute", "sharing", "mig", "vfs", "vf_bandwidth",
                "gpu_passthrough",
                "config_file", "verbosity")
def command(*, claim_files: tuple[str, ...], class_files: tuple[str, ...], slices_from: str,
            allocated_files: tuple[str, ...], feature_gates: str, kubernetes_version: str,
            node_labels: str, output: str, **kwargs: Any) -> None:
    """Replay the scheduler's device allocation for one claim on this node."""
    cfg = pop_config(kwargs)
    try:
        _run(cfg, claim_files=claim_files, class_files=class_files, slices_from=slices_from,
             allocated_files=allocated_files, feature_gates=feature_gates,
             kubernetes_version=kubernetes_version, node_labels=node_labels, output=output)
    except InputError as err:
        _fail(f"error: {err}")
    except (RecursionError, MemoryError) as err:
        _fail(f"error: the input is too large or too deeply nested ({type(err).__name__})")
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
        # Input the parsers did not foresee: one line, never a traceback (exit 2, not "1 = does
        # not fit", so a script can tell them apart).
        _fail(f"error: cannot use this input: {type(err).__name__}: {err}")


def _fail(line: str) -> None:
    click.echo(" ".join(line.split())[:1000], err=True)
    raise SystemExit(2)


def _check_kubeconfig(value: str) -> None:
    """A kubeconfig path that names no file is a mistake even where this run reads no cluster
    (``--slices from-discovery``): the operator meant some cluster, and would not be told."""
    text = value.strip()
    if not text or text.lower() == "none":
        return
    path = Path(text).expanduser()
    if not path.is_file():
        why = "not a regular file" if path.exists() else "no such file"
        raise InputError("--kubeconfig", f"{text}: {why}")


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (kubectl's form); a key alone has an empty value."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, _, value = part.partition("=")
        if not key.strip():
            raise InputError("--node-labels", f"{part!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def _run(cfg: Any, *, claim_files: tuple[str, ...], class_files: tuple[str, ...], slices_from: str,
         allocated_files: tuple[str, ...], feature_gates: str, kubernetes_version: str,
         node_labels: str, output: str) -> None:
    _check_kubeconfig(cfg.kubeconfig)
    features = parse_gates(feature_gates, kubernetes_version)
    labels = parse_labels(node_labels)
    claims: list[Doc] = []
    for claim_file in claim_files:
        found = (load_text(decode(sys.stdin.buffer.read(), "<stdin>"), "<stdin>")
                 if claim_file == "-" else load_file(claim_file))
        if not found:
            raise InputError(claim_file, "no claim in the file")
        claims.extend(found)
    classes: list[Doc | dict[str, Any]] = [d for f in class_files for d in load_file(f)]
    allocated: list[Doc | dict[str, Any]] = [d for f in allocated_files for d in load_file(f)]
    slices: list[Doc | dict[str, Any]]
    cluster = None
    if slices_from == "from-cluster":
        # Lazy, as slices_from_discovery below: the API client, or discovery, is loaded only
        # by the run that reads it.
        from agent.explain.sources import Cluster

        cluster = Cluster(cfg)
    to_explain: list[Any] = list(claims)
    if any(d.obj.get("kind") == "Pod" for d in claims):
        to_explain = claims_of_pod(claims, cluster.get if cluster is not None else None)
    if cluster is not None:
        slices = list(cluster.slices())
        if not class_files:
            classes = list(cluster.classes())
        if not allocated_files:
            allocated = list(cluster.allocated_claims())
        if not node_labels:
            labels = cluster.node_labels()
    elif slices_from == "from-discovery":
        from agent.explain.sources import slices_from_discovery

        # auto: the form this node's agent would publish to a cluster with these gates.
        lists = {"list": True, "scalar": False}.get(cfg.numa_node_attribute,
                                                    features.list_type_attributes)
        slices = list(slices_from_discovery(cfg, lists))
    else:
        slices = list(load_file(slices_from))
    if not class_files and slices_from != "from-cluster":
        classes = list(packaged_classes())
    # Lazy: the allocator and its CEL engine are a quarter of a second, not paid for -h.
    from agent.explain.api import explain_pod

    pod = explain_pod(to_explain, classes, slices, cfg.node_name, allocated,
                      node_labels=_with_hostname(labels, cfg.node_name),
                      feature_gates=features, kubernetes_version=kubernetes_version)
    if len(pod.claims) == 1:  # one claim: its own report, as ever
        result = pod.claims[0]
        text = to_json(result) if output == "json" else (
            to_yaml(result) if output == "yaml" else to_table(result))
    else:
        text = to_json(pod) if output == "json" else (
            to_yaml(pod) if output == "yaml" else to_table_pod(pod))
    click.echo(text)
    raise SystemExit(0 if pod.fits else 1)


def _with_hostname(labels: dict[str, str], node: str) -> dict[str, str]:
    """Every Node carries kubernetes.io/hostname; selectors on it must match unless told."""
    return {"kubernetes.io/hostname": node, **labels}
