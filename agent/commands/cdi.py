"""``dra-agent cdi generate``: a static CDI spec for this node's devices.

For hosts that run containers without Kubernetes (podman, Docker with CDI, systemd units), as
``nvidia-ctk cdi generate`` does for NVIDIA GPUs only. Device names are the inventory names;
every device also carries ``DRA_AGENT_DEVICE_<NAME>_*`` env entries saying what it is.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from agent.commands.options import pop_config, shared_options
from agent.common.logs import setup_logging

if TYPE_CHECKING:
    from cdi.edits import EditsProvider
    from cdi.spec import Spec
    from discovery.model import Device, Inventory

DEFAULT_CLASS = "device"
#: Why a --simulate spec is env entries only: nothing a runtime could mount exists.
SIMULATED_NOTE = (
    "note: simulated devices have no device nodes, driver libraries or hooks on this host, so "
    "each holds only its DRA_AGENT_DEVICE_* env entries; on a real GPU node the spec also "
    "mounts /dev/nvidia* and the driver's libraries and runs nvidia-cdi-hook (python -m "
    "hack.playground cdi shows one); in a cluster, dra-agent run --simulate-device-nodes "
    "gives them stand-in device nodes"
)
#: Why ``cdi generate`` takes no --simulate-device-nodes.
NO_DEVICE_NODES = (
    "--simulate-device-nodes is an option of 'dra-agent run': the stand-in nodes live in the "
    "running agent's plugin directory, and cdi generate writes nothing on the host; without "
    "it the simulated spec holds the env entries only"
)


class GenerateError(click.ClickException):
    """Devices that cannot be put in the spec; exit code 1, one line per device."""


def _refuse_device_nodes(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        raise click.UsageError(NO_DEVICE_NODES, ctx)
    return value


def select_devices(inventory: Inventory, names: Sequence[str]) -> list[Device]:
    """The named devices in the order given (all devices, sorted, when none are named)."""
    by_name = inventory.by_name()
    if not names:
        return [by_name[n] for n in sorted(by_name)]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        known = ", ".join(sorted(by_name)) or "none"
        raise click.UsageError(f"unknown device(s) {', '.join(unknown)}; this node has: {known}")
    return [by_name[n] for n in dict.fromkeys(names)]


def generate_spec(
    devices: Sequence[Device], provider: EditsProvider, kind: str, *, netdev: bool = False
) -> Spec:
    """One spec holding ``devices``; ``GenerateError`` lists every device that cannot be used.

    The shared edits go to the spec level only when every device needs exactly them (a GPU-only
    node); otherwise each device carries its own share, so asking for a NIC never mounts the
    NVIDIA driver.
    """
    # Lazy, as generate's: the CDI machinery (a sixth of a second) loads when a spec is made.
    from cdi.edits import describe_env
    from cdi.errors import DeviceEditsError
    from cdi.spec import CDIDevice, ContainerEdits, Spec

    if not devices:
        raise GenerateError("no devices to put in a CDI spec")
    problems: list[str] = []
    own: list[tuple[Device, ContainerEdits, ContainerEdits]] = []
    for device in devices:
        try:
            edits = provider.edits_for(device, move_netdev=netdev)
            shared = provider.common_edits_for([device])
        except DeviceEditsError as err:
            problems.append(str(err))
            continue
        own.append((device, ContainerEdits(env=describe_env(device)).merge(edits), shared))
    if problems:
        raise GenerateError("cannot generate a CDI spec:\n  " + "\n  ".join(problems))
    first_shared = own[0][2]
    spec_level = all(shared == first_shared for _, _, shared in own)
    cdi_devices = tuple(
        CDIDevice(d.name, edits if spec_level else shared.merge(edits)) for d, edits, shared in own
    )
    return Spec(kind, cdi_devices, first_shared if spec_level else ContainerEdits())


def render(spec: Spec, output: str) -> str:
    if output == "json":
        return json.dumps(spec.to_dict(), indent=2)
    import yaml  # only for -o yaml

    text: str = yaml.safe_dump(spec.to_dict(), sort_keys=False)
    return text.rstrip("\n")


@click.group(name="cdi")
def command() -> None:
    """CDI (Container Device Interface) specs for this node's devices."""


@command.command("generate")
@click.option(
    "--device",
    "device_names",
    multiple=True,
    metavar="NAME",
    help="A device to include (repeatable) [default: all]",
)
@click.option(
    "-o", "--output", type=click.Choice(["json", "yaml"]), default="yaml", show_default=True
)
@click.option(
    "--driver-root",
    type=click.Path(path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Where the NVIDIA driver installation is mounted",
)
@click.option(
    "--dev-root",
    type=click.Path(path_type=Path),
    default=Path("/dev"),
    show_default=True,
    help="Where the device nodes are",
)
@click.option(
    "--hook-path",
    metavar="PATH",
    help="nvidia-cdi-hook or nvidia-ctk to use [default: found under the driver root]",
)
@click.option(
    "--class",
    "class_",
    default=DEFAULT_CLASS,
    show_default=True,
    help="CDI class; the vendor is the driver name",
)
@click.option(
    "--netdev/--no-netdev",
    default=False,
    show_default=True,
    help="Move NIC interfaces into the container (needs a CDI 1.1.0 runtime)",
)
# Hidden, and refused in one line: run's flag would otherwise be "no such option". The key in a
# config file shared with run is checked and left unused, as every option generate lacks.
@click.option("--simulate-device-nodes", "simulate_device_nodes", is_flag=True, hidden=True,
              expose_value=False, callback=_refuse_device_nodes)
@shared_options("driver_name", "sysfs_root", "simulate", "device_types", "config_file",
                "log_format", "verbosity")
def generate(
    *,
    device_names: tuple[str, ...],
    output: str,
    driver_root: Path,
    dev_root: Path,
    hook_path: str | None,
    class_: str,
    netdev: bool,
    **kwargs: Any,
) -> None:
    """Print a CDI spec for the devices of this node (all when none is named)."""
    # Lazy: discovery and the CDI machinery load when the command runs, not for its -h.
    from agent.commands.discover import discover_for_command
    from cdi.edits import EditsProvider
    from cdi.errors import CDINameError
    from cdi.names import validate_kind

    cfg = pop_config(kwargs)
    setup_logging(cfg.log_format, cfg.verbosity)
    kind = f"{cfg.driver_name}/{class_}"
    try:
        validate_kind(kind)
    except CDINameError as err:
        raise click.UsageError(str(err)) from err
    inventory = discover_for_command(cfg)
    provider = EditsProvider(
        driver_root,
        dev_root,
        simulated=bool(cfg.simulate),
        sysfs_root=cfg.sysfs_root,
        hook_path=hook_path,
    )
    devices = select_devices(inventory, device_names)
    if cfg.simulate:
        # On stderr, so that stdout stays a spec a runtime can read.
        click.echo(SIMULATED_NOTE, err=True)
    click.echo(render(generate_spec(devices, provider, kind, netdev=netdev), output))
