"""Keep secrets out of everything the relay writes: logs, last_error, summaries, error responses."""

from __future__ import annotations

import base64
import functools
import re
import string
from collections.abc import Iterable
from urllib.parse import unquote_plus, urlsplit

import yarl

from outbox.core.settings import Settings, WebhookEndpoint

# Connection-string keys whose values are credentials (Azure Storage, and the like).
_CREDENTIAL_PAIR = re.compile(r"(?i)\b(AccountKey|SharedAccessSignature|sig|password|pwd)=[^;&\s]+")
# user:password@ in any URL.
_URL_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")
# Characters that no JSON, URL or HTML encoder escapes.
_NEVER_ESCAPED = frozenset(string.ascii_letters + string.digits)
# The longest run of them in a secret: a text without it holds the secret in no form.
_ANCHOR = re.compile(r"[A-Za-z0-9]+")
# Escapes of a character besides \uXXXX, %XX and &#NN; (JSON's, HTML's named ones, a form's).
_SHORT_ESCAPES = {
    '"': ('\\"', "&quot;"),
    "\\": ("\\\\",),
    "/": ("\\/",),  # PHP's json_encode, by default
    "&": ("&amp;",),
    "<": ("&lt;",),
    ">": ("&gt;",),
    "'": ("&apos;",),
    " ": ("+",),
    "\b": ("\\b",),
    "\f": ("\\f",),
    "\n": ("\\n",),
    "\r": ("\\r",),
    "\t": ("\\t",),
}


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
    and as the HTTP client sends them: ``Authorization: Basic <base64 of user:pass>``, or of
    ``user:`` when there is no password. Without a password the user name is the credential;
    only a token-like one is hidden ("https://tok3n-abc@host/"), as "admin@" lets no one in."""
    try:
        parsed = yarl.URL(url)
    except (TypeError, ValueError):
        return []
    user, password = parsed.user or "", parsed.password
    forms = [user] if _token_like(user) else []
    if password is None and not forms:
        return []
    if password is not None:
        forms += [password, parsed.raw_password or password]
    for encoding in ("utf-8", "latin-1"):  # aiohttp encodes as latin-1 by default
        try:
            pair = f"{user}:{password or ''}".encode(encoding)
        except UnicodeEncodeError:
            continue
        forms += _base64_forms(pair)
    return forms


def _header_forms(value: str) -> list[str]:
    """A header's value; each long word of it ("Bearer <token>": the token alone); and for
    ``Basic <base64>``, the ``user:password`` it carries, decoded as receivers print it."""
    words = value.split()
    forms = [value, *(word for word in words if len(word) >= 8)]
    if len(words) == 2 and words[0].lower() == "basic":
        try:
            pair = base64.b64decode(words[1], validate=True).decode()
        except ValueError:  # not base64 of UTF-8 text: nothing more to hide
            return forms
        user, _, password = pair.partition(":")
        forms += [pair, password, *([user] if _token_like(user) else [])]
    return forms


def _endpoint_forms(endpoint: WebhookEndpoint) -> list[str]:
    """Everything of ``endpoint`` to hide: its URL, the parts of it that errors and receivers
    quote, the credentials in it, its headers' values (in base64 too: a receiver may print a
    header as it decodes or encodes it) and its secret."""
    headers = [
        form
        for value in endpoint.headers.values()
        for form in _header_forms(value.get_secret_value())
    ]
    encoded = [
        form
        for text in headers
        if _worth_encoding(text)
        for form in _base64_forms(text.encode(errors="surrogatepass"))
    ]
    # Webhook URLs are often capabilities themselves (a token in the path or query), and a
    # library may print them as the HTTP client normalised them ("%2F" as "/").
    forms = [*headers, *encoded, *_url_forms(endpoint.url), *_credential_forms(endpoint.url)]
    if endpoint.secret is not None:
        value = endpoint.secret.get_secret_value()
        forms += [value, *value.split(), *(part.removeprefix("whsec_") for part in value.split())]
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


def shown_host(url: str) -> str:
    """The host of an endpoint's URL as the console may show it: never its path, query or user,
    and a first label that looks like a capability (``_host_token``) replaced by ``[redacted]``."""
    host = urlsplit(url).hostname or ""
    token = _host_token(url)
    return host.replace(token, "[redacted]", 1) if token else host


def _token_like(text: str) -> bool:
    """Long, or with a digit among letters: worth hiding wherever it appears (a plain word like
    "orders" or "v1" is not, or ordinary error text would be redacted too)."""
    return len(text) >= 16 or (
        len(text) >= 8 and any(c.isdigit() for c in text) and any(c.isalpha() for c in text)
    )


def _worth_encoding(text: str) -> bool:
    """Whether a secret is hidden in its encoded forms too (base64, JSON, percent, HTML), not
    only as written: token-like, and mixing two of lower case, upper case and digits. Encoded, a
    short or common value would match ordinary text: "gold" is "Z29sZA" in base64, which any
    base64 text may hold, and "application/json" is "application\\/json" in every request PHP
    echoes, whether or not an endpoint's header sends it."""
    kinds = (str.islower, str.isupper, str.isdigit)
    return _token_like(text) and sum(any(kind(c) for c in text) for kind in kinds) >= 2


def _base64_forms(data: bytes) -> list[str]:
    """``data`` in base64 as encoders write it: both alphabets, with and without padding."""
    forms = [base64.b64encode(data).decode(), base64.urlsafe_b64encode(data).decode()]
    return forms + [form.rstrip("=") for form in forms]


def _anchor(form: str) -> str | None:
    """The longest run of never-escaped characters in ``form``, if it is worth encoding."""
    return max(_ANCHOR.findall(form), key=len) if _worth_encoding(form) else None


@functools.cache  # compiled when first needed, once per process (the relay has two redactors)
def _escaped(form: str) -> re.Pattern[str]:
    """A pattern for ``form`` as written and with any of its characters escaped."""
    return re.compile("".join(map(_char_pattern, form)))


def _char_pattern(char: str) -> str:
    """A pattern for ``char`` as written or escaped: in JSON (``\\/``, ``\\u00e9``, a surrogate
    pair), percent-encoded as UTF-8 (``%2F``, ``+`` for a space) or in HTML (``&#47;``,
    ``&#x2F;``, ``&amp;``); hexadecimal digits in either case."""
    if char in _NEVER_ESCAPED:
        return char
    utf16 = char.encode("utf-16-be", errors="surrogatepass").hex()
    in_hex = [
        "".join(f"\\u{utf16[i : i + 4]}" for i in range(0, len(utf16), 4)),
        "".join(f"%{byte:02x}" for byte in char.encode(errors="surrogatepass")),
        f"&#x{ord(char):x};",
    ]
    exact = [char, f"&#{ord(char)};", *_SHORT_ESCAPES.get(char, ())]
    alternatives = [*map(re.escape, exact), f"(?i:{'|'.join(map(re.escape, in_hex))})"]
    return f"(?:{'|'.join(alternatives)})"


class Redactor:
    """Replaces every configured secret (and anything shaped like a credential) in a text."""

    def __init__(self, secrets: Iterable[str], host_tokens: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        forms = sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True)
        # With an anchor (its longest run of characters never escaped), a secret is looked for
        # in every encoded form, but only in the texts that hold its anchor: most hold none.
        self._secrets = [(form, _anchor(form)) for form in forms]
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
        secrets.extend(key.get_secret_value() for key in settings.all_keys().values())
        for endpoint in (e for group in settings.endpoints.values() for e in group):
            secrets.extend(_endpoint_forms(endpoint))
            host_tokens.extend(filter(None, [_host_token(endpoint.url)]))
        return cls(secrets, host_tokens)

    def __call__(self, text: str) -> str:
        for form, anchor in self._secrets:
            if anchor is None:
                text = text.replace(form, "[redacted]")
            elif anchor in text:
                text = _escaped(form).sub("[redacted]", text)
        if self._host_tokens is not None:
            text = self._host_tokens.sub("[redacted]", text)
        text = _CREDENTIAL_PAIR.sub(lambda m: f"{m.group(1)}=[redacted]", text)
        return _URL_PASSWORD.sub(r"\1:[redacted]@", text)
