"""A mutation fuzzer for every parser the outside world reaches, fast enough for tens of
thousands of cases per CI run.

Each target starts from valid seed documents (a claim, an opaque config, a checkpoint, one of
our CDI specs, a kubeconfig), applies one to three random mutations (a field deleted, replaced
by a hostile value or by one of another type, a key renamed, an entry duplicated, bytes
flipped, cut or spliced) and checks the parser's contract on the result:

* the answer is a usable value, or the parser's own error with a one-line message;
* no other exception, no hang, no secret in any message;
* whatever is accepted can be written (checkpoint, CDI spec) and read back.

It runs in its own process (``python -m tests.fuzz.mutate --seed S --cases N``) so that its
peak RSS is the parsers' own, and prints one JSON summary line; ``test_mutation.py`` runs it
and checks the summary. A failure names the target, seed and case index: rerunning with the
same seed replays it exactly.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import random
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.checkpoint.codec import CheckpointCorruptError, checksum, decode, encode, salvage
from agent.checkpoint.model import CheckpointData, ClaimRecord, ClaimState, PreparedDevice
from agent.claim.identity import uid_problem
from agent.claim.model import ClaimError, ClaimRef
from agent.claim.opaque import ConfigDecodeError, env_denied, merge_configs
from agent.claim.parse import parse_claim
from agent.kube.credentials import CredentialsError
from agent.kube.kubeconfig import load_kubeconfig
from agent.prepare.cdispecs import CDIClaimSpecs, EnvOnlyEdits

DRIVER = "dra-agent.io"
NODE = "fuzz-node"
#: Planted in every credential field of the kubeconfig seeds; no message may contain it.
SECRET = "s3cr3t-T0KEN-never-echoed"
ENV_NAME_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _deep_list(depth: int) -> Any:
    out: Any = 0
    for _ in range(depth):
        out = [out]
    return out


def _deep_dict(depth: int) -> Any:
    out: Any = "x"
    for _ in range(depth):
        out = {"a": out}
    return out


#: Values that have broken a parser somewhere: surrogates, NUL, controls, huge and deep values,
#: wrong types, path tricks, booleans as strings.
HOSTILE: tuple[Any, ...] = (
    "\ud800", "a\udfffb", "\x00", "x\x00y", "", " ", "\n", "a\nb", "\u202e", "\x1b[2J",
    "../../etc/passwd", "/abs", "a" * 300, "a" * 70_000, "ünïcödé", "%s%n", "${HOME}",
    "false", "true", "0", "-1", "null", "1e999", "gpu-0", "dra-agent.io", "NVIDIA_VISIBLE_DEVICES",
    "LD_PRELOAD", "DRA_AGENT_CLAIM_UID",
    0, -1, 1, 2**63, 2**64 + 1, -(2**70), 1.5, float("inf"), True, False, None,
    [], {}, [None], {"": None}, {"\ud800": 1}, ["\x00"], [[[]]],
    {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "DeviceConfig", "env": {"A": "\ud800"}},
)
#: Nesting past the JSON encoder's recursion limit, and just past the claims' own limit. Never
#: mutated in place (a mutation stops 3 hits and 500 slots in, far from their leaves), so they
#: are shared, not copied.
DEEP: tuple[Any, ...] = (_deep_list(5_000), _deep_dict(5_000), _deep_list(70), _deep_dict(70))


def hostile(rng: random.Random) -> Any:
    if rng.random() < 0.08:
        return rng.choice(DEEP)
    # Copied: a later mutation of the case must never change the pool for the cases after it.
    return copy.deepcopy(rng.choice(HOSTILE))


def _slots(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in ``doc`` a mutation may strike, without recursion."""
    out: list[tuple[Any, Any]] = []
    stack = [doc]
    while stack and len(out) < 500:
        item = stack.pop()
        if isinstance(item, dict):
            for key in list(item):
                out.append((item, key))
                stack.append(item[key])
        elif isinstance(item, list):
            for i in range(min(len(item), 20)):
                out.append((item, i))
                stack.append(item[i])
    return out


def mutate(rng: random.Random, seed_doc: Any) -> Any:
    doc = copy.deepcopy(seed_doc)
    for _ in range(rng.randint(1, 3)):
        slots = _slots(doc)
        if not slots:
            return hostile(rng)
        parent, key = rng.choice(slots)
        action = rng.random()
        if action < 0.2:
            del parent[key]
        elif action < 0.7:
            parent[key] = hostile(rng)
        elif action < 0.8 and isinstance(parent, dict):
            parent[rng.choice([k for k in HOSTILE if isinstance(k, str)])] = parent.pop(key)
        elif action < 0.9 and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[key]))
        else:
            # Another type in the same place: a list for an object, a string for a list...
            value = parent[key]
            parent[key] = [value] if not isinstance(value, list) else {"0": value}
    return doc


def mutate_bytes(rng: random.Random, raw: bytes) -> bytes:
    data = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        at = rng.randrange(len(data) + 1)
        if op < 0.3 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif op < 0.5:
            del data[at:at + rng.randint(1, 16)]
        elif op < 0.8:
            data[at:at] = rng.choice([b"\\ud800", b"\x00", b"\xff\xfe", b'"', b"[" * 3000,
                                      b"{", b"}", b",", b"\\u0000", b"\n", b"- ", b": "])
        else:
            data = data[:at]
    return bytes(data)


def one_line(err: BaseException) -> str:
    text = str(err)
    if not text or "\n" in text or "Traceback" in text:
        raise AssertionError(f"not a one-line message: {text[:300]!r}")
    return text


def writable(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except (UnicodeEncodeError, TypeError, ValueError, RecursionError):
        return False
    return True


# --- seeds --------------------------------------------------------------------------------------

def claim_seeds() -> list[dict[str, Any]]:
    def claim(results: list[dict[str, Any]], config: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": "default", "name": "claim", "uid": str(uuid.UUID(int=7))},
            "spec": {"devices": {"requests": [{"name": "gpu"}]}},
            "status": {"allocation": {"devices": {"results": results, "config": config}},
                       "reservedFor": [{"resource": "pods", "name": "p", "uid": "p-uid"}]},
        }

    gpu = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    nic = {"request": "nic", "driver": DRIVER, "pool": NODE, "device": "nic-0"}
    ours = {"source": "FromClaim", "requests": ["nic"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "DeviceConfig",
        "env": {"NCCL_DEBUG": "INFO"}, "netdev": {"move": True, "interfaceName": "net1"}}}}
    return [
        claim([gpu], []),
        claim([gpu, nic], [ours]),
        claim([{**gpu, "request": "gpu/h100", "adminAccess": True}], []),
        claim([{**gpu, "shareID": str(uuid.UUID(int=9))}, {**gpu, "device": "gpu-1"}],
              [{**ours, "source": "FromClass", "requests": []}]),
    ]


def opaque_seeds() -> list[dict[str, Any]]:
    return [
        {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "DeviceConfig",
         "env": {"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"}},
        {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "DeviceConfig",
         "netdev": {"move": True, "interfaceName": "net1"}},
        {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "DeviceConfig", "denyEnv": ["FOO_*"]},
    ]


def checkpoint_seed() -> dict[str, Any]:
    records = {
        str(uuid.UUID(int=i)): ClaimRecord(
            uid=str(uuid.UUID(int=i)), namespace="default", name=f"c{i}",
            state=ClaimState.PREPARE_COMPLETED if i % 2 else ClaimState.PREPARE_STARTED,
            devices=(PreparedDevice(pool=NODE, device=f"gpu-{i}", requests=("gpu",),
                                    cdi_ids=(f"k8s.{DRIVER}/claim={i}-gpu-{i}",),
                                    admin_access=i == 3),),
            allocation={"results": [{"device": f"gpu-{i}"}], "config": []},
            updated="2026-12-01T00:00:00Z", boot_id="boot")
        for i in range(1, 4)
    }
    doc: dict[str, Any] = json.loads(encode(CheckpointData(claims=records)))
    return doc


def cdi_seed(uid: str) -> dict[str, Any]:
    return {"cdiVersion": "0.6.0", "kind": f"k8s.{DRIVER}/claim",
            "devices": [{"name": f"{uid}-gpu-0", "containerEdits": {"env": ["A=1"]}},
                        {"name": f"{uid}-nic-0", "containerEdits": {}}],
            "containerEdits": {"env": ["DRA_AGENT_CLAIM_UID=" + uid]}}


def kubeconfig_seeds() -> list[dict[str, Any]]:
    base: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443",
                                               "certificate-authority-data": "bm90IGEgY2VydA=="}}],
        "users": [{"name": "u", "user": {"token": SECRET}}],
    }
    basic = copy.deepcopy(base)
    basic["users"][0]["user"] = {"username": "admin", "password": SECRET}
    insecure = copy.deepcopy(base)
    insecure["clusters"][0]["cluster"] = {"server": "https://k:6443",
                                          "insecure-skip-tls-verify": True,
                                          "proxy-url": f"http://user:{SECRET}@proxy:3128"}
    files = copy.deepcopy(base)
    files["users"][0]["user"] = {"tokenFile": "/nonexistent/token", "token": SECRET,
                                 "client-key-data": "a2V5"}
    return [base, basic, insecure, files]


# --- targets ------------------------------------------------------------------------------------

@dataclass
class Fuzz:
    rng: random.Random
    workdir: Path
    cases: dict[str, int] = field(default_factory=dict)

    def claims(self) -> None:
        obj = mutate(self.rng, self.rng.choice(claim_seeds()))
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        uid = meta.get("uid") if isinstance(meta, dict) else None
        # As the plugin calls it: with the reference the kubelet sent, already checked.
        expected = ClaimRef("default", "claim", uid if isinstance(uid, str) and
                            uid_problem(uid) is None else str(uuid.UUID(int=7)))
        try:
            claim = parse_claim(obj, expected=expected)
        except ClaimError as err:
            one_line(err)
            return
        assert writable([claim.ref.namespace, claim.ref.name]), claim.ref
        for result in claim.results:
            assert writable([result.request, result.driver, result.pool, result.device]), result
        for config in claim.configs:
            assert writable(config.parameters), "accepted opaque parameters that cannot be written"

    def opaque(self) -> None:
        claim_params = [mutate(self.rng, self.rng.choice(opaque_seeds()))
                        for _ in range(self.rng.randint(1, 2))]
        class_params = [mutate(self.rng, self.rng.choice(opaque_seeds()))
                        for _ in range(self.rng.randint(0, 1))]
        try:
            config = merge_configs(claim_params, class_params=class_params)
        except ConfigDecodeError as err:
            one_line(err)
            return
        for name, value in config.env.items():
            assert name and set(name) <= ENV_NAME_CHARS and not name[0].isdigit(), name
            assert env_denied(name, config.deny_env) is None, name
            assert writable([name, value])
        assert writable(config.pod_interface_name)

    def checkpoint(self) -> None:
        if self.rng.random() < 0.6:
            doc = mutate(self.rng, checkpoint_seed())
            if isinstance(doc, dict) and self.rng.random() < 0.7:
                # A valid checksum takes the garbage past the first check, to the records.
                with contextlib.suppress(UnicodeEncodeError, RecursionError, ValueError):
                    doc["checksum"] = checksum(doc)
            try:
                raw = json.dumps(doc).encode()
            except (RecursionError, ValueError):
                raw = b"[" * 200_000
        else:
            raw = mutate_bytes(self.rng, encode(CheckpointData(claims={})) if
                               self.rng.random() < 0.2 else json.dumps(checkpoint_seed()).encode())
        try:
            data = decode(raw, "checkpoint.json")
        except CheckpointCorruptError as err:
            one_line(err)
        else:
            for uid, record in data.claims.items():
                assert uid_problem(uid) is None and record.uid == uid, uid
            assert decode(encode(data)).claims == data.claims
        for uid in salvage(raw):
            assert uid_problem(uid) is None, uid

    def cdi(self) -> None:
        cdi_dir = self.workdir / "cdi"
        bystander = self.workdir / "bystander"
        cdi_dir.mkdir(exist_ok=True)
        bystander.mkdir(exist_ok=True)
        (bystander / "keep").write_text("keep")
        uid = str(uuid.UUID(int=self.rng.getrandbits(128)))
        specs = CDIClaimSpecs(cdi_dir, DRIVER, EnvOnlyEdits())
        seed = cdi_seed(uid)
        body = (json.dumps(mutate(self.rng, seed), default=str).encode()
                if self.rng.random() < 0.6 else mutate_bytes(self.rng, json.dumps(seed).encode()))
        specs.path(uid).write_bytes(body)
        try:
            found = specs.claim_devices()
        finally:
            for entry in cdi_dir.iterdir():
                entry.unlink()
        assert set(found) == {uid}, found
        for name in found[uid]:
            assert name and writable(name) and "\x00" not in name, name
        assert [p.name for p in bystander.iterdir()] == ["keep"]

    def kubeconfig(self) -> None:
        doc = mutate(self.rng, self.rng.choice(kubeconfig_seeds()))
        path = self.workdir / "kubeconfig"
        form = self.rng.random()
        if form < 0.4:
            body = json.dumps(doc, default=str).encode("utf-8", "surrogatepass")
        else:
            try:
                body = yaml.safe_dump(doc).encode("utf-8", "surrogatepass")
            except (yaml.YAMLError, RecursionError):
                body = b"{" * 5000
            if form > 0.8:
                body = mutate_bytes(self.rng, body)
        path.write_bytes(body)
        try:
            creds = load_kubeconfig(path)
        except CredentialsError as err:
            assert SECRET not in one_line(err), "a secret in the error text"
            return
        assert SECRET not in repr(creds)
        assert isinstance(creds.server, str) and creds.server.startswith(("https://", "http://"))


TARGETS: dict[str, Callable[[Fuzz], None]] = {
    "claims": Fuzz.claims,
    "opaque configs": Fuzz.opaque,
    "checkpoint files": Fuzz.checkpoint,
    "CDI spec files": Fuzz.cdi,
    "kubeconfigs": Fuzz.kubeconfig,
}


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(seed: int, cases: int) -> dict[str, Any]:
    # The parsers log what they refuse; thousands of those lines say nothing here.
    logging.disable(logging.CRITICAL)
    started = time.monotonic()
    failures: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        for name, target in TARGETS.items():
            rng = random.Random(f"{seed}/{name}")
            fuzz = Fuzz(rng, Path(tmp))
            counts[name] = 0
            for index in range(cases):
                counts[name] += 1
                try:
                    target(fuzz)
                except Exception as err:  # the contract was broken: record, keep going
                    if len(failures) < 10:
                        failures.append({
                            "target": name, "seed": seed, "index": index,
                            "error": f"{type(err).__name__}: {str(err)[:300]}",
                            "where": traceback.format_exc(limit=-3)[-600:],
                        })
    return {"seed": seed, "cases": counts, "total": sum(counts.values()),
            "failures": failures, "peak_rss_mib": round(peak_rss_mib(), 1),
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=2500, help="cases per target")
    args = parser.parse_args(argv)
    summary = run(args.seed, args.cases)
    print(json.dumps(summary))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
