"""cutpoint.api: the REST service, its models, jobs and the CLI."""
