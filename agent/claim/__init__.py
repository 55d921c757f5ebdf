"""A ResourceClaim as this node sees it, beside ``agent.prepare`` which acts on it: ``model``
holds the facts prepare needs (the kubelet's reference, the allocated devices, the opaque
configs, the per-claim errors); ``parse`` reads them from the API server's claim dict (and
refuses malformed ones with one line); ``identity`` says which claim UIDs and names this node
accepts; ``writable`` what the checkpoint and a CDI spec can hold; ``opaque`` decodes our
opaque device configuration; ``status`` writes a prepared claim's NICs back to its status."""
