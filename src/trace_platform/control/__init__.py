"""User-facing control-plane operations, each acting as an authenticated user.

The API and the CLI both call these, so permission rules live in exactly one place.
"""
