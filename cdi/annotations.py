"""``cdi.k8s.io/`` container annotations: the pre-CRI-field way to request CDI devices.

The key is ``cdi.k8s.io/<plugin>_<deviceID>`` (a '/' in the id becomes '_'); the part after
the prefix must be at most 63 characters, start and end with a letter or digit and hold only
letters, digits, '_', '-' and '.'. The value is the comma-separated qualified names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence

from cdi.errors import CDIError
from cdi.names import parse_qualified_name

ANNOTATION_PREFIX = "cdi.k8s.io/"
MAX_KEY_NAME_LEN = 63
_KEY_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


def _key_name(plugin_name: str, device_id: str) -> str:
    name = f"{plugin_name}_{device_id.replace('/', '_')}"
    if len(name) <= MAX_KEY_NAME_LEN and _KEY_NAME_RE.fullmatch(name):
        return name
    # The upstream helper fails here (a driver name over 26 characters plus a claim UID broke
    # the 1.26-1.30 kubelet). The key is free-form to runtimes, so instead we keep the device
    # id readable and replace the plugin part by a prefix of it plus a digest: still unique,
    # still deterministic.
    digest = hashlib.sha256(f"{plugin_name}\0{device_id}".encode()).hexdigest()[:10]
    ident = _BAD_CHARS.sub("_", device_id.replace("/", "_")).strip("_.-")
    plugin = _BAD_CHARS.sub("-", plugin_name).strip("_.-")
    room = MAX_KEY_NAME_LEN - len(digest) - 2 - len(ident)
    if room < 0:
        ident, room = "", MAX_KEY_NAME_LEN - len(digest) - 1
    head = plugin[: max(room, 0)].rstrip("_.-")
    parts = [p for p in (head, digest, ident) if p]
    return "_".join(parts)


def annotations_for(
    plugin_name: str, device_id: str, qualified_names: Sequence[str]
) -> dict[str, str]:
    """One annotation requesting ``qualified_names`` (e.g. all CDI devices of one claim)."""
    if not plugin_name:
        raise CDIError("CDI annotation: empty plugin name")
    if not device_id:
        raise CDIError("CDI annotation: empty device id")
    if not qualified_names:
        raise CDIError("CDI annotation: no devices")
    for name in qualified_names:
        parse_qualified_name(name)
    return {ANNOTATION_PREFIX + _key_name(plugin_name, device_id): ",".join(qualified_names)}


def parse_annotations(annotations: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The CDI keys and requested devices in ``annotations``, as a runtime reads them.

    Keys without the prefix are ignored; one bad device name rejects them all, as runtimes do.
    Both lists are sorted so the result does not depend on the mapping's order.
    """
    keys: list[str] = []
    devices: list[str] = []
    for key, value in annotations.items():
        if not key.startswith(ANNOTATION_PREFIX):
            continue
        for item in value.split(","):
            parse_qualified_name(item)
            devices.append(item)
        keys.append(key)
    return sorted(keys), sorted(devices)
