"""What every part of the agent shares and none owns: its configuration (``config``), structured
logs (``logs``), Prometheus metrics (``metrics``), crash-test failpoints (``failpoints``), and
small rule sets taken from Kubernetes and the host: resource quantities (``quantity``), object
names (``k8snames``), reading files the agent owns but does not trust (``safefile``) and holding
a lock on one (``filelock``). Writing such a file atomically is ``cdi.atomicfile``'s: cdi, which
never imports the agent, writes its spec files the same way."""
