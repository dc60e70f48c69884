"""dupflow configuration: typed settings (config.settings and its blocks) and the one loader (config.loader)."""
