"""First-party ampcore adapters (installed as ``ampcore_backends``).

Each module is an adapter plugin registered through the ``ampcore`` entry-point group, the
same path a third-party ``ampcore-<vendor>`` distribution takes.  Device logic lives in
pure functions of recorded device properties so that it is tested without the device.
"""
