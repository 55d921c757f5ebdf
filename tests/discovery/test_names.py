"""Device names are matched whole: ``re.match`` with ``$`` accepts a trailing newline."""

from __future__ import annotations

import pytest

from discovery.names import is_dns_label, sanitize


@pytest.mark.parametrize("name", ["gpu-0\n", "nic-0000-18-00-0\n", "gpu-0\nx", "\ngpu-0"])
def test_a_name_with_a_newline_is_not_a_dns_label(name: str) -> None:
    assert not is_dns_label(name)


def test_sanitize_turns_the_newline_into_a_dns_label() -> None:
    # Before, "gpu-0\n" counted as a label and came back unchanged, newline and all.
    assert sanitize("gpu-0\n") == "gpu-0"
    assert is_dns_label(sanitize("gpu-0\n"))


@pytest.mark.parametrize("name", ["gpu-0", "a", "a" * 63, "nic-0000-18-00-0"])
def test_good_names_still_are(name: str) -> None:
    assert is_dns_label(name)
