"""Registration as a 1.34+ kubelet does it, against real plugin sockets."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakes.kubelet import (
    HEALTH_SERVICES_135,
    HEALTH_SERVICES_137,
    DriverNotRegisteredError,
    KubeletStandIn,
    PluginCallError,
)
from tests.kubelet.plugin import FakePlugin

MakePlugin = Callable[..., FakePlugin]


def test_registration_ok(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = make_plugin().start()
    got = kubelet.wait_registered("gpu.example.com")
    assert got.driver == "gpu.example.com"
    assert got.endpoint == str(plugin.dra_socket)
    assert got.service == "v1.DRAPlugin"
    assert got.socket_path == plugin.reg_socket
    assert got.supported_versions == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    # The plugin hears the verdict before the registration is visible to tests.
    assert plugin.statuses == [(True, "")]
    assert kubelet.registered("gpu.example.com") == got
    assert kubelet.failures == []


def test_unknown_versions_are_notified_as_failure_and_retried(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = make_plugin(versions=["v9.DRAPlugin", "v1alpha1.DRAResourceHealth"]).start()
    failure = kubelet.wait_failed()
    assert failure.socket_path == plugin.reg_socket
    assert failure.notified
    assert "v9.DRAPlugin" in failure.error
    statuses = plugin.wait_status(2)  # the kubelet retries validation failures with back-off
    assert all(ok is False and "supported versions" in err for ok, err in statuses)
    assert kubelet.registrations == []


def test_empty_version_list_fails(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = make_plugin(versions=[]).start()
    assert kubelet.wait_failed().notified
    assert plugin.wait_status()[0][0] is False


def test_wrong_type_rejected(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = make_plugin(plugin_type="CSIPlugin").start()
    failure = kubelet.wait_failed()
    assert "no handler registered for plugin type: CSIPlugin" in failure.error
    ok, err = plugin.wait_status()[0]
    assert not ok
    assert "CSIPlugin" in err
    with pytest.raises(DriverNotRegisteredError):
        kubelet.prepare("gpu.example.com", [])


def test_first_known_version_in_plugin_order_wins(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    make_plugin(versions=["v1beta1.DRAPlugin", "v1.DRAPlugin"]).start()
    assert kubelet.wait_registered("gpu.example.com").service == "v1beta1.DRAPlugin"


def test_unknown_entries_before_a_known_one_are_skipped(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    make_plugin(versions=["v1alpha1.DRAResourceHealth", "v2.DRAPlugin", "v1.DRAPlugin"]).start()
    assert kubelet.wait_registered("gpu.example.com").service == "v1.DRAPlugin"


def test_kubelet_that_knows_only_v1beta1(root: Path, make_plugin: MakePlugin) -> None:
    make_plugin().start()
    with KubeletStandIn(
        root / "plugins_registry", known_services=["v1beta1.DRAPlugin"], poll_interval=0.02
    ) as old:
        assert old.wait_registered("gpu.example.com").service == "v1beta1.DRAPlugin"


def test_stand_in_refuses_services_it_cannot_speak(root: Path) -> None:
    with pytest.raises(ValueError, match="v1alpha3"):
        KubeletStandIn(root, known_services=["v1alpha3.NodeService"])


def test_socket_recreated_registers_again(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = make_plugin().start()
    first = kubelet.wait_registered("gpu.example.com")
    mark = len(kubelet.registrations)
    plugin.stop_registration()
    kubelet.wait_deregistered("gpu.example.com")
    plugin.start_registration()
    second = kubelet.wait_registered("gpu.example.com", since=mark)
    assert second is not first
    assert kubelet.registered("gpu.example.com") is second
    assert kubelet.deregistrations == [first]
    assert plugin.wait_status(2) == [(True, ""), (True, "")]


def test_socket_removed_deregisters(kubelet: KubeletStandIn, make_plugin: MakePlugin) -> None:
    plugin = make_plugin().start()
    got = kubelet.wait_registered("gpu.example.com")
    plugin.stop_registration()
    assert kubelet.wait_deregistered("gpu.example.com") is got
    assert kubelet.registered("gpu.example.com") is None
    with pytest.raises(DriverNotRegisteredError, match=r"gpu\.example\.com"):
        kubelet.unprepare("gpu.example.com", [])


def test_empty_endpoint_means_the_registration_socket(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = make_plugin(single_socket=True).start()
    got = kubelet.wait_registered("gpu.example.com")
    assert got.endpoint == str(plugin.reg_socket)
    assert kubelet.unprepare("gpu.example.com", []) == {}


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("relative/dra.sock", "not an absolute path"),
        ("/nonexistent/dra.sock", "not an existing socket"),
        ("/" + "x" * 120, "too long"),
    ],
)
def test_bad_endpoint_rejected(
    kubelet: KubeletStandIn, make_plugin: MakePlugin, endpoint: str, why: str
) -> None:
    plugin = make_plugin(endpoint=endpoint).start()
    assert why in kubelet.wait_failed().error
    assert plugin.wait_status()[0][0] is False


def test_endpoint_that_is_a_regular_file_rejected(
    kubelet: KubeletStandIn, make_plugin: MakePlugin, root: Path
) -> None:
    regular = root / "not-a-socket"
    regular.write_text("")
    make_plugin(endpoint=str(regular)).start()
    assert "not an existing socket" in kubelet.wait_failed().error


@pytest.mark.parametrize("endpoint", ["relative/dra.sock", "/nonexistent/dra.sock",
                                      "/" + "x" * 120])
def test_the_real_kubelet_registers_a_bad_endpoint_and_the_calls_fail(
    root: Path, make_plugin: MakePlugin, endpoint: str
) -> None:
    """strict_registration=False plays the real ValidatePlugin/RegisterPlugin: only the
    services are checked; an endpoint nobody listens on is registered and its calls fail."""
    plugin = make_plugin(endpoint=endpoint)
    with KubeletStandIn(root / "plugins_registry", poll_interval=0.02,
                        strict_registration=False) as lax:
        plugin.start()
        got = lax.wait_registered("gpu.example.com")
        assert got.endpoint == endpoint
        assert plugin.statuses == [(True, "")]
        # UNAVAILABLE (nobody there), or UNKNOWN where gRPC cannot make a channel at all (a
        # path over 107 bytes); the kubelet's Go client fails the call likewise.
        with pytest.raises(PluginCallError):
            lax.unprepare("gpu.example.com", [], timeout=2)
        assert lax.failures == []


@pytest.mark.parametrize("name", ["", "Gpu.Example.com", "a b"])
def test_the_real_kubelet_registers_any_driver_name(
    root: Path, make_plugin: MakePlugin, name: str
) -> None:
    plugin = make_plugin(driver="gpu.example.com", reg_name="bad-reg.sock")
    plugin.driver = name
    with KubeletStandIn(root / "plugins_registry", poll_interval=0.02,
                        strict_registration=False) as lax:
        plugin.start()
        assert lax.wait_registered(name).driver == name
        assert plugin.statuses == [(True, "")]


@pytest.mark.parametrize("name", ["", "Gpu.Example.com", "../x", "a b", "x" * 64])
def test_invalid_driver_name_rejected(
    kubelet: KubeletStandIn, make_plugin: MakePlugin, name: str
) -> None:
    plugin = make_plugin(driver="gpu.example.com", reg_name="bad-reg.sock")
    plugin.driver = name  # sockets keep sane paths; GetInfo advertises the bad name
    plugin.start()
    assert "invalid driver name" in kubelet.wait_failed().error


def _same_endpoint(make_plugin: MakePlugin, first: FakePlugin) -> FakePlugin:
    """A second registration socket advertising ``first``'s DRA socket."""
    return make_plugin(reg_name="gpu.example.com-other-reg.sock", endpoint=str(first.dra_socket))


def test_same_endpoint_twice_1_35_fails_without_retry(
    root: Path, make_plugin: MakePlugin
) -> None:
    with KubeletStandIn(root / "plugins_registry", minor="1.35", poll_interval=0.02,
                        retry_initial=0.05) as kubelet:
        first = make_plugin().start()
        kubelet.wait_registered("gpu.example.com")
        second = _same_endpoint(make_plugin, first)
        second.start_registration()  # shares the first plugin's DRA socket
        failure = kubelet.wait_failed()
        assert "already registered" in failure.error
        assert failure.socket_path == second.reg_socket
        assert second.wait_status() == [(False, failure.error)]
        # Not retried by 1.35 itself (kubernetes issue 133725): one failure, one notice.
        with pytest.raises(TimeoutError):
            kubelet.wait_failed(timeout=0.3, since=1)
        # Not even once the endpoint is free again: the socket must be re-created.
        first.stop_registration()
        kubelet.wait_deregistered("gpu.example.com")
        with pytest.raises(TimeoutError):
            kubelet.wait_registered("gpu.example.com", timeout=0.3, since=1)


def test_same_endpoint_twice_1_37_is_retried_with_back_off(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    """1.36+: the failed RegisterPlugin removes the plugin from actual state; the plugin (as
    the Go helper does) answers the failure notice with an error, so the retry backs off."""
    assert kubelet.minor == "1.37"
    first = make_plugin().start()
    registered = kubelet.wait_registered("gpu.example.com")
    second = _same_endpoint(make_plugin, first)
    second.start_registration()
    statuses = second.wait_status(3)
    assert all(not ok and "already registered" in err for ok, err in statuses[:3])
    assert all(f.socket_path == second.reg_socket for f in kubelet.failures)
    # The first instance keeps its registration all along.
    assert kubelet.registered("gpu.example.com") is registered
    # Once the endpoint is free, the next retry registers the second socket.
    mark = len(kubelet.registrations)
    first.stop_registration()
    kubelet.wait_deregistered("gpu.example.com")
    got = kubelet.wait_registered("gpu.example.com", timeout=5, since=mark)
    assert got.socket_path == second.reg_socket
    assert second.wait_status(len(statuses) + 1)[-1] == (True, "")


def test_same_endpoint_twice_1_37_retried_on_the_next_pass_when_the_notice_is_taken(
    root: Path, make_plugin: MakePlugin
) -> None:
    """A plugin that takes the failure notice without error (our agent does): the operation
    returned nil, so the reconciler starts it again on its next pass, without back-off."""
    with KubeletStandIn(root / "plugins_registry", poll_interval=0.02,
                        retry_initial=30) as kubelet:
        first = make_plugin().start()
        kubelet.wait_registered("gpu.example.com")
        second = _same_endpoint(make_plugin, first)
        second.accept_failure_notices = True
        second.start_registration()
        # Three notices well inside the 30 s first back-off: no back-off at all.
        statuses = second.wait_status(3, timeout=3)
        assert all(not ok and "already registered" in err for ok, err in statuses)


def test_a_failed_notify_true_1_35_leaves_the_registration_standing(
    root: Path, make_plugin: MakePlugin
) -> None:
    plugin = make_plugin()
    plugin.refuse_notices = True
    with KubeletStandIn(root / "plugins_registry", minor="1.35", poll_interval=0.02,
                        retry_initial=0.05) as kubelet:
        plugin.start()
        got = kubelet.wait_registered("gpu.example.com")
        assert plugin.wait_status() == [(True, "")]
        assert kubelet.failures == []
        assert kubelet.unprepare("gpu.example.com", []) == {}
        with pytest.raises(AssertionError):
            plugin.wait_status(2, timeout=0.3)  # told once, never again
        assert kubelet.registered("gpu.example.com") is got


def test_a_failed_notify_true_1_37_deregisters_and_retries_with_back_off(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = make_plugin()
    plugin.refuse_notices = True
    plugin.start()
    statuses = plugin.wait_status(3)
    assert statuses[:3] == [(True, "")] * 3  # told, refused, deregistered, told again
    failure = kubelet.wait_failed()
    assert "failed to send registration status" in failure.error and not failure.notified
    assert kubelet.registrations == [] and kubelet.registered("gpu.example.com") is None
    with pytest.raises(DriverNotRegisteredError):
        kubelet.unprepare("gpu.example.com", [])
    plugin.refuse_notices = False  # the plugin listens again: the next retry sticks
    assert kubelet.wait_registered("gpu.example.com").socket_path == plugin.reg_socket


def test_the_stand_in_plays_only_the_minors_it_knows(root: Path) -> None:
    with pytest.raises(ValueError, match=r"1\.36"):
        KubeletStandIn(root, minor="1.36")
    assert KubeletStandIn(root, minor="1.35").known_health_services == HEALTH_SERVICES_135
    assert KubeletStandIn(root).known_health_services == HEALTH_SERVICES_137


def test_two_instances_of_a_driver_calls_go_to_the_newest(
    kubelet: KubeletStandIn, make_plugin: MakePlugin, root: Path
) -> None:
    old = make_plugin().start()
    kubelet.wait_registered("gpu.example.com")
    mark = len(kubelet.registrations)
    new = FakePlugin(root, "gpu.example.com", reg_name="gpu.example.com-uid2-reg.sock")
    new.dra_socket = root / "plugins" / "gpu.example.com" / "dra-uid2.sock"
    new.advertised_endpoint = str(new.dra_socket)
    try:
        new.start()
        assert kubelet.wait_registered("gpu.example.com", since=mark).endpoint.endswith("uid2.sock")
        kubelet.unprepare("gpu.example.com", [])
        assert [c[1] for c in new.calls] == ["NodeUnprepareResources"]
        assert old.calls == []
    finally:
        new.stop()


def test_hidden_and_non_socket_files_are_ignored(
    kubelet: KubeletStandIn, make_plugin: MakePlugin, root: Path
) -> None:
    registry = root / "plugins_registry"
    registry.mkdir(parents=True, exist_ok=True)
    (registry / "notes.sock").write_text("not a socket")
    hidden = make_plugin(driver="hidden.example.com", reg_name=".hidden-reg.sock").start()
    make_plugin().start()
    kubelet.wait_registered("gpu.example.com")
    assert [r.driver for r in kubelet.registrations] == ["gpu.example.com"]
    assert kubelet.failures == []
    assert hidden.statuses == []


def test_sockets_in_subdirectories_are_found(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    make_plugin(reg_name="nested/gpu-reg.sock").start()
    assert kubelet.wait_registered("gpu.example.com").socket_path.parent.name == "nested"


def test_dead_socket_does_not_block_other_plugins(root: Path, make_plugin: MakePlugin) -> None:
    registry = root / "plugins_registry"
    registry.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(registry / "crashed-reg.sock"))  # bound, never listening: as after a crash
    try:
        with KubeletStandIn(registry, poll_interval=0.02, dial_timeout=0.5) as kubelet:
            make_plugin().start()
            kubelet.wait_registered("gpu.example.com")
            failure = kubelet.wait_failed()
            assert failure.socket_path.name == "crashed-reg.sock"
            assert not failure.notified
    finally:
        stale.close()


def test_wait_registered_times_out_with_recent_failures(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    make_plugin(plugin_type="DevicePlugin").start()
    kubelet.wait_failed()
    with pytest.raises(TimeoutError, match="DevicePlugin"):
        kubelet.wait_registered("gpu.example.com", timeout=0.1)


def test_start_twice_is_an_error(kubelet: KubeletStandIn) -> None:
    with pytest.raises(RuntimeError, match="already started"):
        kubelet.start()


def test_fast_restart_of_the_socket_is_seen(
    kubelet: KubeletStandIn, make_plugin: MakePlugin
) -> None:
    plugin = make_plugin().start()
    first = kubelet.wait_registered("gpu.example.com")
    mark = len(kubelet.registrations)
    # No pause between stop and start: the scan may never see the path missing, only a new
    # socket file (new inode and change time), which the kubelet treats as a new instance.
    plugin.stop_registration()
    plugin.start_registration()
    second = kubelet.wait_registered("gpu.example.com", since=mark)
    assert second is not first
    assert kubelet.deregistrations == [first]
