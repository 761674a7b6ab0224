"""Triggers: the cron scheduler loop; webhooks and manual triggers go through ControlPlane."""
