"""Every change prepare makes to the host beyond the CDI spec, one module each, one protocol
(``base``): MIG partitions (``mig``), VFs (``vfs``), GPU time slices (``timeslice``), MPS
(``mps``) and device metadata files (``metadata``). ``agent.daemon.wiring`` orders them."""
