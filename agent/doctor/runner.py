"""Run every check in order; one that raises is a warning naming the error, never a crash."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agent.doctor import api, conflicts, hardware, kubelet, runtime, selfcheck
from agent.doctor.context import Context
from agent.doctor.host import HostFileError, one_line
from agent.doctor.model import Check, Status, warn

CheckFunc = Callable[[Context], Check]

#: (area, name, check) in the order the report shows them: what stops every pod first.
CHECKS: tuple[tuple[str, str, CheckFunc], ...] = (
    ("runtime", runtime.NAME, runtime.check_runtime),
    ("runtime", runtime.CDI, runtime.check_cdi_enabled),
    ("runtime", runtime.CDI_DIRS, runtime.check_cdi_dirs),
    ("kubelet", kubelet.KUBELET_DIR, kubelet.check_kubelet_dir),
    ("kubelet", kubelet.GATES, kubelet.check_gates),
    ("kubelet", kubelet.VERSION, kubelet.check_version),
    ("kubelet", kubelet.REGISTRATION, kubelet.check_registration),
    ("api", api.REACHABLE, api.check_reachable),
    ("api", api.VERSIONS, api.check_versions),
    ("api", api.SLICES, api.check_slices),
    ("api", api.CLASSES, api.check_classes),
    ("api", api.RBAC, api.check_rbac),
    ("conflicts", conflicts.DEVICE_PLUGINS, conflicts.check_device_plugins),
    ("conflicts", conflicts.CAPACITY, conflicts.check_capacity),
    ("hardware", hardware.NVML, hardware.check_nvml),
    ("hardware", hardware.TOOLKIT_MODE, hardware.check_toolkit_mode),
    ("hardware", hardware.TOOLKIT_ENVVAR, hardware.check_toolkit_envvar),
    ("hardware", hardware.IOMMU, hardware.check_iommu),
    ("hardware", hardware.RDMA_NETNS, hardware.check_rdma_netns),
    ("hardware", hardware.SRIOV, hardware.check_sriov),
    ("agent", selfcheck.CHECKPOINT, selfcheck.check_checkpoint),
    ("agent", selfcheck.SPECS, selfcheck.check_specs),
    ("agent", selfcheck.HEALTH, selfcheck.check_health),
)


def run_one(ctx: Context, name: str, func: CheckFunc) -> Check:
    try:
        return func(ctx)
    except HostFileError as err:
        # A host file (or a link on the way to it) that cannot be read: the host's problem,
        # named in its one line, wherever in the check it came up.
        return warn(name, one_line(str(err)), "fix the file or the link it names on the host")
    except Exception as err:  # a check's bug must not hide the other checks' answers
        return warn(name, f"the check itself failed: {type(err).__name__}: {one_line(str(err))}",
                    "a bug in dra-agent doctor: report it with this line")


def run_checks(ctx: Context,
               checks: Sequence[tuple[str, str, CheckFunc]] = CHECKS) -> list[Check]:
    return [run_one(ctx, name, func) for _, name, func in checks]


def exit_code(checks: Sequence[Check]) -> int:
    """0 when nothing fails (warnings included), 1 otherwise."""
    return 1 if any(c.status is Status.FAIL for c in checks) else 0
