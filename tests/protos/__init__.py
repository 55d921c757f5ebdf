"""Tests of the wire-exact protos and their generated modules."""
