"""cutpoint.api.cli: the `cutpoint` command."""
