"""dupflow's configuration: the typed settings and the one loader (config.loader)."""
