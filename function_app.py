"""The Azure Functions app (Python v2 programming model): wiring only.

The relay's six functions are ``outbox.functions.bp``, a Blueprint; an app of your own adds
them the same way. Nothing connects at import time (the host imports this file while indexing).
"""

from __future__ import annotations

import azure.functions as func

from outbox.functions import bp

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(bp)
