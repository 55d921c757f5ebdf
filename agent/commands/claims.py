"""``dra-agent claims``: the claims prepared on this node, from the checkpoint.

Read-only: a corrupt checkpoint is reported, never moved aside (that is the agent's job). A
record the agent could not read (``agent.checkpoint.unreadable``) is shown as ``Unreadable``
with why; its devices stay taken until the kubelet unprepares that claim, or ``--forget UID``
drops it: the one change this command makes, under the checkpoint's locks, and only to such a
record (a readable one is the kubelet's to unprepare).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from agent.checkpoint.codec import CheckpointCorruptError, decode
from agent.checkpoint.model import ClaimRecord, PreparedDevice
from agent.checkpoint.store import MAX_CHECKPOINT_BYTES, CheckpointStore, CheckpointWriteError
from agent.commands.options import pop_config, shared_options
from agent.common.metrics import label_value
from agent.common.safefile import UnsafeFileError, read_capped


def load_records(path: Path) -> list[ClaimRecord]:
    """The records of the checkpoint at ``path``, sorted by namespace/name; [] if absent."""
    try:
        # As the agent reads it: a FIFO, a symlink or a file over the cap planted at the
        # checkpoint's name is refused at once instead of hanging or exhausting this command.
        raw = read_capped(path, MAX_CHECKPOINT_BYTES)
    except FileNotFoundError:
        return []
    except UnsafeFileError as err:
        raise CheckpointCorruptError(str(path), err.reason) from err
    data = decode(raw, str(path))
    return sorted(data.claims.values(), key=lambda r: (r.namespace, r.name, r.uid))


def _state(record: ClaimRecord) -> str:
    if record.unreadable is not None:
        return "Unreadable"
    return record.state.value + (" (recovered)" if record.recovered else "")


def unreadable_notes(records: list[ClaimRecord]) -> list[str]:
    """One line per record the agent cannot read: why, and how its devices are freed."""
    return [f"claim {r.uid}: its record cannot be read ({label_value(r.unreadable)}); its "
            "devices stay taken until the kubelet unprepares it, or: dra-agent claims "
            f"--forget {r.uid}" for r in records if r.unreadable is not None]


def forget_unreadable(path: Path, uid: str) -> ClaimRecord:
    """Drop the unreadable record of claim ``uid`` from the checkpoint at ``path`` (under
    the agent's locks: it may be running) and return it; a ``click.ClickException`` when
    there is none, or when the record is readable."""
    found = {r.uid: r for r in load_records(path)}.get(uid)
    if found is None:
        raise click.ClickException(f"no record of claim {uid!a} in {path}")
    if found.unreadable is None:
        raise click.ClickException(
            f"the record of claim {uid} is readable: the kubelet unprepares it when the pods "
            "using that claim are gone (forgetting it would free devices still in use)")

    def drop(claims: dict[str, ClaimRecord]) -> None:
        if claims.get(uid) is not None and claims[uid].unreadable is not None:
            del claims[uid]

    try:
        CheckpointStore(path).update(drop)
    except CheckpointWriteError as err:
        raise click.ClickException(str(err)) from err
    return found


def render_table(records: list[ClaimRecord]) -> str:
    header = ("NAMESPACE", "NAME", "UID", "STATE", "DEVICES", "UPDATED")
    rows = [header] + [
        (
            r.namespace or "-",
            r.name or "-",
            r.uid,
            _state(r),
            ",".join(d.device for d in r.devices) or "-",
            r.updated or "-",
        )
        for r in records
    ]
    return _columns(rows)


def render_wide(records: list[ClaimRecord]) -> str:
    """One row per prepared device with its hardware identity, the rows of
    ``dra_agent_claim_device_info``; a claim without devices gets one row of dashes."""
    header = ("NAMESPACE", "NAME", "UID", "STATE", "POOL", "DEVICE", "UUID", "PCI", "IFNAME",
              "SHARE", "UPDATED")
    rows: list[tuple[str, ...]] = [header]
    for r in records:
        claim = (r.namespace or "-", r.name or "-", r.uid, _state(r))
        # Checkpoint strings are printed to a terminal: no escape sequence or newline passes.
        devices = [
            tuple(label_value(v) if v else "-"
                  for v in (d.pool, d.device, d.uuid, d.pci_address, d.if_name, _share(d)))
            for d in r.devices
        ] or [("-",) * 6]
        rows += [(*claim, *device, r.updated or "-") for device in devices]
    return _columns(rows)


def _share(device: PreparedDevice) -> str:
    """A share's ID and what it holds (``<shareID> shares=2``); empty for a whole device."""
    if not device.share_id:
        return ""
    held = " ".join(f"{k}={v}" for k, v in sorted(device.consumed.items()) if v != "0")
    return f"{device.share_id} {held}".strip()


def _columns(rows: Sequence[tuple[str, ...]]) -> str:
    header = rows[0]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


@click.command()
@click.option(
    "-o", "--output", type=click.Choice(["table", "wide", "json", "yaml"]), default="table",
    show_default=True,
)
@click.option(
    "--forget", metavar="UID", default=None,
    help="Drop the record of claim UID that the agent cannot read (shown as Unreadable): "
         "its devices become free; nothing on the host is undone.",
)
@shared_options("driver_name", "kubelet_dir", "config_file", "verbosity")
def command(output: str, forget: str | None, **kwargs: Any) -> None:
    """Show the claims prepared on this node (from the plugin's checkpoint)."""
    cfg = pop_config(kwargs)
    path = cfg.checkpoint_path
    try:
        if forget is not None:
            gone = forget_unreadable(path, forget)
            devices = ",".join(f"{d.pool}/{d.device}" for d in gone.devices) or "none"
            click.echo(f"forgot the unreadable record of claim {gone.uid}; devices free "
                       f"again: {devices}")
            return
        records = load_records(path)
    except CheckpointCorruptError as err:
        raise click.ClickException(f"{err}; the agent sets it aside on its next start") from err
    except OSError as err:
        raise click.ClickException(f"cannot read {path}: {err.strerror or err}") from err
    if output in ("table", "wide"):
        render = render_wide if output == "wide" else render_table
        click.echo(render(records) if records else f"no prepared claims ({path})")
        for note in unreadable_notes(records):
            click.echo(note)
        return
    docs = [r.to_json() for r in records]
    if output == "json":
        click.echo(json.dumps(docs, indent=2, sort_keys=True))
    else:
        import yaml  # only for -o yaml

        click.echo(yaml.safe_dump(docs, sort_keys=True), nl=False)
