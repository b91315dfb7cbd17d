"""Celery tasks (placeholder; filled in below)."""
