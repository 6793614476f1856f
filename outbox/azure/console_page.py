"""The console's one page: HTML with its style and script inline (no asset from anywhere).

The page is kept as package data, in ``assets/`` beside this module: ``console.html``, its style
``console.css`` and its script ``console.js``, read once (like the store's ``queries.sql``) and put
together here into one page, the style and the script inline.

Everything shown came from a producer or a receiver (payloads, event types, errors): the script
puts it on the page as text only (``textContent``, never HTML), and the page's policy runs no
script but its own (a nonce per answer). The key is given once, in the address's fragment
(``#key=…``, which no server sees) or in the form; it is kept in the tab's ``sessionStorage``,
removed from the address at once (``history.replaceState``), and sent in the
``x-functions-key`` header of each call. Actions are POSTs; no cookie is ever set.
"""

from __future__ import annotations

from importlib.resources import files

NONCE = "__NONCE__"
# The lines of console.html that the style and the script take the place of.
STYLE_LINE = "__CONSOLE_CSS__\n"
SCRIPT_LINE = "__CONSOLE_JS__\n"


def _asset(name: str) -> str:
    return files("outbox.azure").joinpath("assets", name).read_text(encoding="utf-8")


PAGE = (
    _asset("console.html")
    .replace(STYLE_LINE, _asset("console.css"))
    .replace(SCRIPT_LINE, _asset("console.js"))
)


def render(nonce: str) -> str:
    """The page, its inline script and style carrying ``nonce``."""
    return PAGE.replace(NONCE, nonce)
