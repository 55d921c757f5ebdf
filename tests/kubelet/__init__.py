"""Tests of the kubelet stand-in (tests/fakes/kubelet) against tiny in-test plugins."""
