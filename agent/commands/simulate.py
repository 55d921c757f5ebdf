"""``dra-agent simulate fault``: a simulated GPU of the ``--simulate`` agent on this node
reports a fault (an Xid, a double-bit ECC error, falling off the bus) or recovers.

The request goes into the agent's inbox (``agent.simfaults``, under the plugin directory the
DaemonSet mounts, so ``kubectl exec ... -c agent -- dra-agent simulate fault gpu-3 --xid 79``
works in its container), and the command waits for the agent to take it. Exit 0: delivered;
2: bad input, no simulated agent here, or the agent refused it (its reason on the line);
1: the agent did not take it in time (it is withdrawn) or the inbox cannot be written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from agent.commands.options import pop_config, shared_options
from agent.simfaults.request import MAX_XID, FaultKind, FaultRequest, FaultRequestError
from agent.simfaults.writer import (
    Outcome,
    agent_problem,
    open_inbox,
    outcome,
    withdraw,
    write_request,
)


class BadRequestError(click.ClickException):
    """Nothing to deliver to, or a request the agent cannot deliver: exit 2, as bad input."""

    exit_code = 2


@click.group()
def command() -> None:
    """Act on the simulated hardware of the --simulate agent running on this node."""


@command.command("fault")
@click.argument("device")
@click.option("--xid", type=click.IntRange(1, MAX_XID), metavar="N",
              help="An Xid error N (79: fallen off the bus, 48: double-bit ECC, 94: "
                   "contained ECC error).")
@click.option("--ecc", is_flag=True, default=False,
              help="A double-bit (uncorrectable) ECC error.")
@click.option("--lost", is_flag=True, default=False,
              help="The GPU falls off the bus: NVML answers GPU_IS_LOST until --recover.")
@click.option("--recover", is_flag=True, default=False,
              help="The GPU answers NVML again; its taints clear once the agent's "
                   "--health-quiet-period passes.")
@click.option("--wait", "wait_s", type=click.FloatRange(0, 600), default=10.0,
              show_default=True, metavar="SECONDS",
              help="Seconds to wait for the agent to take the request (0: leave it queued).")
@shared_options("driver_name", "kubelet_dir", "config_file", "verbosity")
def fault(*, device: str, xid: int | None, ecc: bool, lost: bool, recover: bool,
          wait_s: float, **kwargs: Any) -> None:
    """Make DEVICE (a published name: gpu-3, a MIG device) of the simulated agent on this node
    report a fault; the agent's health monitor taints it as it would a real one."""
    cfg = pop_config(kwargs)
    chosen = [kind for kind, on in ((FaultKind.XID, xid is not None), (FaultKind.ECC, ecc),
                                    (FaultKind.LOST, lost), (FaultKind.RECOVER, recover)) if on]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one fault: --xid N, --ecc, --lost or --recover",
                               click.get_current_context())
    try:
        request = FaultRequest(device, chosen[0], xid)
    except FaultRequestError as err:
        raise click.UsageError(str(err), click.get_current_context()) from err
    inbox = cfg.simulated_faults_dir
    _check_inbox(inbox)
    try:
        name = write_request(inbox, request)
    except OSError as err:
        raise click.ClickException(
            f"cannot write a request into {inbox}: {err.strerror or err}") from err
    if cfg.verbosity:
        click.echo(f"request {inbox / name}", err=True)
    if wait_s == 0:
        click.echo(f"{device}: {request.describe()} queued ({inbox / name})")
        return
    state, reason = _wait(inbox, name, wait_s)
    if state is Outcome.REFUSED:
        raise BadRequestError(f"the agent refused {request.describe()} for {device}: {reason}")
    if state is Outcome.PENDING:
        raise click.ClickException(
            f"the agent did not take the request within {wait_s:g} s, so it was withdrawn: is "
            f"'dra-agent run --simulate' running with --kubelet-dir {cfg.kubelet_dir} and "
            f"--driver-name {cfg.driver_name}?")
    click.echo(f"{device}: {request.describe()} delivered")


def _check_inbox(inbox: Path) -> None:
    """A simulated agent runs here (else exit 2), and its inbox is there (made if need be)."""
    problem = agent_problem(inbox)
    if problem is not None:
        raise BadRequestError(f"no simulated agent on this node: {problem} (are --kubelet-dir "
                              "and --driver-name the agent's?)")
    try:
        open_inbox(inbox)
    except OSError as err:
        raise click.ClickException(f"cannot use the inbox {inbox}: {err.strerror or err}") \
            from err


def _wait(inbox: Path, name: str, wait_s: float) -> tuple[Outcome, str]:
    deadline = time.monotonic() + wait_s
    while True:
        state, reason = outcome(inbox, name)
        if state is not Outcome.PENDING:
            return state, reason
        if time.monotonic() >= deadline:
            if withdraw(inbox, name):
                return Outcome.PENDING, ""
            continue  # taken at the last moment: its outcome is there now
        time.sleep(0.02)

