"""Proxmox + LXC provisioning: device majors, container config repair, container control, the
in-container CUDA probe (and, from other areas, model staging and the recover pipeline)."""
