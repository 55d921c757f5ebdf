"""The DRA CEL environment: variables, libraries, unknown domains, errors."""

import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.explain.cel_env import CelEnv, split_conjuncts
from agent.explain.cel_lib import SelectorRuntimeError
from agent.explain.devices import Capacity, Device
from agent.explain.docs import InputError
from agent.explain.model import Selector

D = "gpu.example.com"


def gpu(**attrs):
    base = {"model": ("string", "H100"), "index": ("int", 3), "mig": ("bool", False),
            "driverVersion": ("version", "550.54.15"),
            "resource.kubernetes.io/pcieRoot": ("string", "pci0000:15")}
    base.update(attrs)
    return Device("gpu-0", D, "pool", base,
                  {"memory": Capacity(Fraction(80 * 2**30), "80Gi"),
                   "other.io/slots": Capacity(Fraction(4), "4")})


def run(expr, device=None, env=None):
    env = env or CelEnv()
    cs = env.compile(Selector(expr, "request r", 0, "claim.yaml:9"))
    return env.matches(cs, device or gpu())


@pytest.mark.parametrize(("expr", "want"), [
    (f'device.driver == "{D}"', True),
    (f'device.attributes["{D}"].model == "H100"', True),
    (f'device.attributes["{D}"].index > 2 && !device.attributes["{D}"].mig', True),
    ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:15"', True),
    (f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0', True),
    (f'device.capacity["{D}"].memory.isGreaterThan(quantity("80Gi"))', False),
    (f'device.capacity["{D}"].memory == quantity("81920Mi")', True),
    ('device.capacity["other.io"].slots.asInteger() == 4', True),
    (f'device.attributes["{D}"].driverVersion.isGreaterThan(semver("535.0.0"))', True),
    (f'device.attributes["{D}"].driverVersion.major() == 550', True),
    (f'device.attributes["{D}"].driverVersion == semver("550.54.15")', True),
    ('"model" in device.attributes["unknown.example.com"]', False),
    ('device.attributes["unknown.example.com"].size() == 0', True),
    (f'has(device.attributes["{D}"].uuid)', False),
    ("device.allowMultipleAllocations", False),
    ('quantity("1.5").add(1).isGreaterThan(quantity("2"))', True),
    ('isQuantity("1Gi") && !isQuantity("1 Gi") && isSemver("1.2.3")', True),
    (f'device.attributes["{D}"].model.lowerAscii() == "h100"', True),
])
def test_dra_environment(expr, want):
    assert run(expr) is want


def test_missing_attribute_is_a_runtime_error_unless_another_conjunct_is_false():
    with pytest.raises(SelectorRuntimeError, match="no such key: uuid"):
        run(f'device.attributes["{D}"].uuid == "x"')
    assert run(f'device.attributes["{D}"].uuid == "x" && device.driver == "nope"') is False


def test_non_bool_result_is_an_error():
    with pytest.raises(SelectorRuntimeError, match="must evaluate to bool"):
        run(f'device.attributes["{D}"].model')


@pytest.mark.parametrize(("expr", "message"), [
    ("device.attributes[", "does not compile"),
    ("device.driver == ", "line 1 column"),
    ('foo(device) == 1', "undeclared reference to 'foo'"),
    ('node.name == "a"', "undeclared reference to 'node'"),
])
def test_compile_errors_point_at_the_selector(expr, message):
    with pytest.raises(InputError) as err:
        CelEnv().compile(Selector(expr, "class gpu", 2, "class.yaml:7"))
    assert err.value.where == "class.yaml:7"
    assert message in str(err.value) and "class gpu selector #2" in str(err.value)


def test_macros_may_bind_their_own_variables():
    assert run(f'device.attributes["{D}"].exists(k, k == "model")') is True


def test_failing_part_names_the_false_conjunct():
    env = CelEnv()
    expr = (f'device.driver == "{D}" && device.capacity["{D}"].memory.compareTo('
            f'quantity("100Gi")) >= 0 && device.attributes["{D}"].model == "H100"')
    cs = env.compile(Selector(expr, "request r", 0, ""))
    assert env.matches(cs, gpu()) is False
    assert env.failing_part(cs, gpu()).startswith(f'device.capacity["{D}"].memory')


def test_split_conjuncts_respects_precedence_strings_and_parentheses():
    assert split_conjuncts('a && (b || c) && "x && y" == z') == ["a", "(b || c)", '"x && y" == z']
    assert split_conjuncts("a && b || c") == ["a && b || c"]
    assert split_conjuncts("a ? b : c && d") == ["a ? b : c && d"]


names = st.sampled_from(["model", "index", "mig", "slots", "extra"])
values = st.one_of(st.sampled_from(["H100", "A100"]).map(lambda s: ("string", s)),
                   st.integers(0, 5).map(lambda i: ("int", i)),
                   st.booleans().map(lambda b: ("bool", b)))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, values, max_size=4))
def test_projection_gives_the_same_verdicts_as_the_whole_device(attrs):
    """The fast path (only the referenced attributes) must agree with the whole device."""
    device = Device("d", D, "p", attrs, {})
    exprs = [f'has(device.attributes["{D}"].model) && device.attributes["{D}"].model == "H100"',
             f'!has(device.attributes["{D}"].index) || device.attributes["{D}"].index >= 2']
    projected = CelEnv()
    whole = CelEnv()
    whole.compile(Selector('"model" in device.attributes["x.io"]', "r", 9, ""))  # disables it
    for e in exprs:
        a = projected.compile(Selector(e, "r", 0, ""))
        b = whole.compile(Selector(e, "r", 0, ""))
        assert _outcome(projected, a, device) == _outcome(whole, b, device)


def _outcome(env, cs, device):
    try:
        return env.matches(cs, device)
    except SelectorRuntimeError as err:
        return err.cause


def test_daemon_imports_never_load_the_cel_engine():
    code = ("import sys, agent.cli, agent.explain, agent.common.config\n"
            "assert 'cel' not in sys.modules and 'cel.cel' not in sys.modules, 'cel loaded'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
