"""The claim API version choice shared by the claim reader and the status writer."""

from __future__ import annotations

from agent.apiversions import CLAIM_API_VERSIONS, ServedVersions


def test_preference_order_and_a_read_version_leading() -> None:
    served = ServedVersions()
    assert served.candidates() == list(CLAIM_API_VERSIONS)
    assert served.candidates("v1beta1") == ["v1beta1", "v1", "v1beta2"]
    assert served.candidates("v9") == list(CLAIM_API_VERSIONS)


def test_unserved_versions_are_forgotten_but_never_the_last() -> None:
    served = ServedVersions()
    assert served.not_served("v1") is True
    assert served.not_served("v1beta2") is True
    assert served.candidates() == ["v1beta1"]
    assert served.not_served("v1beta1") is False  # nothing else left to try
    assert served.candidates() == ["v1beta1"]


def test_a_version_another_thread_already_dropped_still_means_try_the_next() -> None:
    served = ServedVersions()
    snapshot = served.candidates()
    assert served.not_served("v1") is True
    assert served.not_served(snapshot[0]) is True
    assert served.candidates() == ["v1beta2", "v1beta1"]
