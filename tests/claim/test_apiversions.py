"""The claim API version choice shared by the claim reader and the status writer."""

from __future__ import annotations

from agent.kube.apiversions import CLAIM_API_VERSIONS, ServedVersions


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


def test_an_unserved_version_is_dropped_on_proof_and_tried_again_later() -> None:
    now = [0.0]
    answers: dict[str, bool | None] = {"v1": None}
    versions = ServedVersions(probe=lambda v: answers[v], retry_after_s=60, clock=lambda: now[0])
    assert versions.not_served("v1") is False  # discovery did not answer: no proof
    answers["v1"] = True
    assert versions.not_served("v1") is False  # discovery lists it: keep it
    assert versions.candidates() == ["v1", "v1beta2", "v1beta1"]
    answers["v1"] = False
    assert versions.not_served("v1") is True  # proven unserved: the next one is tried
    assert versions.candidates() == ["v1beta2", "v1beta1"]
    now[0] = 61.0  # an upgrade may have brought it: looked at again
    assert versions.candidates() == ["v1", "v1beta2", "v1beta1"]
