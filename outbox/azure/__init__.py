"""The Azure Functions side: the Blueprint (``functions``) and the host-agnostic triggers it calls
(``triggers``). Imports the layers below; never ``outbox.hosting``."""
