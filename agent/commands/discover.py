"""``dra-agent discover``: what this node would publish, before anything is published.

Default output is a table; ``-o json|yaml`` prints the ResourceSlice objects the controller
would create (resource.k8s.io/v1), ``--topology`` a NUMA -> PCIe root -> switch tree.
Warnings about unavailable sources go to stderr and keep exit code 0; the exit code is 1
only when nothing at all could be read.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from agent.commands.options import pop_config, shared_options
from agent.common.config import Config
from agent.common.logs import setup_logging

if TYPE_CHECKING:
    from discovery.model import Inventory


def discover_for_command(cfg: Config) -> Inventory:
    """``run_discovery`` for a command: a bad profile is a usage error (exit 2), and the
    sources that could not be read are warned about on stderr."""
    # Lazy: the scanners (a tenth of a second) load when the command runs, not for its -h.
    from agent.inventory import run_discovery
    from discovery.simulate import ProfileError

    try:
        inventory = run_discovery(cfg)
    except ProfileError as err:
        raise click.UsageError(str(err)) from err
    for warning in inventory.warnings:
        click.echo(f"warning: {warning}", err=True)
    return inventory


@click.command()
@click.option("-o", "--output", type=click.Choice(["table", "wide", "json", "yaml"]),
              default="table", show_default=True)
@click.option("--topology", is_flag=True, help="Show a NUMA -> PCIe root -> switch tree.")
@shared_options("driver_name", "node_name", "sysfs_root", "simulate", "device_types",
                "numa_node_attribute", "sharing", "mig", "vfs", "vf_bandwidth", "gpu_passthrough",
                "config_file",
                "log_format", "verbosity")
def command(output: str, topology: bool, **kwargs: Any) -> None:
    """Show the devices this node would publish (nothing is published)."""
    # Lazy, as above: what the command runs loads when it runs, not for its -h.
    from agent.inventory import slice_objects
    from discovery.pools import build_resources
    from discovery.report import table
    from discovery.report import topology as topology_view
    from discovery.scan import SYSFS_UNREADABLE

    if topology and output != "table":
        # The tree is text only; printing it for -o json would break the reader expecting data.
        raise click.UsageError(f"--topology prints a text tree; it cannot be combined with "
                               f"-o {output}")
    cfg = pop_config(kwargs)
    setup_logging(cfg.log_format, cfg.verbosity)
    # No API server to ask: the scalar, which every server takes, unless told otherwise.
    inventory = discover_for_command(cfg).in_form(cfg.numa_node_attribute == "list")
    if topology:
        click.echo(topology_view(inventory, cfg.node_name))
    elif output in ("json", "yaml"):
        resources = build_resources(inventory, cfg.node_name).in_form(True)  # form chosen above
        listing = {"apiVersion": "v1", "kind": "List",
                   "items": slice_objects(resources, cfg.driver_name, cfg.node_name)}
        if output == "json":
            click.echo(json.dumps(listing, indent=2))
        else:
            import yaml  # only for -o yaml

            click.echo(yaml.safe_dump(listing, sort_keys=False), nl=False)
    else:
        click.echo(table(inventory, wide=output == "wide"))
    nothing = not inventory.devices and not inventory.reserved and any(
        w.startswith(SYSFS_UNREADABLE) for w in inventory.warnings)
    if nothing:
        raise SystemExit(1)
