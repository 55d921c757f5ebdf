"""The checkpoint: what this node has prepared, durable across kill -9 and reboots. ``model``
is the format (records per claim UID, their validation and encoding); ``store`` keeps it on
disk (locks, atomic writes, corrupt files set aside)."""
