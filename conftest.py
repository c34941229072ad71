"""Repository conftest: pytester for the plugin's own tests (tests/)."""

pytest_plugins = ["pytester"]
