"""cutpoint.agentclient: the async Python client of the agent protocol."""
