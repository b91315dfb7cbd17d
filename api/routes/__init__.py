"""HTTP routes under /v1.  Routes validate, call a service, shape the reply."""
