"""Container runtime checks on containerd 1.7 (config version 2), 2.x (version 3) and CRI-O."""

from __future__ import annotations

import time
from pathlib import PurePosixPath

from agent.doctor import runtime
from agent.doctor.context import Options
from agent.doctor.model import Status
from tests.doctor.conftest import Tree, assert_check, context

CFG = "/etc/containerd/config.toml"
SOCK = "/run/containerd/containerd.sock"
V2_CDI_ON = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n'
V2_NO_CDI = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n'


def test_containerd_17_with_cdi_on(tree: Tree) -> None:
    tree.write(CFG, V2_CDI_ON).socket(SOCK)
    ctx = context(tree)
    assert_check(runtime.check_runtime(ctx), Status.OK, "containerd 1.x, config version 2",
                 f"socket {SOCK}")
    assert_check(runtime.check_cdi_enabled(ctx), Status.OK, "enable_cdi = true")
    assert_check(runtime.check_cdi_dirs(ctx), Status.OK, "/etc/cdi, /var/run/cdi (default)")


def test_containerd_17_without_enable_cdi_fails(tree: Tree) -> None:
    tree.write(CFG, V2_NO_CDI).socket(SOCK)
    check = runtime.check_cdi_enabled(context(tree))
    assert_check(check, Status.FAIL, "enable_cdi not set", "defaults it to false",
                 fix='set enable_cdi = true under [plugins."io.containerd.grpc.v1.cri"]')


def test_containerd_17_enable_cdi_false_or_not_a_boolean(tree: Tree) -> None:
    tree.write(CFG, V2_CDI_ON.replace("true", "false")).socket(SOCK)
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.FAIL, "enable_cdi = false",
                 fix="enable_cdi = true")
    tree.write(CFG, V2_CDI_ON.replace("true", '"yes"'))
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.FAIL, "not a boolean",
                 fix="enable_cdi = true")


def test_an_import_that_replaces_the_cri_section_drops_enable_cdi(tree: Tree) -> None:
    # containerd 1.x replaces a whole plugin section with an import's: enable_cdi is gone.
    tree.write(CFG, 'imports = ["/etc/containerd/conf.d/*.toml"]\n' + V2_CDI_ON)
    tree.write("/etc/containerd/conf.d/50-mirror.toml", V2_NO_CDI).socket(SOCK)
    ctx = context(tree)
    assert_check(runtime.check_runtime(ctx), Status.OK, "conf.d/50-mirror.toml")
    assert_check(runtime.check_cdi_enabled(ctx), Status.FAIL, "enable_cdi not set",
                 fix="the import that replaces that section")


def test_a_relative_import_turns_cdi_on(tree: Tree) -> None:
    tree.write(CFG, 'imports = ["cdi.toml"]\n' + V2_NO_CDI).write("/etc/containerd/cdi.toml",
                                                                  V2_CDI_ON).socket(SOCK)
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.OK, "enable_cdi = true")


def test_an_import_loop_ends(tree: Tree) -> None:
    tree.write(CFG, f'imports = ["{CFG}"]\n' + V2_CDI_ON).socket(SOCK)
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.OK, "enable_cdi = true")


def test_containerd_2_defaults_cdi_on_and_can_turn_it_off(tree: Tree) -> None:
    tree.write(CFG, 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n').socket(SOCK)
    ctx = context(tree)
    assert_check(runtime.check_runtime(ctx), Status.OK, "containerd 2.x, config version 3")
    assert_check(runtime.check_cdi_enabled(ctx), Status.OK, "on by default in containerd 2.x")
    tree.write(CFG, 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\nenable_cdi = false\n')
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.FAIL, "enable_cdi = false",
                 fix='[plugins."io.containerd.cri.v1.runtime"]')


def test_cdi_dirs_without_the_agents_dir_fail(tree: Tree) -> None:
    tree.write(CFG, 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
               'cdi_spec_dirs = ["/etc/cdi"]\n').socket(SOCK)
    check = runtime.check_cdi_dirs(context(tree))
    assert_check(check, Status.FAIL, "reads /etc/cdi (cdi_spec_dirs)",
                 "not the agent's --cdi-dir /var/run/cdi",
                 fix="add /var/run/cdi to cdi_spec_dirs, or run the agent with --cdi-dir /etc/cdi")


def test_cdi_dirs_match_through_the_var_run_symlink(tree: Tree) -> None:
    # /var/run -> /run (absolute, as on Debian): resolved inside the host root.
    tree.dir("/run/cdi").symlink("/var/run", "/run")
    tree.write(CFG, 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
               'cdi_spec_dirs = ["/run/cdi"]\n').socket(SOCK)
    ctx = context(tree)
    assert ctx.host.path("/var/run/cdi") == tree.root / "run" / "cdi"
    assert_check(runtime.check_cdi_dirs(ctx), Status.OK, "the agent writes /var/run/cdi")


def test_cdi_dirs_that_are_not_a_list(tree: Tree) -> None:
    tree.write(CFG, 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n'
               'cdi_spec_dirs = "/etc/cdi"\n').socket(SOCK)
    assert_check(runtime.check_cdi_dirs(context(tree)), Status.FAIL, "not a list",
                 fix="cdi_spec_dirs = [")


def test_crio_reads_drop_ins_in_order(tree: Tree) -> None:
    tree.write("/etc/crio/crio.conf", '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n')
    tree.write("/etc/crio/crio.conf.d/10-cdi.conf",
               '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]\n')
    tree.socket("/var/run/crio/crio.sock")
    ctx = context(tree)
    assert_check(runtime.check_runtime(ctx), Status.OK, "CRI-O", "10-cdi.conf")
    assert_check(runtime.check_cdi_enabled(ctx), Status.OK, "CDI always on since 1.23")
    assert_check(runtime.check_cdi_dirs(ctx), Status.OK, "CRI-O reads /etc/cdi, /var/run/cdi")


def test_crio_without_the_agents_dir(tree: Tree) -> None:
    tree.write("/etc/crio/crio.conf", '[crio.runtime]\ncdi_spec_dirs = ["/etc/cdi"]\n')
    ctx = context(tree, options=Options(cdi_dir=PurePosixPath("/srv/cdi")))
    assert_check(runtime.check_runtime(ctx), Status.WARN, "no socket at /var/run/crio/crio.sock",
                 fix="start CRI-O")
    assert_check(runtime.check_cdi_dirs(ctx), Status.FAIL, "not the agent's --cdi-dir /srv/cdi",
                 fix="add /srv/cdi")


def test_no_runtime_at_all(tree: Tree) -> None:
    ctx = context(tree)
    assert_check(runtime.check_runtime(ctx), Status.WARN, "neither containerd",
                 fix="--host-root")
    assert_check(runtime.check_cdi_enabled(ctx), Status.SKIPPED, "no readable")


def test_containerd_without_a_config_file(tree: Tree) -> None:
    tree.socket(SOCK)
    check = runtime.check_cdi_enabled(context(tree))
    assert_check(check, Status.WARN, "without a config file", fix="enable_cdi = true")


def test_bad_toml_is_one_warning(tree: Tree) -> None:
    tree.write(CFG, 'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n').socket(SOCK)
    ctx = context(tree)
    assert_check(runtime.check_runtime(ctx), Status.WARN, f"{CFG}: not valid TOML",
                 fix="fix the file")
    assert_check(runtime.check_cdi_enabled(ctx), Status.SKIPPED, "no readable")


def test_a_bad_import_names_the_import(tree: Tree) -> None:
    tree.write(CFG, 'imports = ["bad.toml"]\n' + V2_CDI_ON)
    tree.write("/etc/containerd/bad.toml", b"\xff\xfe").socket(SOCK)
    assert_check(runtime.check_runtime(context(tree)), Status.WARN,
                 "/etc/containerd/bad.toml: not UTF-8", fix="fix the file")
    tree.write(CFG, 'imports = "conf.d"\n' + V2_CDI_ON)
    assert_check(runtime.check_runtime(context(tree)), Status.WARN, "imports must be a list",
                 fix="fix the file")


def test_a_directory_or_a_fifo_at_the_config_path(tree: Tree) -> None:
    tree.dir(CFG).socket(SOCK)
    assert_check(runtime.check_runtime(context(tree)), Status.WARN,
                 f"{CFG} is a directory, not a regular file", fix="fix the file")
    tree.local(CFG).rmdir()
    tree.fifo(CFG)
    started = time.monotonic()
    check = runtime.check_runtime(context(tree))
    assert time.monotonic() - started < 1  # never waits for a writer
    assert_check(check, Status.WARN, f"{CFG} is a FIFO, not a regular file", fix="fix the file")


def test_a_config_that_is_a_symlink_is_read_at_its_target_inside_the_host(tree: Tree) -> None:
    # An absolute link target is the host's path, never this machine's.
    tree.write("/opt/cfg/containerd.toml", V2_CDI_ON).socket(SOCK)
    tree.symlink(CFG, "/opt/cfg/containerd.toml")
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.OK, "enable_cdi = true")
    tree.local(CFG).unlink()
    tree.symlink(CFG, "/etc/containerd/config.toml")  # a loop: ends, one warning
    assert_check(runtime.check_runtime(context(tree)), Status.WARN, CFG, fix="fix the file")


def test_a_dot_dot_link_cannot_leave_the_host_root(tree: Tree) -> None:
    tree.symlink("/etc/containerd", "../../../../../../etc")
    ctx = context(tree)
    assert ctx.host.path(CFG) == tree.root / "etc" / "config.toml"


def test_containerd_2_merges_an_imported_section_key_by_key(tree: Tree) -> None:
    # containerd 2.x (config version 3) keeps enable_cdi when an import sets another CRI key.
    main = ('version = 3\nimports = ["conf.d/*.toml"]\n'
            '[plugins."io.containerd.cri.v1.runtime"]\nenable_cdi = false\n')
    tree.write(CFG, main).socket(SOCK)
    tree.write("/etc/containerd/conf.d/10.toml", 'version = 3\n[plugins."io.containerd.cri.v1.'
               'runtime".containerd]\ndefault_runtime_name = "runc"\n')
    assert_check(runtime.check_cdi_enabled(context(tree)), Status.FAIL, "enable_cdi = false",
                 fix="enable_cdi = true")
