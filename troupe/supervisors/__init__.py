"""Supervision: restart policies, intensity limits, and the control plane's tree."""
