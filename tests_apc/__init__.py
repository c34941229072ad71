"""The APC suite: what users run (``pytest -m apc --gpu-node`` in a checkout, or, with the package
installed, ``pytest --pyargs tests_apc -m apc --gpu-node`` from any folder)."""
