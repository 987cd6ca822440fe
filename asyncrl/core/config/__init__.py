"""The one typed configuration schema (`schema.AsyncRLConfig`), its sections by role, reading and writing config files, and the checks `asyncrl up` runs on a config before anything starts."""
