"""Keep secrets out of everything the relay writes: logs, last_error, summaries, error responses."""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote_plus, urlsplit

import yarl

from outbox.settings import Settings

# Connection-string keys whose values are credentials (Azure Storage, and the like).
_CREDENTIAL_PAIR = re.compile(r"(?i)\b(AccountKey|SharedAccessSignature|sig|password|pwd)=[^;&\s]+")
# user:password@ in any URL.
_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")


def _url_forms(url: str) -> list[str]:
    """``url`` and the parts of it a receiver or a library may echo: its path with query, the
    path alone, and each token-like host label, path segment or query value, raw and decoded;
    as written and as the HTTP client normalises them."""
    forms = [url]
    parts = urlsplit(url)
    if parts.path.strip("/") or parts.query:
        forms.append(parts.path + ("?" + parts.query if parts.query else ""))
    if parts.path.strip("/"):
        forms.append(parts.path)
    # A host label can be the capability itself ("https://eo5f1c2a9b8d.m.pipedream.net"), and
    # connection and DNS errors quote the host.
    labels = (parts.hostname or "").split(".")
    pieces = (
        labels
        + parts.path.split("/")
        + [value for pair in parts.query.split("&") for value in pair.split("=")[1:]]
    )
    for piece in pieces:
        forms += [text for text in (piece, unquote_plus(piece)) if _token_like(text)]
    try:
        normalised = yarl.URL(url)
    except (TypeError, ValueError):
        return forms
    forms.append(str(normalised))
    if normalised.path.strip("/") or normalised.query_string:
        forms += [normalised.raw_path_qs, normalised.path_qs]
    return forms


def _token_like(text: str) -> bool:
    """Long, or with a digit among letters: worth hiding wherever it appears (a plain word like
    "orders" or "v1" is not, or ordinary error text would be redacted too)."""
    return len(text) >= 16 or (
        len(text) >= 8 and any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    )


class Redactor:
    """Replaces every configured secret (and anything shaped like a credential) in a text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        secrets: list[str] = [settings.database_url.get_secret_value()]
        password = urlsplit(settings.database_url.get_secret_value()).password
        if password:
            secrets.append(password)
        if settings.queue_connection is not None:
            secrets.append(settings.queue_connection.get_secret_value())
        if settings.function_key is not None:
            secrets.append(settings.function_key.get_secret_value())
        for endpoint in settings.webhooks.values():
            # Webhook URLs are often capabilities themselves (a token in the path or query), and
            # a library may print them as the HTTP client normalised them ("%2F" as "/").
            secrets.extend(_url_forms(endpoint.url))
            if endpoint.secret is not None:
                value = endpoint.secret.get_secret_value()
                secrets.extend([value, *value.split()])
                secrets.extend(part.removeprefix("whsec_") for part in value.split())
        return cls(secrets)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        text = _CREDENTIAL_PAIR.sub(lambda m: f"{m.group(1)}=[redacted]", text)
        return _URL_PASSWORD.sub(r"\1:[redacted]@", text)
