"""A ResourceClaim as this node sees it, beside ``agent.prepare`` which acts on it: ``model``
reads the API server's claim dict into the facts prepare needs (and refuses malformed ones with
one line), ``opaque`` decodes our opaque device configuration, ``status`` writes a prepared
claim's NICs back to its status."""
