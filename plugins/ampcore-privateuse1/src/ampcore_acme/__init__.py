"""TEMPLATE ampcore adapter for a PrivateUse1 device (``acme``); the hooks are in ``plugin``."""
