"""``dra-agent explain``: would this claim fit on this node, and why not.

Thin: read the files (or discovery, or the cluster), call ``agent.explain.explain``, render.
Exit 0 fits, 1 does not fit, 2 bad input (a message pointing at the file and line).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from agent.config import common_options, pop_config


@click.command()
@click.option("-f", "--filename", "claim_file", required=True, type=click.Path(dir_okay=False),
              help="ResourceClaim (or ResourceClaimTemplate) YAML/JSON; '-' for stdin.")
@click.option("--class", "class_files", multiple=True, type=click.Path(dir_okay=False),
              help="DeviceClass file(s); several classes per file are fine. "
                   "With --slices from-cluster the cluster's classes are used by default.")
@click.option("--slices", "slices_from", default="from-discovery", show_default=True,
              help="from-cluster, from-discovery (this node, or --simulate PROFILE) or a FILE.")
@click.option("--allocated", "allocated_files", multiple=True,
              type=click.Path(dir_okay=False),
              help="Claims already allocated (their status.allocation holds devices).")
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table",
              show_default=True)
@common_options
def command(claim_file: str, class_files: tuple[str, ...], slices_from: str,
            allocated_files: tuple[str, ...], output: str, **kwargs: Any) -> None:
    """Replay the scheduler's device allocation for one claim on this node."""
    from agent.explain.docs import Doc, InputError, load_file, load_text
    from agent.explain.render import to_json, to_table, to_yaml

    cfg = pop_config(kwargs)
    try:
        if claim_file == "-":
            claims = load_text(sys.stdin.read(), "<stdin>")
        else:
            claims = load_file(claim_file)
        if len(claims) != 1:
            raise InputError(claim_file, f"expected one claim, found {len(claims)} objects")
        classes: list[Doc | dict[str, Any]] = [d for f in class_files for d in load_file(f)]
        allocated: list[Doc | dict[str, Any]] = [d for f in allocated_files for d in load_file(f)]
        slices: list[Doc | dict[str, Any]]
        if slices_from == "from-cluster":
            from agent.explain.sources import Cluster

            cluster = Cluster(cfg)
            slices = list(cluster.slices())
            if not class_files:
                classes = list(cluster.classes())
            if not allocated_files:
                allocated = list(cluster.allocated_claims())
        elif slices_from == "from-discovery":
            from agent.explain.sources import slices_from_discovery

            slices = list(slices_from_discovery(cfg))
        else:
            slices = list(load_file(slices_from))
        from agent.explain.api import explain

        result = explain(claims[0], classes, slices, cfg.node_name, allocated)
    except InputError as err:
        click.echo(f"error: {err}", err=True)
        raise SystemExit(2) from None
    text = to_json(result) if output == "json" else (
        to_yaml(result) if output == "yaml" else to_table(result))
    click.echo(text)
    raise SystemExit(0 if result.fits else 1)
