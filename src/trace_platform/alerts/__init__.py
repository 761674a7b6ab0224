"""Alerts: the org-wide alert datasets, rules (alert_evaluate) and routing (alert_route)."""
