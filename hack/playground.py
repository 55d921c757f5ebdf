"""The playground's cluster-side steps; ``hack/playground.sh`` runs the processes around them.

    python -m hack.playground setup --kubeconfig K          # Node + DeviceClasses
    python -m hack.playground flow --kubeconfig K --kubelet-dir D --cdi-dir C
    python -m hack.playground cdi                           # a real GPU's CDI spec

``flow`` plays the rest of a cluster against the running agent: the kubelet (registration,
NodePrepareResources, NodeUnprepareResources), a user creating a ResourceClaim for a GPU and a
NIC under one PCIe root, and the scheduler (``dra-agent explain``'s allocator writes the
allocation). It prints what a newcomer wants to see at each step.

The simulated agent's CDI specs hold only env entries (nothing to mount exists); ``cdi`` prints
the spec the same code writes for a GPU on a host laid out as a real NVIDIA 570 driver installs
itself: the CDI tests' fixture host (device nodes, driver libraries, ld cache, hook).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

NODE = "playground"
DRIVER = "dra-agent.io"
REPO = Path(__file__).resolve().parent.parent


def api(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    load: Any = config.load_kube_config  # untyped upstream
    load(str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


def request(api_client: Any, method: str, path: str, body: Any = None) -> Any:
    """One raw call; objects stay plain dicts, as the agent keeps them."""
    response = api_client.call_api(
        *api_client.param_serialize(method=method, resource_path=path, body=body,
                                    header_params={"Accept": "application/json",
                                                   "Content-Type": "application/json"}),
    )
    text = response.read().decode()
    if not 200 <= response.status <= 299:
        raise RuntimeError(f"{method} {path}: HTTP {response.status}: {text}")
    return json.loads(text) if text else None


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)), flush=True)


def setup(kubeconfig: Path) -> None:
    client = api(kubeconfig)
    request(client, "POST", "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    with (REPO / "deploy" / "base" / "deviceclasses.yaml").open() as f:
        classes = [c for c in yaml.safe_load_all(f) if c]
    for cls in classes:
        request(client, "POST", "/apis/resource.k8s.io/v1/deviceclasses", cls)
    print(f"created Node {NODE} and DeviceClasses "
          f"{', '.join(c['metadata']['name'] for c in classes)}")


def wait_for(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")


def attr(device: dict[str, Any], name: str) -> str:
    value = (device.get("attributes") or {}).get(name)
    return str(next(iter(value.values()))) if value else "-"


def print_slices(slices: list[dict[str, Any]]) -> None:
    for s in slices:
        devices = s["spec"]["devices"]
        print(f"ResourceSlice {s['metadata']['name']}: driver {s['spec']['driver']}, "
              f"pool {s['spec']['pool']['name']}, node {s['spec']['nodeName']}, "
              f"{len(devices)} devices")
        print(f"  {'DEVICE':<20} {'TYPE':<5} {'PCIE ROOT':<12} {'NUMA':<5} PRODUCT / INTERFACE")
        for d in devices:
            what = attr(d, "productName") if attr(d, "type") == "gpu" else attr(d, "ifName")
            print(f"  {d['name']:<20} {attr(d, 'type'):<5} "
                  f"{attr(d, 'resource.kubernetes.io/pcieRoot'):<12} "
                  f"{attr(d, 'resource.kubernetes.io/numaNode'):<5} {what}")


def flow(kubeconfig: Path, kubelet_dir: Path, cdi_dir: Path) -> int:
    from agent.explain import explain
    from tests.fakes.kubelet import ClaimRef, KubeletStandIn

    client = api(kubeconfig)
    section("kubelet: plugin registration")
    with KubeletStandIn(kubelet_dir / "plugins_registry") as kubelet:
        reg = kubelet.wait_registered(DRIVER, timeout=30)
        print(f"registered {reg.driver} ({reg.service}) at {reg.endpoint}")

        section("ResourceSlices published by the agent")
        selector = f"?fieldSelector=spec.nodeName%3D{NODE}"
        slices = wait_for("ResourceSlices", lambda: request(
            client, "GET", "/apis/resource.k8s.io/v1/resourceslices" + selector)["items"])
        print_slices(slices)

        section("user: a ResourceClaim for a GPU and a NIC under one PCIe root")
        claim = request(client, "POST", "/apis/resource.k8s.io/v1/namespaces/default/"
                        "resourceclaims", {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "gpu-and-nic"},
            "spec": {"devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}},
                    {"name": "nic", "exactly": {"deviceClassName": f"nic.{DRIVER}"}},
                ],
                "constraints": [{"requests": ["gpu", "nic"],
                                 "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
            }},
        })
        print(yaml.safe_dump({"spec": claim["spec"]}, sort_keys=False), end="")

        section("scheduler: allocate (dra-agent explain's allocator)")
        classes = request(client, "GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
        result = explain(claim, classes, slices, NODE)
        if not result.fits or result.allocation is None:
            print(json.dumps(result.to_dict(), indent=2))
            return 1
        claim["status"] = {"allocation": result.allocation, "reservedFor": [
            {"resource": "pods", "name": "playground-pod", "uid": str(uuid.uuid4())}]}
        path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/gpu-and-nic/status"
        claim = request(client, "PUT", path, claim)
        print(yaml.safe_dump({"metadata": {"name": claim["metadata"]["name"],
                                           "uid": claim["metadata"]["uid"]},
                              "status": claim["status"]}, sort_keys=False), end="")

        section("kubelet: NodePrepareResources")
        ref = ClaimRef("default", claim["metadata"]["name"], claim["metadata"]["uid"])
        prepared = kubelet.prepare(DRIVER, [ref])[ref.uid]
        if prepared.error:
            print(f"error: {prepared.error}")
            return 1
        for d in prepared.devices:
            print(f"{'/'.join(d.request_names)}: {d.pool_name}/{d.device_name} -> "
                  f"{', '.join(d.cdi_device_ids)}")

        section("CDI spec written by the agent")
        for spec in sorted(cdi_dir.glob("*.json")):
            print(f"# {spec}")
            print(json.dumps(json.loads(spec.read_text()), indent=2))

        section("kubelet: NodeUnprepareResources")
        done = kubelet.unprepare(DRIVER, [ref])[ref.uid]
        if done.error:
            print(f"error: {done.error}")
            return 1
        checkpoint = json.loads((kubelet_dir / "plugins" / DRIVER / "checkpoint.json")
                                .read_text())
        print(f"unprepared; CDI specs left: {len(list(cdi_dir.glob('*.json')))}, "
              f"checkpoint records left: {len(checkpoint['claims'])}")
    return 0


def real_gpu_spec() -> str:
    """The CDI spec ``dra-agent cdi generate`` prints for one GPU of the CDI tests' fixture
    host: what the agent writes on a real node, where a simulated one has only env entries."""
    import tempfile

    from agent.commands.cdi import generate_spec, render
    from cdi.edits import EditsProvider
    from tests.cdi.conftest import gpu
    from tests.cdi.fakeroot import FakeHost

    with tempfile.TemporaryDirectory(prefix="playground-cdi-") as tmp:
        host = FakeHost(Path(tmp))
        for d in (host.root, host.dev, host.proc, host.sys):
            d.mkdir(parents=True)
        host.install_driver(hook="1.17.4")  # the version nvidia-cdi-hook reports
        host.make_control_nodes()
        host.add_gpu(0, "0000:1b:00.0")
        provider = EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys)
        text = render(generate_spec([gpu()], provider, f"{DRIVER}/gpu"), "yaml")
        # The fixture lives in a temporary directory; show the paths as on the host.
        return text.replace(str(host.root), "").replace(str(host.dev), "/dev")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hack.playground", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("setup", "flow", "cdi"))
    parser.add_argument("--kubeconfig", type=Path)
    parser.add_argument("--kubelet-dir", type=Path)
    parser.add_argument("--cdi-dir", type=Path)
    args = parser.parse_args(argv)
    if args.step == "cdi":
        section("CDI spec of a real GPU (the simulated agent's hold only env entries)")
        print(real_gpu_spec())
        return 0
    if args.kubeconfig is None:
        parser.error(f"{args.step} needs --kubeconfig")
    if args.step == "setup":
        setup(args.kubeconfig)
        return 0
    if args.kubelet_dir is None or args.cdi_dir is None:
        parser.error("flow needs --kubelet-dir and --cdi-dir")
    return flow(args.kubeconfig, args.kubelet_dir, args.cdi_dir)


def interruptible(argv: list[str] | None = None) -> int:
    """``main``, where Ctrl-C is one line (and 130, as a shell reports it), not a traceback;
    the with-blocks of ``flow`` have closed the kubelet stand-in on the way out."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("playground: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(interruptible())
