"""The Delivery Service: the only part of Trace that talks to the outside world. It sends the
org's routed alerts (`alert_deliveries`) as signed webhooks, with deterministic idempotency
keys, retries and outbound safety, and records every attempt."""
