"""Troubleshooting: the checklist, doctor (checks on nodes), diagnose (checks on logs)."""
