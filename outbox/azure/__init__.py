"""The Azure Functions side: the Blueprint (``functions``), the host-agnostic triggers it calls
(``triggers``) and the one place that builds their settings and relay (``host``). Imports the
layers below; never ``outbox.hosting``."""
