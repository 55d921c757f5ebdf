"""Hardware discovery: NVML GPUs, sysfs PCI devices and NICs, udev hotplug, simulated nodes.

Discovery knows hardware, not Kubernetes objects beyond the resource.k8s.io device model it
emits; nothing here talks to an API server.
"""
