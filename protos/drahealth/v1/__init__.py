"""Generated protocol modules; see protos/__init__.py."""
