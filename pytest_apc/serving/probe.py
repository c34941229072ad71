"""Is a server run elsewhere there at all? Short probes of a URL, before anything waits for it.

A launched server refuses connections while it loads its model, so its readiness waits up to
``--apc-set startup_timeout``. A server run elsewhere (``--apc-url-on/off``, ``--apc-fleet-url``, each
``--apc-metrics-url``) is up before pytest starts: whatever it answers now, it answers for good. It gets
``GRACE_S`` for answers that a restarting server gives (connection refused, a timeout, HTTP 5xx); an answer
that waiting cannot change (a host name that does not resolve, TLS that fails, HTTP 401, 404) fails at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import requests

# Seconds one GET may take (connect and read), and how long a server run elsewhere may keep giving answers
# that a restart gives before it fails.
TIMEOUT_S = 5.0
GRACE_S = 10.0
# What each kind of external URL must answer with 2xx: a vLLM server's own endpoints; a gateway's model list.
SERVER_PATHS = ("/health", "/v1/models", "/metrics")


@dataclass(frozen=True)
class Answer:
    """What one GET answered, in words; ``lasting`` when waiting would not change it."""

    text: str
    lasting: bool


def get(http: requests.Session, url: str, timeout: float = TIMEOUT_S) -> requests.Response | Answer:
    """The response to ``GET url``, or why there is none (in words)."""
    try:
        return http.get(url, timeout=timeout)
    except requests.exceptions.SSLError as err:
        return Answer(f"TLS failed ({_reason(err)}); a private CA needs --apc-set ca_bundle", True)
    except requests.Timeout:
        return Answer(f"no answer within {timeout:g} s", False)
    except requests.ConnectionError as err:
        reason = _reason(err)
        if "NameResolutionError" in repr(err) or "resolve" in reason.lower():
            return Answer(f"its host name does not resolve ({reason})", True)
        if "refused" in reason.lower():
            return Answer("connection refused (nothing listens there)", False)
        return Answer(f"connection failed ({reason})", False)
    except requests.RequestException as err:
        return Answer(f"request failed ({_reason(err)})", True)


def status_answer(response: requests.Response, key_hint: str) -> Answer | None:
    """None for a 2xx; else what the status means."""
    code = response.status_code
    if 200 <= code < 300:
        return None
    text = f"HTTP {code} {response.text.strip()[:120]!r}".replace(" ''", "")
    if code in (401, 403):
        return Answer(f"{text}: it wants another API key ({key_hint})", True)
    if code == 404:
        return Answer(f"{text}: no such endpoint there (another port, a sidecar, a path prefix?)", True)
    return Answer(text, code < 500)


def check(
    http: requests.Session,
    base: str,
    paths: Sequence[str],
    *,
    key_hint: str,
    grace_s: float = GRACE_S,
    cancelled: Callable[[], bool] = lambda: False,
) -> str:
    """ "" when every ``GET base+path`` answers 2xx within the grace; else the last failure, naming the URL."""
    deadline = time.monotonic() + grace_s
    while True:
        failure = _first_failure(http, base, paths, key_hint)
        if failure is None:
            return ""
        url, answer = failure
        if answer.lasting or cancelled():
            return f"GET {url}: {answer.text}"
        if time.monotonic() > deadline:
            return f"GET {url}: {answer.text} (for {grace_s:g} s; a server run elsewhere must be up already)"
        time.sleep(1.0)


def _first_failure(http: requests.Session, base: str, paths: Sequence[str], key_hint: str) -> tuple[str, Answer] | None:
    for path in paths:
        url = base + path
        got = get(http, url)
        answer = got if isinstance(got, Answer) else status_answer(got, key_hint)
        if answer is not None:
            return url, answer
    return None


def _reason(err: BaseException) -> str:
    """The innermost cause of a requests error, short: urllib3 wraps it twice."""
    inner: BaseException = err
    while inner.args and isinstance(inner.args[0], BaseException):
        inner = inner.args[0]
    reason = getattr(inner, "reason", None)
    text = str(reason if reason is not None else inner)
    # urllib3 names the connection first ("HTTPConnection(host=..., port=...): Failed to resolve ...").
    return text.split(": ", 1)[-1][:200] if text.startswith(("HTTP", "<urllib3")) else text[:200]
