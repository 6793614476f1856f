"""Keep secrets out of everything the relay writes: logs, last_error, summaries, error responses."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from urllib.parse import unquote_plus, urlsplit

import yarl

from outbox.core.settings import Settings

# Connection-string keys whose values are credentials (Azure Storage, and the like).
_CREDENTIAL_PAIR = re.compile(r"(?i)\b(AccountKey|SharedAccessSignature|sig|password|pwd)=[^;&\s]+")
# user:password@ in any URL.
_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")


def _url_forms(url: str) -> list[str]:
    """``url`` and the parts of it a receiver or a library may echo: its path with query, the
    path alone, and each token-like path segment or query value, raw and decoded; as written and
    as the HTTP client normalises them."""
    forms = [url]
    parts = urlsplit(url)
    if parts.path.strip("/") or parts.query:
        forms.append(parts.path + ("?" + parts.query if parts.query else ""))
    if parts.path.strip("/"):
        forms.append(parts.path)
    pieces = parts.path.split("/") + [
        value for pair in parts.query.split("&") for value in pair.split("=")[1:]
    ]
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


def _credential_forms(url: str) -> list[str]:
    """The user name and password of a URL (``http://user:pass@host/``), as written, decoded,
    and as the HTTP client sends them: ``Authorization: Basic <base64 of user:pass>``."""
    try:
        parsed = yarl.URL(url)
    except (TypeError, ValueError):
        return []
    if parsed.password is None:
        return []
    user, password = parsed.user or "", parsed.password
    forms = [password, parsed.raw_password or password]
    for encoding in ("utf-8", "latin-1"):  # aiohttp encodes as latin-1 by default
        try:
            pair = f"{user}:{password}".encode(encoding)
        except UnicodeEncodeError:
            continue
        forms.append(base64.b64encode(pair).decode())
    return forms


def _host_token(url: str) -> str | None:
    """The host's first label, if it looks like a capability ("https://eo5f1c2a9b8d7e6.m.pipedream
    .net"): connection and DNS errors quote the host. Only the first of three or more labels (the
    rest name the service, like "lambda-url.us-east-1.on.aws"), never an IP address, and only if
    it is long and mixes digits and letters (not a name like "hooks01" or "service1")."""
    host = urlsplit(url).hostname or ""
    labels = host.split(".")
    if len(labels) < 3 or ":" in host or all(label.isdigit() for label in labels):
        return None
    first = labels[0]
    random_looking = len(first) >= 12 and any(c.isdigit() for c in first)
    return first if random_looking and any(c.isalpha() for c in first) else None


def _token_like(text: str) -> bool:
    """Long, or with a digit among letters: worth hiding wherever it appears (a plain word like
    "orders" or "v1" is not, or ordinary error text would be redacted too)."""
    return len(text) >= 16 or (
        len(text) >= 8 and any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    )


class Redactor:
    """Replaces every configured secret (and anything shaped like a credential) in a text."""

    def __init__(self, secrets: Iterable[str], host_tokens: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self._secrets = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)
        # Host labels: replaced only as whole labels, so other words that contain one stay.
        tokens = "|".join(re.escape(t) for t in sorted(set(host_tokens), key=len, reverse=True))
        self._host_tokens = (
            re.compile(rf"(?i)(?<![a-z0-9-])(?:{tokens})(?![a-z0-9-])") if tokens else None
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        secrets: list[str] = [settings.database_url.get_secret_value()]
        host_tokens: list[str] = []
        password = urlsplit(settings.database_url.get_secret_value()).password
        if password:
            secrets.append(password)
        if settings.queue_connection is not None:
            secrets.append(settings.queue_connection.get_secret_value())
        if settings.function_key is not None:
            secrets.append(settings.function_key.get_secret_value())
        for endpoint in (e for group in settings.endpoints.values() for e in group):
            for header in endpoint.headers.values():
                value = header.get_secret_value()  # "Bearer <token>": the token alone too
                secrets.extend([value, *(part for part in value.split() if len(part) >= 8)])
            # Webhook URLs are often capabilities themselves (a token in the path or query), and
            # a library may print them as the HTTP client normalised them ("%2F" as "/").
            secrets.extend(_url_forms(endpoint.url))
            secrets.extend(_credential_forms(endpoint.url))
            host_tokens.extend(filter(None, [_host_token(endpoint.url)]))
            if endpoint.secret is not None:
                value = endpoint.secret.get_secret_value()
                secrets.extend([value, *value.split()])
                secrets.extend(part.removeprefix("whsec_") for part in value.split())
        return cls(secrets, host_tokens)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, "[redacted]")
        if self._host_tokens is not None:
            text = self._host_tokens.sub("[redacted]", text)
        text = _CREDENTIAL_PAIR.sub(lambda m: f"{m.group(1)}=[redacted]", text)
        return _URL_PASSWORD.sub(r"\1:[redacted]@", text)
