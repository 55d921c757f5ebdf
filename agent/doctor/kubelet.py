"""The kubelet: its version, its DRA feature gates, its root dir and the agent's registration.

DRA reached the kubelet in 1.32 (beta, ``DynamicResourceAllocation`` off by default) and is on
by default since 1.34 (GA). A kubelet without it never calls the agent: claims stay pending
with no event on the node side.
"""

from __future__ import annotations

import re
from typing import Any

from agent.doctor.context import Context
from agent.doctor.host import HostFileError
from agent.doctor.model import Check, fail, ok, skipped, warn

#: Where kubelet configurations usually are (kubeadm's first); the kubelet dir's own is tried
#: before these when --kubelet-dir is not the default.
CONFIG_FILES = ("/var/lib/kubelet/config.yaml", "/etc/kubernetes/kubelet-config.yaml",
                "/etc/kubernetes/kubelet.conf", "/etc/kubernetes/kubelet/config.yaml")
DRA_GATE = "DynamicResourceAllocation"
#: The first kubelet that talks to DRA plugins (v1beta1), and the first with DRA on by default.
FIRST_DRA, DEFAULT_ON = (1, 32), (1, 34)

GATES, VERSION, KUBELET_DIR, REGISTRATION = ("kubelet feature gates", "kubelet version",
                                             "kubelet dir", "plugin registration")


def kubelet_config(ctx: Context) -> tuple[str, dict[str, Any]] | None:
    """(host path, document) of the first KubeletConfiguration found; None when there is none.
    Raises ``HostFileError`` for a file at one of the names that cannot be read or parsed."""
    own = f"{ctx.options.kubelet_dir}/config.yaml"
    for path in dict.fromkeys((own, *CONFIG_FILES)):
        if not ctx.host.exists(path):
            continue
        doc = ctx.host.read_yaml(path)
        if not isinstance(doc, dict):
            raise HostFileError(f"{path}: top level is not a mapping")
        if doc.get("kind") not in (None, "KubeletConfiguration"):
            continue  # kubeadm's /etc/kubernetes/kubelet.conf is the kubelet's kubeconfig
        return path, doc
    return None


def dra_gates(doc: dict[str, Any]) -> dict[str, Any]:
    gates = doc.get("featureGates") or {}
    if not isinstance(gates, dict):
        raise HostFileError(f"featureGates is {type(gates).__name__}, not a mapping")
    return {str(k): v for k, v in gates.items()
            if str(k).startswith(("DRA", DRA_GATE, "ResourceHealthStatus"))}


def _gate(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)[:40]


def check_gates(ctx: Context) -> Check:
    try:
        found = kubelet_config(ctx)
        if found is None:
            return skipped(GATES, f"no kubelet config file ({', '.join(CONFIG_FILES)}); the "
                           "kubelet's defaults apply (DRA on since 1.34)")
        path, doc = found
        gates = dra_gates(doc)
    except HostFileError as err:
        return warn(GATES, str(err), "fix the kubelet config file (the kubelet will not start "
                    "with it either)")
    shown = ", ".join(f"{k}={_gate(v)}" for k, v in sorted(gates.items())) or "no DRA gate set"
    bad = sorted(k for k, v in gates.items() if not isinstance(v, bool))
    if bad:
        return warn(GATES, f"{path}: {shown}", f"feature gate values are true or false: "
                    f"{', '.join(bad)}")
    if gates.get(DRA_GATE) is False:
        return fail(GATES, f"{path}: {shown}",
                    f"set featureGates: {{{DRA_GATE}: true}} in {path} and restart the kubelet")
    return ok(GATES, f"{path}: {shown}")


def _version(text: str) -> tuple[int, int] | None:
    m = re.match(r"v?(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_version(ctx: Context) -> Check:
    node, why = ctx.node()
    if node is not None:
        status = node.get("status")
        info = status.get("nodeInfo") if isinstance(status, dict) else None
        text = str(info.get("kubeletVersion", "")) if isinstance(info, dict) else ""
    else:
        # The binary cannot be run from a read-only root; the package database may know it.
        from agent.doctor.packages import from_dpkg

        installed = from_dpkg(ctx.packages(), "kubelet")
        if installed is None:
            return skipped(VERSION, f"not in a package database, and the Node's "
                           f"status.nodeInfo cannot be read: {why}")
        text = f"{installed.version.split('-')[0]} ({installed.source})"
    version = _version(text)
    if version is None:
        return warn(VERSION, f"the Node reports kubelet version {text!r}",
                    "check the kubelet: kubectl get node -o wide")
    if version < FIRST_DRA:
        return fail(VERSION, f"kubelet {text}: DRA plugins need 1.32 or later",
                    "upgrade the kubelet to 1.34 or later (DRA on by default)")
    if version < DEFAULT_ON:
        try:
            found = kubelet_config(ctx)
            gate = dra_gates(found[1]).get(DRA_GATE) if found else None
        except HostFileError:
            gate = None
        if gate is not True:
            return fail(VERSION, f"kubelet {text}: DRA is beta and off by default; "
                        f"{DRA_GATE} is not set true in the kubelet config",
                        f"set featureGates: {{{DRA_GATE}: true}} on the kubelet (and the API "
                        "server, scheduler, controller manager), or upgrade to 1.34")
        return ok(VERSION, f"kubelet {text} with {DRA_GATE}=true")
    return ok(VERSION, f"kubelet {text}")


def check_kubelet_dir(ctx: Context) -> Check:
    path = str(ctx.options.kubelet_dir)
    if not ctx.host.is_dir(path):
        return fail(KUBELET_DIR, f"{path} does not exist under {ctx.host.root}",
                    "pass the kubelet's --root-dir as --kubelet-dir (and mount it)")
    missing = [d for d in ("plugins_registry", "plugins") if not ctx.host.is_dir(f"{path}/{d}")]
    if missing:
        return warn(KUBELET_DIR, f"{path} has no {', '.join(missing)}: is this the kubelet's "
                    "root dir?", "pass the kubelet's --root-dir as --kubelet-dir")
    return ok(KUBELET_DIR, f"{path} with plugins_registry/ and plugins/")


def check_registration(ctx: Context) -> Check:
    registry = f"{ctx.options.kubelet_dir}/plugins_registry"
    driver = ctx.options.driver_name
    # <driver>-reg.sock, or <driver>-<pod UID>-reg.sock in rolling-update mode.
    names = [n for n in ctx.host.listdir(registry)
             if n.startswith(f"{driver}-") and n.endswith("-reg.sock")]
    sockets = [n for n in names if ctx.host.is_socket(f"{registry}/{n}")]
    if not ctx.host.is_dir(registry):
        return skipped(REGISTRATION, f"{registry} does not exist (see kubelet dir)")
    if not sockets:
        what = f"{', '.join(names)} is not a socket" if names else f"no {driver}-reg.sock"
        return fail(REGISTRATION, f"{registry}: {what}",
                    "start the agent (kubectl -n dra-agent get pods -o wide) and read its log; "
                    "the kubelet only calls a plugin that registered")
    return ok(REGISTRATION, f"{registry}/{', '.join(sockets)}")
