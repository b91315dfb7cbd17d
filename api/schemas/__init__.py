"""Request and response schemas, split by purpose (Create / Update / Public)."""
