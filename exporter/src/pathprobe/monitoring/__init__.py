"""Monitoring as code: the parameters shared by rules and dashboards, and the rules."""
