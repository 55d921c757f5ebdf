"""YAML/JSON documents that remember where each field came from.

Every error about user input names the file and line (``claim.yaml:14``), so the loader keeps
a map from a field's path (``("spec", "devices", "requests", 0, "name")``) to its line.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Path_ = tuple[str | int, ...]


class InputError(ValueError):
    """Input that cannot be used (bad YAML, unknown field, wrong type, bad CEL).

    ``where`` is "file:line" when the line is known, else the file or object name.
    """

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where
        self.message = message


@dataclass(frozen=True, slots=True)
class Doc:
    """One object from a file, with the line of every field (1-based)."""

    obj: dict[str, Any]
    source: str = "<input>"
    lines: Mapping[Path_, int] = field(default_factory=dict)
    base: Path_ = ()  # where ``obj`` sits inside the parsed document (List items)

    def where(self, path: Path_ = ()) -> str:
        """"file:line" of the closest known ancestor of ``path``."""
        full = self.base + tuple(path)
        while True:
            line = self.lines.get(full)
            if line is not None:
                return f"{self.source}:{line}"
            if not full:
                return self.source
            full = full[:-1]

    def error(self, path: Path_, message: str) -> InputError:
        dotted = _dotted(path)
        return InputError(self.where(path), f"{dotted}: {message}" if dotted else message)


def _dotted(path: Path_) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def from_object(obj: Mapping[str, Any], source: str = "<object>") -> Doc:
    """Wrap an in-memory dict (no line information)."""
    if not isinstance(obj, Mapping):
        raise InputError(source, f"expected an object, got {type(obj).__name__}")
    return Doc(dict(obj), source)


def load_text(text: str, source: str = "<input>") -> list[Doc]:
    """Parse every YAML document in ``text``; ``kind: *List`` documents yield their items."""
    import yaml

    try:  # the reader refuses control characters already while it is built
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as err:
        raise InputError(source, f"not valid YAML: {err}") from err
    docs: list[Doc] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: dict[Path_, int] = {}
            _index(loader, node, (), lines)
            obj = loader.construct_document(node)
            if obj is None:
                continue
            if not isinstance(obj, dict):
                raise InputError(
                    f"{source}:{node.start_mark.line + 1}",
                    f"expected an object, got {type(obj).__name__}",
                )
            items = obj.get("items")
            if str(obj.get("kind", "")).endswith("List") and isinstance(items, list):
                for i, item in enumerate(items):
                    if not isinstance(item, dict):
                        raise InputError(f"{source}", f"items[{i}]: expected an object")
                    docs.append(Doc(item, source, lines, ("items", i)))
            else:
                docs.append(Doc(obj, source, lines))
    except RecursionError:
        # The YAML composer recurses per level; no Kubernetes object nests anywhere near this.
        raise InputError(source, "nested too deeply to be a Kubernetes object") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        raise InputError(where, f"not valid YAML: {err.problem or err}") from err
    except yaml.YAMLError as err:
        raise InputError(source, f"not valid YAML: {err}") from err
    finally:
        loader.dispose()
    return docs


def decode(data: bytes, source: str) -> str:
    """UTF-8 (as kubectl takes it), or one line saying where it is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(source, f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                         f"{err.start})") from None


def load_file(path: str | Path) -> list[Doc]:
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise InputError(str(p), f"cannot read: {err.strerror or err}") from err
    return load_text(decode(data, str(p)), str(p))


def _index(loader: Any, node: Any, path: Path_, lines: dict[Path_, int]) -> None:
    import yaml

    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            sub = (*path, str(key))
            lines[sub] = key_node.start_mark.line + 1
            _index(loader, value_node, sub, lines)
            lines[sub] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index(loader, item, (*path, i), lines)


def walk(doc: Doc) -> Iterator[tuple[Path_, Any]]:
    """Every (path, value) below the object, depth first (used by tests)."""
    stack: list[tuple[Path_, Any]] = [((), doc.obj)]
    while stack:
        path, value = stack.pop()
        yield path, value
        if isinstance(value, dict):
            stack.extend(((*path, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*path, i), v) for i, v in enumerate(value))


PACKAGED_CLASSES = "deviceclasses.yaml"


def packaged_classes() -> list[Doc]:
    """The DeviceClasses the agent ships (a copy of deploy/base/deviceclasses.yaml), so that
    an install without the repository explains claims against our classes out of the box."""
    from importlib.resources import files

    return load_text(files("agent").joinpath(PACKAGED_CLASSES).read_text("utf-8"),
                     f"<packaged {PACKAGED_CLASSES}>")
