"""ampcore's vendor conformance suite (installed as ``ampcore_conformance``)."""
