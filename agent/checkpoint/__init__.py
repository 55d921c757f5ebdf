"""The checkpoint: what this node has prepared, durable across kill -9 and reboots. ``model``
holds the records per claim UID (each with its JSON and its validation, the typed field
readers in ``fields``); ``codec`` is the file's format (schema version, checksum, salvage of a
corrupt file); ``store`` keeps it on disk (locks, atomic writes, corrupt files set aside)."""
