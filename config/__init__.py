"""dupflow configuration: typed settings (config.settings and its blocks) and the one loader (config.loader)."""

from config.errors import ConfigError
from config.keys import leaf_paths
from config.loader import LoadedConfig, effective_config_rows, load_settings
from config.settings import Settings

__all__ = ["ConfigError", "LoadedConfig", "Settings", "effective_config_rows", "leaf_paths", "load_settings"]
