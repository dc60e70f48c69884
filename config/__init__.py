"""dupflow configuration: typed settings (config.settings) and the one loader (config.loader)."""

from config.loader import ConfigError, LoadedConfig, effective_config_rows, leaf_paths, load_settings
from config.settings import Settings

__all__ = ["ConfigError", "LoadedConfig", "Settings", "effective_config_rows", "leaf_paths", "load_settings"]
