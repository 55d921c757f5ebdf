"""The agent itself: its checkpoint, the CDI specs the checkpoint promises, its health endpoint.

The checkpoint is read, never written: ``CheckpointStore`` would set a corrupt file aside and
create its lock file, which a diagnosis must not do (and cannot, on a read-only host root).
"""

from __future__ import annotations

import socket
from pathlib import PurePosixPath

from agent.doctor.context import Context
from agent.doctor.host import HostFileError, one_line
from agent.doctor.model import Check, fail, ok, skipped, warn

CHECKPOINT, SPECS, HEALTH = "agent checkpoint", "agent CDI specs", "agent health"
#: How long the health endpoint may take: the agent answers in milliseconds when it is alive.
HEALTH_TIMEOUT_S = 1.0


def _records(ctx: Context) -> tuple[dict[str, object] | None, str]:
    """(records by claim UID, "") or (None, why); ({}, "") when there is no checkpoint yet."""
    from agent.checkpoint.codec import CheckpointCorruptError, decode
    from agent.checkpoint.store import MAX_CHECKPOINT_BYTES

    path = f"{ctx.options.plugin_dir}/checkpoint.json"
    try:
        raw = ctx.host.read_bytes(path, MAX_CHECKPOINT_BYTES)
        return dict(decode(raw, path).claims), ""
    except FileNotFoundError:
        return {}, ""
    except (HostFileError, CheckpointCorruptError) as err:
        return None, one_line(str(err))


def check_checkpoint(ctx: Context) -> Check:
    path = f"{ctx.options.plugin_dir}/checkpoint.json"
    if not ctx.host.is_dir(str(ctx.options.kubelet_dir)):
        return skipped(CHECKPOINT, f"{ctx.options.kubelet_dir} does not exist (see kubelet dir)")
    records, why = _records(ctx)
    if records is None:
        return warn(CHECKPOINT, why, "the agent sets a corrupt checkpoint aside at start "
                    "(.corrupt-<time>) and keeps what parses: restart it and read its log")
    if not ctx.host.exists(path):
        return ok(CHECKPOINT, f"{path} not written yet: no claim prepared on this node")
    return ok(CHECKPOINT, f"{path}: {len(records)} claim record(s)")


def check_specs(ctx: Context) -> Check:
    from agent.checkpoint.model import ClaimRecord, ClaimState

    records, why = _records(ctx)
    if records is None:
        return skipped(SPECS, f"checkpoint unreadable ({why})")
    done = [r for r in records.values()
            if isinstance(r, ClaimRecord) and r.state == ClaimState.PREPARE_COMPLETED]
    if not done:
        return skipped(SPECS, "no completed claim in the checkpoint")
    cdi = ctx.options.cdi_dir
    missing: list[str] = []
    for record in done:
        # The record names the file as the agent saw it; only its name is trusted here, in
        # the CDI dir the runtime reads.
        name = PurePosixPath(record.spec_path).name or \
            f"k8s.{ctx.options.driver_name}-claim_{record.uid}.json"
        if not ctx.host.exists(cdi / name):
            missing.append(f"{record.namespace}/{record.name}")
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return fail(SPECS, f"{len(missing)} of {len(done)} prepared claim(s) have no CDI spec in "
                    f"{cdi}: {', '.join(missing[:3])}{more}",
                    "restart the agent: its start-up recovery writes the spec of every "
                    "prepared claim again")
    return ok(SPECS, f"{len(done)} prepared claim(s), each with its CDI spec in {cdi}")


def _probe(host: str, port: int, timeout_s: float) -> tuple[int, str]:
    """(HTTP status, first line of the body) of GET /readyz."""
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(f"GET /readyz HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        data = b""
        while len(data) < 8192:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    head, _, body = data.decode("latin-1").partition("\r\n\r\n")
    parts = head.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {one_line(head[:60])!r}")
    bad = [line for line in body.splitlines() if line.startswith("[-]")]
    lines = body.strip().splitlines()
    return int(parts[1]), bad[0] if bad else (lines[-1] if lines else "")


def check_health(ctx: Context, timeout_s: float = HEALTH_TIMEOUT_S) -> Check:
    from agent.httpserver import HealthServerError, parse_address

    address = ctx.options.metrics_address
    if not address or address == "none":
        return skipped(HEALTH, "no metrics/health address configured (--metrics-address none)")
    if ctx.simulated:
        return skipped(HEALTH, f"simulated node {ctx.simulated}: no agent process to ask")
    try:
        host, port = parse_address(address)
    except HealthServerError as err:
        return warn(HEALTH, str(err), "give --metrics-address as host:port, as the agent has it")
    # An agent listening on every interface answers on loopback too.
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        status, line = _probe(host, port, timeout_s)
    except TimeoutError:
        return warn(HEALTH, f"{address}: no answer within {timeout_s:g} s",
                    "the agent is stuck or something else holds the port: read its log")
    except (OSError, ValueError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        return warn(HEALTH, f"{address}: {one_line(why)}",
                    "is the agent running, with this --metrics-address (hostNetwork)?")
    if status != 200:
        return warn(HEALTH, f"{address}/readyz answers {status}: {one_line(line)}",
                    "read the agent's log for the failing check")
    return ok(HEALTH, f"{address}/readyz answers 200")
