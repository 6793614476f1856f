"""The relay's functions without its timers, for ``outbox serve --app``.

Tests that must show a retry, a requeue or a start-up backlog delivered by a wake-up hint host
this app: no five-minute sweep can deliver it instead. (It filters the app's function builders,
an attribute the azure-functions library keeps to itself: fine for a test, not for an app.)
"""

from __future__ import annotations

import azure.functions as func

from outbox.azure.functions import bp

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(bp)
app._function_builders = [
    builder
    for builder in app._function_builders
    if builder._function.get_trigger().get_binding_name() != "timerTrigger"
]
