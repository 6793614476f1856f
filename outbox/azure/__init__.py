"""The Azure Functions side: the Blueprint (``functions``), the host-agnostic triggers it calls
(``triggers``), the one place that builds their settings and relay (``host``), the console
(``console``, its page put together from ``assets/``), and the OpenTelemetry SDK's set-up that
every host runs before it opens its relay (``telemetry_setup``; here, the lowest edge, so that
``outbox.hosting`` calls the same). Imports the layers below; never ``outbox.hosting``."""
