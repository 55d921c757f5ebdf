"""What every part of the agent shares and none owns: its configuration (``config``), structured
logs (``logs``), Prometheus metrics (``metrics``), crash-test failpoints (``failpoints``), and
three small rule sets taken from Kubernetes and the host: resource quantities (``quantity``),
object names (``k8snames``) and reading files the agent owns but does not trust (``safefile``)."""
